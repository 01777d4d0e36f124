"""Gold demonstrations: episodes played by a scripted expert through the real episode runner.

The expert authenticates the user, then runs the task's gold actions, listing each write's
details and asking for an explicit yes before it (as the domain policies require), and reports
back after it.  Because the episodes go through :class:`~cast_rl.rollout.runner.EpisodeRunner`
with the configured user simulator, a demonstration has exactly the format, token bookkeeping and
user replies of a policy rollout; it is what the embedded default's supervised warm-start trains
the tiny policy on (a random tiny policy solves nothing).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any

from cast_rl.config.schema import CastConfig
from cast_rl.envs.core import DomainData
from cast_rl.envs.types import RESPOND, Task
from cast_rl.inference.base import Completion, Sampling
from cast_rl.rollout.runner import EpisodeRunner, EpisodeSpec
from cast_rl.rollout.trajectory import Trajectory

IDENTITY_QUESTION = "Could you give me your email, or your first name, last name and zip code?"
ASSISTANT_TURN = "<|im_start|>assistant\n"


def tool_call_text(name: str, arguments: dict[str, Any]) -> str:
    """A tool call exactly as the chat template renders it."""
    payload = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"<tool_call>\n{payload}\n</tool_call>"


def expert_script(task: Task, write_tools: frozenset[str]) -> list[str]:
    """The expert's turns for a task, in order."""
    turns = [IDENTITY_QUESTION]
    for action in task.actions:
        if action.name == RESPOND:
            turns.append(str(action.kwargs.get("content", "")))
            continue
        if action.name in write_tools:
            details = json.dumps(action.kwargs, ensure_ascii=False)
            turns.append(f"I will call {action.name} with {details}. Do you confirm (yes/no)?")
        turns.append(tool_call_text(action.name, action.kwargs))
        if action.name in write_tools:
            turns.append("Done. Is there anything else I can help you with?")
    turns.append("Thank you. Goodbye.")
    return turns


class ScriptEngine:
    """An engine that answers the n-th policy turn of a prompt with ``turns[n]`` (canonical ids)."""

    def __init__(self, tokenizer: Any, turns: list[str]) -> None:
        self.tokenizer = tokenizer
        self.turns = turns
        self._eos = tokenizer.convert_tokens_to_ids(tokenizer.eos_token)

    async def generate(self, prompt_ids: list[int], sampling: Sampling) -> Completion:
        text = self.tokenizer.decode(prompt_ids, skip_special_tokens=False)
        n = text.count(ASSISTANT_TURN) - 1
        body = self.turns[min(n, len(self.turns) - 1)]
        ids = [*self.tokenizer(body, add_special_tokens=False).input_ids, self._eos]
        return Completion(text=body, token_ids=ids, logprobs=[0.0] * len(ids))

    async def chat(self, messages, sampling, tools=None):  # noqa: ANN001, ANN201
        raise NotImplementedError("ScriptEngine only serves token prompts")

    async def close(self) -> None:
        return None


async def _demonstrate(cfg: CastConfig, data: DomainData, tokenizer: Any, spec: EpisodeSpec) -> Trajectory:
    task = data.task(spec.split, spec.task_index)
    engine = ScriptEngine(tokenizer, expert_script(task, data.spec.write_tools))
    return await EpisodeRunner(cfg, data, engine).run(spec)


def collect_demonstrations(
    cfg: CastConfig, data: DomainData, tokenizer: Any, split: str, successful_only: bool = True
) -> list[Trajectory]:
    """One expert episode per task of ``split`` (those that earn reward 1, by default).

    The expert is not bound by the run's step or context limits (it is not the policy).
    """
    cfg = dataclasses.replace(
        cfg,
        env=dataclasses.replace(cfg.env, max_steps=max(cfg.env.max_steps, 64)),
        inference=dataclasses.replace(cfg.inference, max_model_len=1 << 20),
    )
    specs = [EpisodeSpec(split, i, 0) for i in range(len(data.tasks(split)))]

    async def run_all() -> list[Trajectory]:
        return list(await asyncio.gather(*(_demonstrate(cfg, data, tokenizer, s) for s in specs)))

    trajectories = asyncio.run(run_all())
    for traj in trajectories:
        traj.policy_version = -1  # not produced by any policy version
        traj.info["demonstration"] = True
    return [t for t in trajectories if t.reward == 1.0 or not successful_only]
