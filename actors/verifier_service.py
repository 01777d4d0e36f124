"""Ray actor shell of the LLM verifier (:mod:`cast_rl.critique.llm_verifier`): the label stage's
``labeller.backend=llm`` or ``hybrid`` runs on its own resources.

The actor asks Ray for ``labeller.num_cpus`` CPUs and ``labeller.num_gpus`` GPUs (set them on GPU
clusters), loads the run's domain data, starts the verifier's engine once and labels the
trajectories it is sent; the stage closes it (engine, then actor) when the labels are written.
"""

from __future__ import annotations

from typing import Any

import ray

from cast_rl.config.schema import CastConfig
from cast_rl.critique.labeller import ActionLabel, LabelStats
from cast_rl.critique.llm_verifier import build_verifier_engine, label_trajectories
from cast_rl.envs.setup import load_env_data
from cast_rl.records import Trajectory


@ray.remote
class VerifierServiceActor:
    def __init__(self, cfg: CastConfig) -> None:
        self.cfg = cfg.labeller
        self.data = load_env_data(cfg)
        self.engine = build_verifier_engine(cfg.labeller, seed=cfg.seed)

    async def label(self, trajectories: list[Trajectory]) -> tuple[list[ActionLabel], LabelStats, dict[str, float]]:
        return await label_trajectories(self.cfg, self.data, trajectories, engine=self.engine)

    async def close(self) -> None:
        await self.engine.close()


def verifier_actor(cfg: CastConfig) -> Any:
    """A private verifier actor for one label stage; end it with ``close`` and ``ray.kill``."""
    return VerifierServiceActor.options(num_cpus=cfg.labeller.num_cpus, num_gpus=cfg.labeller.num_gpus).remote(cfg)


def label_with_service(cfg: CastConfig, trajectories: list[Trajectory]) -> tuple[list[ActionLabel], LabelStats,
                                                                               dict[str, float]]:
    """Label ``trajectories`` on a verifier actor started for the call and ended after it."""
    actor = verifier_actor(cfg)
    try:
        return ray.get(actor.label.remote(trajectories))
    finally:
        ray.get(actor.close.remote())
        ray.kill(actor)
