"""Resolve a run's environment data from its config (generating the embedded default if needed)."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

from cast_rl.config.schema import RETAIL_TASK_KINDS, CastConfig
from cast_rl.envs.core import DomainData, fixed_clock, load_domain_data
from cast_rl.envs.generate import write_retail

logger = logging.getLogger(__name__)


def data_dir_for(cfg: CastConfig) -> Path:
    """``env.data_dir``, or the generated retail data under ``run_dir`` (written on first use).

    Generation is deterministic per seed, so every node of a cluster that lacks the directory
    writes an identical copy.
    """
    if cfg.env.data_dir:
        return Path(cfg.env.data_dir)
    if cfg.env.domain != "retail":
        raise ValueError(
            f"env.data_dir='' is only allowed with env.domain='retail' (the generated default); "
            f"give the {cfg.env.domain} data directory"
        )
    env = cfg.env
    name = f"retail-seed{env.generated_seed}-n{env.generated_tasks}"
    if tuple(env.generated_kinds) != RETAIL_TASK_KINDS:
        name += "-" + "+".join(env.generated_kinds)
    if env.generated_compact:
        name += "-compact"
    if env.generated_auth != "either":
        name += f"-{env.generated_auth}"
    out = Path(cfg.run_dir) / "data" / name
    if not out.exists():
        logger.info("generating %d retail tasks (seed %d) in %s", cfg.env.generated_tasks, cfg.env.generated_seed, out)
        # Write beside the target and rename: processes racing on one node never see half a copy.
        tmp = out.with_name(f"{out.name}.tmp-{os.getpid()}")
        write_retail(tmp, seed=env.generated_seed, num_tasks=env.generated_tasks,
                     kinds=tuple(env.generated_kinds), compact=env.generated_compact,
                     auth=env.generated_auth)
        try:
            tmp.rename(out)
        except OSError:  # another process finished first; its copy is identical
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def load_env_data(cfg: CastConfig) -> DomainData:
    clock = fixed_clock(cfg.env.now) if cfg.env.now else None
    return load_domain_data(cfg.env.domain, data_dir_for(cfg), clock=clock)


def episode_units(cfg: CastConfig, data: DomainData, trials: int | None = None) -> list[tuple[str, int, int]]:
    """(split, task_index, trial) for every selected task and trial of the configured split."""
    indices = cfg.env.task_indices or range(len(data.tasks(cfg.env.split)))
    n = trials if trials is not None else cfg.rollout.trials_per_task
    return [(cfg.env.split, int(i), t) for i in indices for t in range(n)]
