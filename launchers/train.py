"""Train the policy with the full Ray stack: rollout workers, replay buffer, FSDP learner group.

    cast-rl train configs/quickstart.yaml algorithm.steps=20
    python -m launchers.train configs/quickstart.yaml algorithm.steps=20   # the same; ray job submit
    python -m launchers.train configs/quickstart.yaml --collector toy   # first-token toy task

Parses the config, starts or joins Ray (``cluster.address``), builds the learner group
(``learner.num_workers`` FSDP ranks), the replay-buffer actor (log under ``replay.log_dir``) and
the collector — the rollout group (``--collector rollout``, the real environments) or a
transformers sampler on :class:`cast_rl.learner.toy.FirstTokenTask` (``--collector toy``) —
resumes from the latest checkpoint under ``run_dir`` if there is one, and runs
:class:`cast_rl.learner.loop.TrainLoop` in ``algorithm.mode`` under the supervisor
(:func:`train_policy`, the one training driver, which the pipeline's ``optimise`` stage calls too).  The final policy is written as a
Hugging Face directory to ``<run_dir>/policy-final``; the last stdout line is a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray

from actors.learner import LearnerGroup
from actors.replay_buffer import ReplayBufferClient
from actors.rollout_group import RolloutGroup
from actors.supervision import ray_supervisor
from cast_rl.config import to_dict
from cast_rl.config.schema import CastConfig
from cast_rl.envs.setup import load_env_data
from cast_rl.learner.loop import TrainLoop
from cast_rl.learner.supervisor import MonotoneCollector
from cast_rl.learner.toy import HFCollector
from cast_rl.models.setup import ensure_model, ensure_policy_model
from cast_rl.records import Trajectory
from cast_rl.telemetry import MetricsLogger
from launchers import commands
from launchers.cluster import init_ray

logger = logging.getLogger(__name__)


class HFCollectorClient:
    """A :class:`cast_rl.learner.toy.HFCollector` in a Ray actor, behind the collector interface."""

    def __init__(self, model_path: str, seed: int = 0, max_new_tokens: int = 2, num_cpus: float = 0.5) -> None:
        actor: Any = ray.remote(HFCollector)
        self.handle = actor.options(num_cpus=num_cpus).remote(
            model_path, max_new_tokens=max_new_tokens, seed=seed
        )

    def collect(self, units: list[tuple[str, int, int]], tree: tuple[int, str] | None = None) -> list[Trajectory]:
        return ray.get(self.handle.collect.remote(units, tree))

    def update_weights(self, version: int, weights: Any, checksum: str) -> int:
        # An ObjectRef passed at top level is resolved by Ray: the actor reads the one stored copy.
        return ray.get(self.handle.update_weights.remote(version, weights, checksum))


def build_collector(cfg: CastConfig, kind: str) -> tuple[Any, list[int], str]:
    """(collector, task indices, split) for ``--collector``."""
    if kind == "toy":
        ensure_model(cfg.policy)
        return HFCollectorClient(cfg.policy.path, seed=cfg.seed), list(range(16)), "toy"
    data = load_env_data(cfg)
    ensure_policy_model(cfg, data)
    tasks = list(cfg.env.task_indices or range(len(data.tasks(cfg.env.split))))
    return RolloutGroup(cfg), tasks, cfg.env.split


@dataclass
class Training:
    """What :func:`train_policy` ran: the loop (its learner may be a rebuilt group), its history
    and the supervisor's recovered failures."""

    loop: TrainLoop
    history: list[dict[str, float]]
    failures: list[str]


def train_policy(cfg: CastConfig, collector: Any, tasks: list[int], split: str, metrics: MetricsLogger,
                 make_learner: Callable[[], Any], learner: Any = None, resume: bool = True) -> Training:
    """The one training driver: learner group, replay buffer, supervisor, resume, replay log.

    ``python -m launchers.train`` and the pipeline's ``optimise`` stage both call it.  The
    collector is wrapped in :class:`MonotoneCollector` (policy versions reach rollout workers in
    order, once); the replay buffer is an actor logging to ``replay.log_dir`` (default
    ``<run_dir>/replay``) that recovers from its log; ``resume`` restores the latest checkpoint
    under ``run_dir``.  ``learner`` (default ``make_learner()``) may already have trained (the
    pipeline's supervised steps): it is then checkpointed at step 0, so a group the supervisor
    rebuilds after a worker death resumes from those weights rather than the initial ones.  The
    replay buffer is closed when training ends; the learner is the caller's to save and shut down
    (``Training.loop.learner``: the supervisor may have replaced it).
    """
    learner = learner if learner is not None else make_learner()
    log_dir = Path(cfg.replay.log_dir or Path(cfg.run_dir) / "replay")
    buffer = ReplayBufferClient(cfg.replay, log_dir / "log.jsonl", cfg.learner.global_batch_size,
                                max_restarts=cfg.learner.max_restarts)  # recovers from its log
    try:
        loop = TrainLoop(cfg, MonotoneCollector(collector), learner, buffer, tasks, metrics=metrics, split=split)
        if not (resume and loop.resume()) and learner.version > 0 and cfg.algorithm.mode == "sync":
            loop.checkpoint()
        # a dead learner worker: rebuild the group, resume from the latest checkpoint, go on
        supervisor = ray_supervisor(loop, make_learner, cfg.learner.max_restarts)
        history = supervisor.run()
    finally:
        _shutdown([buffer])
    return Training(loop, history, supervisor.failures)


def run_training(cfg: CastConfig, collector_kind: str = "rollout", resume: bool = True) -> dict[str, Any]:
    init_ray(cfg, parts=("rollout", "learner", "critic") if collector_kind == "rollout" else ("learner",))
    started: list[Any] = []  # what to end when the run stops, however it stops
    try:
        collector, tasks, split = build_collector(cfg, collector_kind)
        started.append(collector)
        learner = LearnerGroup(cfg)
        started.append(learner)
        with MetricsLogger(cfg.logging, cfg.run_dir, config=to_dict(cfg), job_type="train") as metrics:
            run = train_policy(cfg, collector, tasks, split, metrics, lambda: LearnerGroup(cfg),
                               learner=learner, resume=resume)
        started.append(run.loop.learner)  # the supervisor may have replaced the first group
        final = run.loop.learner.save_hf(Path(cfg.run_dir) / "policy-final")
    finally:
        _shutdown(started)
    return {
        "steps": run.loop.state.step,
        "policy_version": run.loop.learner.version,
        # steps whose collections held no sample with a learning signal (every group's outcomes
        # equal, dynamic sampling on): counted as steps, the weights stayed
        "skipped_steps": sum(int(h.get("train/skipped_empty", 0.0)) for h in run.history),
        "reward_per_step": [round(h.get("train/reward_mean", float("nan")), 4) for h in run.history],
        "policy": str(final),
    }


def _shutdown(parts: list[Any]) -> None:
    """End the actors a run started (engines close first), so a shared Ray gets its CPUs back."""
    for part in {id(p): p for p in parts}.values():
        if hasattr(part, "shutdown"):
            part.shutdown()
        elif hasattr(part, "handle"):
            ray.kill(part.handle)


def command(args: argparse.Namespace, cfg: CastConfig) -> int:
    """``cast-rl train`` and ``python -m launchers.train`` (:mod:`launchers.commands`): the last
    stdout line is the run's JSON summary."""
    print(json.dumps(run_training(cfg, args.collector, resume=not args.no_resume)))
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m launchers.train``: the same as ``cast-rl train``."""
    return commands.main("train", command, argv, description=__doc__)


if __name__ == "__main__":
    sys.exit(main())
