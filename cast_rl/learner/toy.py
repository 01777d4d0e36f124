"""A learnable toy task and a transformers sampler: shows that the learner learns.

:class:`FirstTokenTask` rewards 1 when the first generated token of the answer is in a target
set, 0 otherwise.  A single target token would start at reward ~1/V with a random tiny model and
GRPO would see almost no successes to learn from; a set holding every ``modulus``-th token id
(ordinary tokens only) starts near 1/modulus, and the policy must move nearly all its first-token
mass into the set to reach a mean reward of 0.9.

:class:`HFCollector` plays the rollout group's part (``collect(units)``, ``update_weights(version,
weights, checksum)``) with a plain transformers model sampling from the latest published weights.
Sampling is seeded by the policy version and the units, so a run and its resumed copy draw the
same tokens.  It runs in-process, or as a Ray actor via ``ray.remote(HFCollector)``.
"""

from __future__ import annotations

import logging
import threading
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from cast_rl.inference.weight_sync import WeightSyncError, state_checksum
from cast_rl.records import Trajectory
from cast_rl.rollout.collector import Tree, Unit

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class FirstTokenTask:
    """Reward 1 when the first generated token id is in the target set."""

    vocab_size: int
    special_ids: tuple[int, ...] = ()
    modulus: int = 8
    num_tasks: int = 16

    @property
    def target_ids(self) -> frozenset[int]:
        return frozenset(i for i in range(0, self.vocab_size, self.modulus) if i not in self.special_ids)

    def messages(self, task_index: int) -> list[dict[str, Any]]:
        return [
            {"role": "system", "content": "You are a helpful customer service agent."},
            {"role": "user", "content": f"Task {task_index}: please find the order details."},
        ]

    def reward(self, generated: Sequence[int]) -> float:
        return 1.0 if generated and generated[0] in self.target_ids else 0.0

    @classmethod
    def for_tokenizer(cls, tokenizer: Any, modulus: int = 8, num_tasks: int = 16) -> FirstTokenTask:
        return cls(len(tokenizer), tuple(tokenizer.all_special_ids), modulus, num_tasks)


class HFCollector:
    """A transformers sampler behind the rollout group's interface (see the module doc)."""

    def __init__(self, model_path: str, task: FirstTokenTask | None = None, max_new_tokens: int = 3,
                 seed: int = 0, domain: str = "toy") -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
        self.task = task or FirstTokenTask.for_tokenizer(self.tokenizer)
        self.max_new_tokens = max_new_tokens
        self.seed = seed
        self.domain = domain
        self.version = 0
        self._lock = threading.Lock()  # weights never change in the middle of a generation
        self.stop_ids = {self.tokenizer.eos_token_id, self.tokenizer.pad_token_id}

    def update_weights(self, version: int, weights: Any, checksum: str) -> int:
        """Load published weights after checking version and checksum; loud on any mismatch."""
        if not isinstance(weights, dict):
            raise TypeError(
                f"HFCollector.update_weights got a {type(weights).__name__}, not a state dict: a Ray "
                "learner group publishes an object reference, which Ray resolves only for a collector "
                "running as an actor (launchers.train.HFCollectorClient)"
            )
        if version <= self.version:
            raise WeightSyncError(f"weights version {version} is not newer than {self.version}")
        got = state_checksum(weights)
        if got != checksum:
            raise WeightSyncError(f"checksum mismatch for version {version}: {got[:12]} != {checksum[:12]}")
        with self._lock:
            missing, unexpected = self.model.load_state_dict(weights, strict=False)
            if missing or unexpected:
                raise WeightSyncError(f"weights do not fit the model: missing {missing}, unexpected {unexpected}")
            self.version = version
        return version

    def _prompt_ids(self, task_index: int) -> list[int]:
        text = self.tokenizer.apply_chat_template(
            self.task.messages(task_index), tokenize=False, add_generation_prompt=True
        )
        return self.tokenizer(text, add_special_tokens=False).input_ids

    @torch.no_grad()
    def collect(self, units: list[Unit], tree: Tree | None = None) -> list[Trajectory]:
        """One trajectory per (split, task_index, trial) unit, in order."""
        if tree is not None:
            raise ValueError("the toy task has one turn and no environment to fork: step_groups needs "
                             "a rollout group (--collector env)")
        with self._lock:
            version = self.version
            gen = torch.Generator().manual_seed(zlib.crc32(repr((self.seed, version, units)).encode()))
            prompts = [self._prompt_ids(t) for _, t, _ in units]
            out_ids, out_lp = self._sample(prompts, gen)
        trajs = []
        for (split, task, trial), p, ids, lps in zip(units, prompts, out_ids, out_lp):
            messages = self.task.messages(task) + [
                {"role": "assistant", "content": self.tokenizer.decode(ids, skip_special_tokens=True)}
            ]
            trajs.append(Trajectory(
                domain=self.domain, split=split, task_index=task, trial=trial,
                reward=self.task.reward(ids), policy_version=version, messages=messages,
                token_ids=p + ids, loss_mask=[0] * len(p) + [1] * len(ids),
                logprobs=[0.0] * len(p) + lps, info={"first_token": ids[0] if ids else -1},
            ))
        return trajs

    def _sample(self, prompts: list[list[int]], gen: torch.Generator) -> tuple[list[list[int]], list[list[float]]]:
        """Ancestral sampling at temperature 1, left-padded batch, no KV cache (tiny models)."""
        pad = self.tokenizer.pad_token_id
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
        attn = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        done = torch.zeros(len(prompts), dtype=torch.bool)
        gen_ids: list[list[int]] = [[] for _ in prompts]
        gen_lp: list[list[float]] = [[] for _ in prompts]
        for _ in range(self.max_new_tokens):
            pos = (attn.cumsum(-1) - 1).clamp(min=0)
            logits = self.model(input_ids=ids, attention_mask=attn, position_ids=pos).logits[:, -1].float()
            logp = torch.log_softmax(logits, dim=-1)
            tok = torch.multinomial(logp.exp(), 1, generator=gen).squeeze(-1)
            for i in range(len(prompts)):
                if not done[i]:
                    gen_ids[i].append(int(tok[i]))
                    gen_lp[i].append(float(logp[i, tok[i]]))
                    done[i] = int(tok[i]) in self.stop_ids
            if bool(done.all()):
                break
            ids = torch.cat([ids, tok[:, None]], dim=1)
            # finished rows keep generating into the void; their extra tokens are never recorded
            attn = torch.cat([attn, torch.ones_like(attn[:, :1])], dim=1)
        return gen_ids, gen_lp
