"""One FSDP2 learner rank: Hugging Face model, verl losses, one optimizer step per global batch.

The same code runs on CPUs (gloo) and GPUs (NCCL): ranks join one ``torch.distributed`` process
group (``MASTER_ADDR``/``MASTER_PORT`` from the environment, set by
:class:`actors.learner.LearnerGroup`; a single rank without them uses an in-process store), the
model is sharded with ``fully_shard`` per decoder layer and at the root, and with ``policy.dtype``
bfloat16 (or ``learner.mixed_precision=bf16``) a :class:`MixedPrecisionPolicy` computes in bf16
over fp32 master weights with fp32 gradient reductions, on GPUs and CPUs alike.

A step (:meth:`LearnerEngine.train_step`) takes this rank's share of a global batch:

1. micro-batches of similar length with dynamic padding; every rank runs the same number (a rank
   with less data runs an empty micro-batch) so FSDP's collectives stay in step;
2. global counts (loss tokens and sequences, policy and supervised apart) are all-reduced, and
   verl's aggregation divides each micro-batch by them, so the data-parallel gradient equals the
   single-process one;
3. forward (with ``learner.logits=loss_tokens`` the output layer runs only where a token carries
   loss: in a multi-turn conversation most positions are context, and their vocabulary-sized
   logits would cost more than the decoder layers of a small model), losses (verl policy loss,
   optional verl KL to a frozen reference, cross-entropy for supervised samples: with
   ``pipeline.critic_loss=two_term``, a critic sample's answer in two weighted token means, its
   verdict lines and the rest), backward with gradient sync only on the last micro-batch;
4. gradient clipping and one AdamW step; the policy version goes up by one, and the phase's
   learning-rate schedule (:meth:`LearnerEngine.set_schedule`) takes its step.

Embedding rows a model's ``config.json`` lists under ``frozen_token_ids`` (the identifier tokens
of the tiny offline policy, see :mod:`cast_rl.models.tiny`) are restored after every step, so
weight decay and updates never move them: a model trained from scratch can then only produce an
identifier by copying it from its context, and copying generalises to identifiers it never saw.

With ``learner.lora.rank`` set the model is wrapped with peft LoRA adapters before sharding
(:mod:`cast_rl.learner.lora`): only the adapters train (the optimizer holds them alone, the base,
embedding included, stays frozen, so no rows need restoring), the KL reference is the model with
its adapters disabled instead of a second copy, and the weights published and saved are the
merged ones under the Hugging Face names.

With ``algorithm.old_logprobs=recompute`` the behaviour logprobs are this step's own forward
pass, detached: there is one optimizer step per batch, so the pre-update forward verl would run
gives exactly these values (the PPO ratio starts at 1) and a second pass is saved.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from cast_rl.config.schema import CastConfig, ScheduleConfig
from cast_rl.inference.adapters import AdapterUpdate
from cast_rl.learner import checkpoint, lora
from cast_rl.learner.batch import MicroBatch, collate, dummy_micro_batch, split_micro_batches
from cast_rl.learner.losses import (
    GlobalBatchInfo,
    critic_terms,
    kl_loss,
    policy_loss,
    supervised_loss,
    token_logprobs,
    verl_actor_config,
)
from cast_rl.learner.sample import Sample
from cast_rl.learner.schedule import PhaseSchedule

logger = logging.getLogger(__name__)


def init_distributed(rank: int, world_size: int, backend: str) -> None:
    """Join the default process group (once per process)."""
    if dist.is_initialized():
        if dist.get_world_size() != world_size:
            raise RuntimeError(f"process group has {dist.get_world_size()} ranks, wanted {world_size}")
        return
    if world_size == 1 and "MASTER_PORT" not in os.environ:
        dist.init_process_group(backend, rank=0, world_size=1, store=dist.HashStore())
    else:
        dist.init_process_group(backend, rank=rank, world_size=world_size)


def compute_dtype(cfg: CastConfig) -> torch.dtype:
    """The dtype forward and backward run in: ``policy.dtype`` (bfloat16/float16), or bfloat16
    when ``learner.mixed_precision=bf16``.  Master weights, optimizer state and gradient
    reductions stay in float32 either way (FSDP2 :class:`MixedPrecisionPolicy`)."""
    if cfg.policy.dtype != "float32":
        return getattr(torch, cfg.policy.dtype)
    return torch.bfloat16 if cfg.learner.mixed_precision == "bf16" else torch.float32


def pick_device(cfg: CastConfig) -> torch.device:
    if cfg.learner.num_gpus_per_worker > 0 and torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", torch.cuda.current_device())))
    return torch.device("cpu")


class LearnerEngine:
    """One data-parallel rank of the learner (see the module doc)."""

    def __init__(self, cfg: CastConfig, rank: int = 0, world_size: int = 1, model_path: str | None = None) -> None:
        from transformers import AutoTokenizer

        self.cfg = cfg
        self.rank, self.world_size = rank, world_size
        self.device = pick_device(cfg)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        init_distributed(rank, world_size, "nccl" if self.device.type == "cuda" else "gloo")
        self.model_path = model_path or cfg.policy.path
        torch.manual_seed(cfg.learner.seed)
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.lora = cfg.learner.lora.enabled
        """LoRA adapters train over a frozen base (:mod:`cast_rl.learner.lora`)."""
        self.model = self._load(trainable=True)
        # with LoRA the reference is the same model with its adapters disabled
        self.ref_model = self._load(trainable=False) if cfg.algorithm.kl_coef > 0 and not self.lora else None
        self._lora_scalings = lora.scalings(self.model) if self.lora else {}
        self.optimizer = torch.optim.AdamW(
            [p for p in self.model.parameters() if p.requires_grad], lr=cfg.learner.lr,
            weight_decay=cfg.learner.weight_decay,
        )
        self._frozen = self._frozen_rows()
        self.policy_temperature = cfg.inference.temperature or 1.0
        """Policy samples are scored at the temperature they were sampled at (as verl's actor
        divides its logits by the rollout temperature), so the policy gradient and the PPO ratio
        are those of the distribution the rollout workers draw from; supervised samples at 1.
        Greedy rollouts (temperature 0) are scored at 1."""
        self.actor_config = verl_actor_config(cfg.algorithm)
        from verl.trainer.ppo.core_algos import get_policy_loss_fn

        get_policy_loss_fn(cfg.algorithm.policy_loss)  # an unknown name fails at start-up
        self.version = 0
        """Optimizer steps taken: the version of the weights this learner holds."""
        self.schedule: PhaseSchedule | None = None
        """The learning-rate schedule of the current phase (:meth:`set_schedule`); None: constant."""
        pipe = cfg.pipeline
        self.critic_weights = ((pipe.critic_verdict_weight, pipe.critic_explanation_weight)
                               if pipe.critic_loss == "two_term" else None)
        """(verdict, explanation) weights of the two-term loss of samples that mark a critic's
        verdict (``pipeline.critic_loss=two_term``); None: one cross-entropy over every answer."""

    def set_lr(self, lr: float) -> None:
        """The learning rate of every later step (the pipeline's GRPO phase after its fine-tuning,
        ``pipeline.grpo_lr``), ending any schedule; AdamW's moments carry over."""
        self.schedule = None
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def set_schedule(self, schedule: ScheduleConfig, lr: float, total_steps: int) -> None:
        """A phase of ``total_steps`` steps whose learning rate follows ``schedule`` up to ``lr``
        (:mod:`cast_rl.learner.schedule`); AdamW's moments carry over."""
        self.schedule = PhaseSchedule.build(self.optimizer, schedule, lr, total_steps)

    def _load(self, trainable: bool) -> Any:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=torch.float32)
        model.config.use_cache = False
        model.to(self.device)  # type: ignore[arg-type]
        if trainable and self.cfg.learner.activation_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if trainable and self.lora:
            model = self._wrap_lora(model)
        mesh = init_device_mesh(self.device.type, (self.world_size,))
        kwargs: dict[str, Any] = {"mesh": mesh}
        root = dict(kwargs)
        dtype = compute_dtype(self.cfg)
        if dtype != torch.float32:
            kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
            # logits come out in float32: the log-softmax of the losses is not done in bf16
            root["mp_policy"] = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32,
                                                     output_dtype=torch.float32)
        block_names = set(getattr(model, "_no_split_modules", None) or [])
        for module in model.modules():
            if type(module).__name__ in block_names:
                fully_shard(module, **kwargs)
        fully_shard(model, **root)
        if not trainable:
            model.eval()
            model.requires_grad_(False)
        return model

    def _wrap_lora(self, model: Any) -> Any:
        """``model`` with peft LoRA adapters (before sharding: FSDP2 then shards base and adapters
        alike, and only the adapters get gradients)."""
        wrapped = lora.wrap(model, self.cfg.learner.lora)
        embeddings = {id(model.get_input_embeddings()), id(model.get_output_embeddings())}
        scale = lora.scalings(wrapped)
        adapted = [name for name, m in wrapped.named_modules() if name in scale and id(m.get_base_layer()) in embeddings]
        trainable = [n for n, p in wrapped.named_parameters() if p.requires_grad]
        if adapted or not trainable or not all(lora.is_adapter(n) for n in trainable):
            raise ValueError(
                f"learner.lora.target_modules={list(self.cfg.learner.lora.target_modules)} is not allowed for "
                f"{self.model_path}: it must name linear layers inside the decoder blocks (adapted embeddings: "
                f"{adapted}; trainable parameters: {len(trainable)}, non-LoRA among them: "
                f"{[n for n in trainable if not lora.is_adapter(n)][:3]})")
        n_train = sum(p.numel() for p in wrapped.parameters() if p.requires_grad)
        n_all = sum(p.numel() for p in wrapped.parameters())
        logger.info("LoRA rank %d on %s: %d of %d parameters train (%.3f%%)", self.cfg.learner.lora.rank,
                    ",".join(self.cfg.learner.lora.target_modules), n_train, n_all, 100 * n_train / n_all)
        return wrapped

    # ------------------------------------------------------------------ training

    def _forward_logprobs(self, model: torch.nn.Module, mb: MicroBatch,
                          where: torch.Tensor | None = None) -> torch.Tensor:
        """(B, L-1) log p(target) per position, policy rows at :attr:`policy_temperature`.  With
        ``where`` ((B, L-1) bool), the output layer runs only on the hidden states of those
        positions and every other entry is 0.

        The selection is a forward pre-hook on the output embedding, so the model's own forward
        (and FSDP's unsharding around it) runs unchanged; only the input of ``lm_head`` shrinks
        from (B, L, H) to (N, H).
        """
        # 1 / temperature per row: policy samples at the sampling temperature, supervised at 1
        inv = torch.where(mb.is_policy, 1.0 / self.policy_temperature, 1.0).to(self.device)
        if where is None:
            logits = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask).logits
            return token_logprobs(logits[:, :-1] * inv[:, None, None], mb.targets)
        head = model.get_output_embeddings()  # type: ignore[operator]

        def select(_module: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
            return (args[0][:, :-1][where], *args[1:])

        handle = head.register_forward_pre_hook(select)
        try:
            logits = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask).logits
        finally:
            handle.remove()
        picked = token_logprobs(logits * inv[where.nonzero(as_tuple=True)[0], None], mb.targets[where])
        return torch.zeros(where.shape, dtype=picked.dtype, device=picked.device).masked_scatter(where, picked)

    @torch.no_grad()
    def _reference_logprobs(self, mb: MicroBatch, where: torch.Tensor | None) -> torch.Tensor:
        """The KL reference's log-probs: the frozen copy, or with LoRA the model itself with its
        adapters disabled (the base weights never change)."""
        if self.ref_model is not None:
            return self._forward_logprobs(self.ref_model, mb, where)
        with self.model.disable_adapter():
            return self._forward_logprobs(self.model, mb, where)

    def _global_info(self, batches: list[MicroBatch], real_tokens: int) -> tuple[GlobalBatchInfo, int]:
        counts = torch.tensor([0, 0, 0, 0, 0, 0, real_tokens], dtype=torch.float64)
        for mb in batches:
            pm, sm = mb.policy_mask, mb.supervised_mask
            counts[:6] += torch.tensor([pm.sum(), (pm.sum(-1) > 0).sum(), sm.sum(), (sm.sum(-1) > 0).sum(),
                                        mb.verdict_mask.sum(), mb.explanation_mask.sum()], dtype=torch.float64)
        dist.all_reduce(counts)
        c = [int(x) for x in counts.tolist()]
        return GlobalBatchInfo(self.world_size, c[0], c[1], c[2], c[3], c[4], c[5]), c[6]

    def _micro_batches(self, samples: list[Sample]) -> list[MicroBatch]:
        lc = self.cfg.learner
        groups = split_micro_batches(samples, lc.micro_batch_size, lc.max_tokens_per_micro_batch)
        n = torch.tensor([len(groups)])
        dist.all_reduce(n, op=dist.ReduceOp.MAX)
        batches = [collate(g, self.pad_id) for g in groups]
        batches += [dummy_micro_batch(self.pad_id) for _ in range(int(n) - len(groups))]
        return [b.to(self.device) for b in batches]

    def train_step(self, samples: list[Sample]) -> dict[str, float]:
        """One optimizer step on this rank's share of a global batch; metrics are global."""
        t0 = time.perf_counter()
        algo = self.cfg.algorithm
        self.model.train()
        batches = self._micro_batches(samples)
        info, real_tokens = self._global_info(batches, sum(len(s.token_ids) for s in samples))
        if info.policy_tokens + info.supervised_tokens == 0:
            raise ValueError("train_step got a global batch without a single loss token")
        marked = info.verdict_tokens + info.explanation_tokens
        if self.critic_weights is not None and marked and marked != info.supervised_tokens:
            raise ValueError(f"train_step got {info.supervised_tokens - marked} supervised tokens of samples that mark no "
                             f"critic verdict beside {marked} that do; with pipeline.critic_loss=two_term a batch holds "
                             "critic samples only or none")
        # sums over micro-batches: losses (already normalised globally), token-weighted verl metrics
        acc = {"pg_loss": 0.0, "kl": 0.0, "supervised_loss": 0.0, "policy_tokens": 0.0, "verdict_loss": 0.0,
               "explanation_loss": 0.0}
        weighted: dict[str, float] = {}
        for i, mb in enumerate(batches):
            self.model.set_requires_gradient_sync(i == len(batches) - 1)
            # every loss below reads logp only where loss_mask is set (policy and supervised)
            where = mb.loss_mask > 0 if self.cfg.learner.logits == "loss_tokens" else None
            logp = self._forward_logprobs(self.model, mb, where)
            loss = logp.sum() * 0.0  # keeps every rank's graph connected, even on empty micro-batches
            pmask = mb.policy_mask
            if info.policy_tokens:
                old = logp.detach() * pmask if algo.old_logprobs == "recompute" else mb.old_logprobs
                pg, metrics = policy_loss(logp, old, mb.advantages, pmask, self.actor_config, info)
                loss = loss + pg
                acc["pg_loss"] += float(pg.detach())
                ntok = float(pmask.sum())
                acc["policy_tokens"] += ntok
                for k, v in metrics.items():
                    weighted[k] = weighted.get(k, 0.0) + v * ntok
                if algo.kl_coef > 0:
                    ref = self._reference_logprobs(mb, where)
                    kl = kl_loss(logp, ref, pmask, algo.kl_penalty, algo.loss_agg_mode, info)
                    loss = loss + algo.kl_coef * kl
                    acc["kl"] += float(kl.detach())
            if info.supervised_tokens:
                sft, terms = self._supervised_loss(logp, mb, info)
                loss = loss + algo.supervised_weight * sft
                acc["supervised_loss"] += float(sft.detach())
                if terms is not None:
                    acc["verdict_loss"] += float(terms[0].detach())
                    acc["explanation_loss"] += float(terms[1].detach())
            loss.backward()
        lr = float(self.optimizer.param_groups[0]["lr"])
        grad_norm = self._clip_and_step()
        self.version += 1
        keys = sorted(weighted)
        totals = torch.tensor([acc[k] for k in ("pg_loss", "kl", "supervised_loss", "policy_tokens", "verdict_loss",
                                                "explanation_loss")]
                              + [weighted[k] for k in keys], dtype=torch.float64)
        dist.all_reduce(totals)
        t = totals.tolist()
        # each rank's partial losses were scaled by dp_size (verl's convention): undo for the mean
        out = {
            "pg_loss": t[0] / self.world_size,
            "kl": t[1] / self.world_size,
            "supervised_loss": t[2] / self.world_size,
            "grad_norm": grad_norm,
            "policy_tokens": float(info.policy_tokens),
            "supervised_tokens": float(info.supervised_tokens),
            "tokens": float(real_tokens),
            "learner_step_s": time.perf_counter() - t0,
            "policy_version": float(self.version),
            "lr": lr,
        }
        if marked:  # the critic's answer in two parts (what two_term weighs; single reports them too)
            out["verdict_loss"], out["explanation_loss"] = t[4] / self.world_size, t[5] / self.world_size
        out["loss"] = out["pg_loss"] + algo.kl_coef * out["kl"] + algo.supervised_weight * out["supervised_loss"]
        for k, v in zip(keys, t[6:]):
            out[k] = v / t[3] if t[3] else 0.0
        out["tokens_per_s"] = real_tokens / out["learner_step_s"]
        return out

    def _supervised_loss(self, logp: torch.Tensor, mb: MicroBatch,
                         info: GlobalBatchInfo) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
        """A micro-batch's supervised loss, and the (verdict, explanation) cross-entropies when the
        global batch has critic samples: the loss itself with ``pipeline.critic_loss=two_term``
        (weighted), else reported beside the one token mean over every supervised token."""
        if not info.verdict_tokens + info.explanation_tokens:
            return supervised_loss(logp, mb.supervised_mask, info), None
        terms = critic_terms(logp, mb.verdict_mask, mb.explanation_mask, info)
        if self.critic_weights is None:
            return supervised_loss(logp, mb.supervised_mask, info), terms
        return self.critic_weights[0] * terms[0] + self.critic_weights[1] * terms[1], terms

    def _clip_and_step(self) -> float:
        params = [p for p in self.model.parameters() if p.grad is not None]
        clip = float("inf") if self.cfg.learner.grad_clip is None else self.cfg.learner.grad_clip
        norm = torch.nn.utils.clip_grad_norm_(params, clip)
        if hasattr(norm, "full_tensor"):
            norm = norm.full_tensor()
        norm_value = float(norm)
        if not torch.isfinite(norm):
            raise FloatingPointError(f"gradient norm is {norm_value} at step {self.version + 1}")
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.schedule is not None:
            self.schedule.step()
        if self._frozen is not None:
            local, rows, values = self._frozen
            with torch.no_grad():
                local.index_copy_(0, rows, values)
        return norm_value

    def _frozen_rows(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """(this rank's shard of the input embedding, its frozen row indices, their values).

        FSDP2 shards the embedding on dim 0 in chunks of ceil(vocab / world_size) rows; a rank
        keeps the frozen rows that fall in its chunk.
        """
        ids = sorted(set(getattr(self.model.config, "frozen_token_ids", None) or ()))
        if not ids or self.lora:  # with LoRA the whole base, embedding included, is frozen
            return None
        weight = self.model.get_input_embeddings().weight
        local = weight.to_local() if hasattr(weight, "to_local") else weight
        vocab = weight.shape[0]
        if ids[0] < 0 or ids[-1] >= vocab:
            raise ValueError(f"{self.model_path}: config.json frozen_token_ids holds ids outside the vocabulary "
                             f"(0..{vocab - 1})")
        start = self.rank * -(-vocab // self.world_size)
        rows = torch.tensor([i - start for i in ids if start <= i < start + local.shape[0]], dtype=torch.long,
                            device=local.device)
        logger.info("rank %d: %d of %d frozen embedding rows are on this shard", self.rank, len(rows), len(ids))
        return local.data, rows, local.data.index_select(0, rows).clone()

    @torch.no_grad()
    def logprobs(self, samples: list[Sample]) -> list[list[float]]:
        """Per-token logprobs under the current weights, in each sample's own frame (entry t is
        log p(token t); entry 0 is 0.0), policy samples at :attr:`policy_temperature` as in
        training.  Collective when world_size > 1."""
        self.model.eval()
        out: list[list[float]] = []
        for s in samples:
            mb = collate([s], self.pad_id).to(self.device)
            lp = self._forward_logprobs(self.model, mb)[0].cpu().tolist()
            out.append([0.0] + lp[: len(s.token_ids) - 1])
        return out

    # ------------------------------------------------------------------ weights and checkpoints

    def full_state_dict(self) -> dict[str, Any]:
        """Collective: the full (unsharded) weights on rank 0, on the CPU; {} on other ranks.
        With LoRA: the merged weights under the Hugging Face names (see :mod:`cast_rl.learner.lora`)."""
        state = self._gathered_state()
        return dict(lora.merged(state.items(), self._lora_scalings)) if self.lora else state

    def _gathered_state(self) -> dict[str, Any]:
        """Collective: :meth:`full_state_dict` as the model holds it (with LoRA: peft's names, the
        adapters apart)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(
            self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
        )

    def iter_full_params(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Collective: (name, full parameter on this rank's device), one all-gather at a time, in
        ``named_parameters`` order (Hugging Face names), so a sender holds one parameter more at
        most (with LoRA: one adapted layer's base weight and adapters, yielded merged)."""
        gathered = self._gathered_params()
        return lora.merged(gathered, self._lora_scalings) if self.lora else gathered

    def _gathered_params(self, keep: Callable[[str], bool] | None = None) -> Iterator[tuple[str, torch.Tensor]]:
        """Collective: (name, full parameter) of the parameters whose name ``keep`` accepts (all
        by default), one all-gather at a time in ``named_parameters`` order."""
        for name, param in self.model.named_parameters():
            if keep is not None and not keep(name):
                continue
            if self.world_size == 1 and hasattr(param, "to_local"):
                full = param.to_local()  # one rank holds everything: no gather, no copy
            else:
                full = param.full_tensor() if hasattr(param, "full_tensor") else param
            yield name, full.detach()

    def param_shapes(self) -> dict[str, torch.Tensor]:
        """Name -> parameter (sharded; only its global shape and dtype are meant to be read), the
        names and order :meth:`iter_full_params` yields."""
        named = self.model.named_parameters()
        return dict(lora.base_params(named) if self.lora else named)

    def adapter_update(self, name: str = "policy") -> AdapterUpdate | None:
        """Collective (``learner.lora``): the adapter alone at this version, under peft's saved
        names with its adapter_config, checksummed, on rank 0; None on other ranks."""
        if not self.lora:
            raise ValueError("adapter_update needs learner.lora.rank: without LoRA there is no adapter to send")
        tensors = {lora.saved_name(n): t for n, t in self._gathered_params(keep=lora.is_adapter)}
        if self.rank != 0:
            return None
        return AdapterUpdate.build(name, self.version, tensors, lora.adapter_config(self.model))

    def save_hf(self, out_dir: str | Path) -> Path | None:
        """Collective: a Hugging Face model directory written by rank 0 (returned there).  With
        LoRA it holds the merged weights, and ``<out_dir>/adapter`` the adapter in peft's format
        (its base is the model this engine started from)."""
        state = self._gathered_state()
        out = None
        if self.rank == 0:
            out = Path(out_dir)
            if self.lora:
                self.model.save_pretrained(out / lora.ADAPTER_DIR, state_dict=lora.adapter_state(state))
                merged = dict(lora.merged(state.items(), self._lora_scalings))
                self.model.get_base_model().save_pretrained(out, state_dict=merged)
            else:
                self.model.save_pretrained(out, state_dict=state)
            self.tokenizer.save_pretrained(out)
        dist.barrier()
        return out

    def save_checkpoint(self, path: str | Path) -> None:
        """Collective: model and optimizer shards, RNG states and the learning-rate schedule
        (meta.json is the driver's)."""
        checkpoint.save_train_state(path, self.model, self.optimizer, self.rank)
        if self.rank == 0:
            checkpoint.save_schedule(path, self.schedule.state_dict() if self.schedule is not None else None)
        dist.barrier()

    def load_checkpoint(self, path: str | Path, version: int) -> None:
        """Collective: restore shards, RNG and the schedule at the step it had reached; ``version``
        comes from the checkpoint's meta."""
        self.schedule = None
        for group in self.optimizer.param_groups:
            group.pop("initial_lr", None)  # a scheduler's; the checkpoint has one only if it saved a schedule
        checkpoint.load_train_state(path, self.model, self.optimizer, self.rank)
        state = checkpoint.load_schedule(path)
        self.schedule = None if state is None else PhaseSchedule.from_state_dict(self.optimizer, state)
        self.version = version
        dist.barrier()
