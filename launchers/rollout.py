"""Collect trajectories with rollout workers on Ray.

    cast-rl rollout configs/quickstart.yaml --out runs/quickstart/trajectories.jsonl
    python -m launchers.rollout configs/quickstart.yaml --out trajectories.jsonl   # ray job submit
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from tqdm import tqdm

from actors.rollout_group import RolloutGroup
from cast_rl.config.schema import CastConfig
from cast_rl.envs.setup import episode_units, load_env_data
from cast_rl.models.setup import ensure_policy_model
from cast_rl.records import Trajectory, write_trajectories
from cast_rl.telemetry import MetricsLogger
from launchers import commands
from launchers.cluster import init_ray

logger = logging.getLogger(__name__)


def run_rollout(cfg: CastConfig, out: str | Path, units: list | None = None) -> dict:
    """Collect every selected (task, trial) once; write them as JSON Lines; return a summary."""
    data = load_env_data(cfg)
    ensure_policy_model(cfg, data)
    init_ray(cfg, parts=("rollout", "critic") if cfg.critic.verification_budget else ("rollout",))
    units = units if units is not None else episode_units(cfg, data)
    group = RolloutGroup(cfg)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("")
    bar = tqdm(total=len(units), desc="rollout", unit="episode")

    def on_done(traj: Trajectory) -> None:
        write_trajectories(out, [traj], append=True)  # streamed as episodes finish
        bar.update(1)

    try:
        trajectories = group.collect(units, on_done=on_done)
        metrics = group.metrics()
    finally:
        bar.close()
        group.shutdown()
    rewards = [t.reward for t in trajectories]
    metrics["rollout/reward_mean"] = sum(rewards) / max(len(rewards), 1)
    with MetricsLogger(cfg.logging, cfg.run_dir, job_type="rollout") as log:
        log.log(metrics)
    return {"episodes": len(trajectories), "reward_mean": metrics["rollout/reward_mean"], "out": str(out)}


def command(args: argparse.Namespace, cfg: CastConfig) -> int:
    """``cast-rl rollout`` and ``python -m launchers.rollout`` (:mod:`launchers.commands`)."""
    print(run_rollout(cfg, args.out))
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m launchers.rollout``: the same as ``cast-rl rollout``."""
    return commands.main("rollout", command, argv, description=__doc__)


if __name__ == "__main__":
    sys.exit(main())
