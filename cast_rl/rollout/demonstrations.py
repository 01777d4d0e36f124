"""Gold demonstrations: episodes played by a scripted expert through the real episode runner.

The expert (:mod:`cast_rl.rollout.expert`, also served as ``inference.backend=expert``)
authenticates the user, then runs the task's gold actions, listing each write's details and
asking for an explicit yes before it (as the domain policies require), and reports back after it.  Because the episodes go through :class:`~cast_rl.rollout.runner.EpisodeRunner`
with the configured user simulator, a demonstration has exactly the format, token bookkeeping and
user replies of a policy rollout; it is what the embedded default's supervised warm-start trains
the tiny policy on (a random tiny policy solves nothing).
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from cast_rl.config.schema import CastConfig
from cast_rl.envs.core import DomainData
from cast_rl.records import Trajectory
from cast_rl.rollout.expert import (  # noqa: F401 - re-exported: the warm-start's expert
    ASSISTANT_TURN,
    IDENTITY_QUESTION,
    ScriptPolicy,
    expert_script,
    tool_call_text,
)
from cast_rl.rollout.runner import EpisodeRunner, EpisodeSpec


async def _demonstrate(cfg: CastConfig, data: DomainData, tokenizer: Any, spec: EpisodeSpec) -> Trajectory:
    task = data.task(spec.split, spec.task_index)
    policy = ScriptPolicy(tokenizer, expert_script(task, data.spec.write_tools))
    return await EpisodeRunner(cfg, data, policy).run(spec)


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
