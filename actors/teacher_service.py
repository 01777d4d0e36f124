"""Ray actor shell of the teacher's rationale rewrite (:func:`cast_rl.critique.teacher.rewrite_labels`):
with ``teacher.enabled`` the label stage's rewrite runs on the teacher's own resources, never in
the driver.

The actor asks Ray for ``teacher.num_cpus`` CPUs and ``teacher.num_gpus`` GPUs (the options of
:func:`cast_rl.config.resources.actor_request` for kind ``teacher``, which the resource check
counts), loads the run's domain data, starts the teacher's engine once and rewrites the labels it
is sent; the stage closes it (engine, then actor) when the labels are written.
"""

from __future__ import annotations

from typing import Any

import ray

from cast_rl.config.resources import actor_request
from cast_rl.config.schema import CastConfig
from cast_rl.critique.labeller import ActionLabel
from cast_rl.critique.teacher import build_teacher_engine, rewrite_labels
from cast_rl.envs.setup import load_env_data
from cast_rl.records import Trajectory


@ray.remote
class TeacherServiceActor:
    def __init__(self, cfg: CastConfig) -> None:
        self.cfg = cfg
        self.data = load_env_data(cfg)
        self.engine = build_teacher_engine(cfg.teacher, seed=cfg.seed)

    async def rewrite(self, labels: list[ActionLabel],
                      trajectories: list[Trajectory]) -> tuple[list[ActionLabel], dict[str, float]]:
        metrics = await rewrite_labels(self.cfg.teacher, self.data, labels, trajectories, engine=self.engine)
        return labels, metrics

    async def close(self) -> None:
        await self.engine.close()


def teacher_actor(cfg: CastConfig) -> Any:
    """A private teacher actor for one label stage; end it with ``close`` and ``ray.kill``."""
    return TeacherServiceActor.options(**actor_request(cfg, "teacher").ray_options()).remote(cfg)


def rewrite_with_service(cfg: CastConfig, labels: list[ActionLabel],
                         trajectories: list[Trajectory]) -> tuple[list[ActionLabel], dict[str, float]]:
    """The labels with their rationales rewritten by a teacher actor started for the call and
    ended after it, and the ``label/teacher_*`` counts."""
    actor = teacher_actor(cfg)
    try:
        return ray.get(actor.rewrite.remote(labels, trajectories))
    finally:
        ray.get(actor.close.remote())
        ray.kill(actor)
