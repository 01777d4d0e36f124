"""Resolve a run's environment data from its config (generating the embedded default if needed)."""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import replace
from pathlib import Path

from cast_rl.config.schema import RETAIL_TASK_KINDS, CastConfig, EnvConfig
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
    return _generated(cfg, cfg.env)


def unseen_split(seed: int) -> str:
    """The split name of the unseen database generated with ``seed`` (``eval.unseen_seeds``)."""
    return f"unseen-{seed}"


def unseen_data_dirs(cfg: CastConfig) -> dict[str, Path]:
    """Split -> data directory of every unseen database (``eval.unseen_seeds``), written on first
    use: the training database's generator settings with another seed and ``eval.unseen_tasks``
    tasks, all in the one split."""
    out = {}
    for seed in cfg.eval.unseen_seeds:
        env = replace(cfg.env, generated_seed=seed, generated_tasks=cfg.eval.unseen_tasks)
        out[unseen_split(seed)] = _generated(cfg, env, split=unseen_split(seed))
    return out


def _generated(cfg: CastConfig, env: EnvConfig, split: str | None = None) -> Path:
    name = f"retail-seed{env.generated_seed}-n{env.generated_tasks}"
    if tuple(env.generated_kinds) != RETAIL_TASK_KINDS:
        name += "-" + "+".join(env.generated_kinds)
    if env.generated_compact:
        name += "-compact"
    if env.generated_auth != "either":
        name += f"-{env.generated_auth}"
    if split:
        name += f"-{split}"
    out = Path(cfg.run_dir) / "data" / name
    if not out.exists():
        logger.info("generating %d retail tasks (seed %d) in %s", env.generated_tasks, env.generated_seed, out)
        # Write beside the target and rename: processes racing on one node never see half a copy.
        tmp = out.with_name(f"{out.name}.tmp-{os.getpid()}")
        write_retail(tmp, seed=env.generated_seed, num_tasks=env.generated_tasks,
                     kinds=tuple(env.generated_kinds), compact=env.generated_compact,
                     auth=env.generated_auth, split=split)
        try:
            tmp.rename(out)
        except OSError:  # another process finished first; its copy is identical
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def load_env_data(cfg: CastConfig) -> DomainData:
    """The run's domain data, the unseen databases' splits linked in (``eval.unseen_seeds``)."""
    clock = fixed_clock(cfg.env.now) if cfg.env.now else None
    data = load_domain_data(cfg.env.domain, data_dir_for(cfg), clock=clock)
    for split, path in unseen_data_dirs(cfg).items():
        if split not in data.splits:  # the data is cached per directory: link once
            data.link_split(split, load_domain_data(cfg.env.domain, path, clock=clock))
    return data


def is_unseen(split: str) -> bool:
    """A split of an unseen database (:func:`unseen_split`)."""
    return split.startswith("unseen-")


def episode_units(cfg: CastConfig, data: DomainData, trials: int | None = None) -> list[tuple[str, int, int]]:
    """(split, task_index, trial) for every selected task and trial of the configured split
    (every task of an unseen database's split: ``env.task_indices`` selects training data's)."""
    split = cfg.env.split
    indices = range(len(data.tasks(split))) if is_unseen(split) or not cfg.env.task_indices else cfg.env.task_indices
    n = trials if trials is not None else cfg.rollout.trials_per_task
    return [(cfg.env.split, int(i), t) for i in indices for t in range(n)]
