"""Evaluate the policy: n trials per task, without the critic and with it in the loop.

    cast-rl eval configs/quickstart.yaml eval.verification_budgets=[0,1,2] --out runs/quickstart/eval
    python -m launchers.eval configs/quickstart.yaml --out runs/eval   # e.g. under ray job submit

One :class:`RolloutGroup` (one vLLM engine per worker) serves every domain (``eval.domains``,
else ``env.domain``) and every configuration: the live workers are switched from domain to domain
(:meth:`RolloutGroup.set_domain`) and, within a domain, through the budgets of
``eval.verification_budgets`` between collections.  Every
configuration runs the same (split, task, trial) units with the same per-episode sampling seeds,
so the configurations differ only by the critic.  Writes, under the output directory::

    trajectories/<configuration>.jsonl   (no_critic, critic_b1, ...; streamed as episodes end)
    config.json                          the resolved config (``cast-rl view`` finds the data by it)
    report.json, summary.md, plots/*.png (see cast_rl.eval.report)

and logs ``eval/`` metrics plus a W&B table of sample trajectories with their critiques.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from tqdm import tqdm

from actors.rollout_group import RolloutGroup
from cast_rl.config import to_dict
from cast_rl.config.schema import CastConfig
from cast_rl.critique.service import critic_description
from cast_rl.envs.setup import episode_units, load_env_data, unseen_data_dirs
from cast_rl.eval.critic import labeller_judge
from cast_rl.eval.report import (
    SAMPLE_COLUMNS,
    EvalRun,
    build_report,
    flat_metrics,
    sample_rows,
    write_report,
)
from cast_rl.models.setup import ensure_policy_model
from cast_rl.pipeline.context import resolve_critic
from cast_rl.records import Trajectory, write_trajectories
from cast_rl.telemetry import MetricsLogger
from launchers import commands
from launchers.cluster import init_ray

logger = logging.getLogger(__name__)


def eval_budgets(cfg: CastConfig) -> list[int]:
    """The verification budgets to run, in ascending order (0 is the no-critic configuration)."""
    budgets = sorted(cfg.eval.verification_budgets)
    return budgets if cfg.eval.with_critic else [b for b in budgets if b == 0]


def eval_trials(cfg: CastConfig) -> int:
    """n: trials per task (``eval.trials``, else ``rollout.trials_per_task``)."""
    n = cfg.rollout.trials_per_task if cfg.eval.trials is None else cfg.eval.trials
    if cfg.eval.k_values and max(cfg.eval.k_values) > n:  # also checked when the config loads
        raise ValueError(f"eval.k_values={cfg.eval.k_values} needs n >= {max(cfg.eval.k_values)}, got n={n}")
    return n


def domain_configs(cfg: CastConfig) -> list[CastConfig]:
    """One config per evaluated domain (``eval.domains`` read from ``eval.data_root/<domain>``)."""
    if not cfg.eval.domains:
        return [cfg]
    root = Path(cfg.eval.data_root)
    return [replace(cfg, env=replace(cfg.env, domain=d, data_dir=str(root / d))) for d in cfg.eval.domains]


def run_eval(cfg: CastConfig, out_dir: str | Path, group: Any = None) -> dict[str, Any]:
    """Collect every configuration, write trajectories, report, summary and plots; log metrics.

    ``group``: a running :class:`RolloutGroup` to use (the pipeline passes its own, serving the
    current policy weights); it is left running, switched back to the domain it served.  Without
    one, a group starts for the first domain and is shut down at the end.
    Returns the JSON report (:mod:`cast_rl.eval.report`).
    """
    out_dir = Path(out_dir)
    budgets, n = eval_budgets(cfg), eval_trials(cfg)
    if group is None:  # a standalone run serves what the pipeline's later stages would
        cfg = replace(cfg, critic=resolve_critic(cfg))
    runs = {b: EvalRun(b, [], critiques=0, critic=critic_description(cfg.critic), unparsable=0) for b in budgets}
    paths = {b: out_dir / "trajectories" / f"{run.name}.jsonl" for b, run in runs.items()}
    for path in paths.values():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")
    (out_dir / "config.json").write_text(json.dumps(to_dict(cfg), indent=2))  # cast-rl view finds the data by it
    data_by_domain: dict[str, Any] = {}
    owned = group is None
    home = None if owned else group.cfg  # the domain a given group goes back to
    try:
        for domain_cfg in domain_configs(cfg):
            data = load_env_data(domain_cfg)
            data_by_domain[domain_cfg.env.domain] = data
            if owned:
                ensure_policy_model(domain_cfg, data)
                init_ray(domain_cfg, parts=("rollout", "critic") if max(budgets) else ("rollout",))
            if group is None:
                group = RolloutGroup(domain_cfg)
            elif group.cfg.env != domain_cfg.env:  # same engines, another domain's environments
                group.set_domain(domain_cfg)
            _collect_domain(domain_cfg, data, n, runs, paths, group)
    finally:
        if owned and group is not None:
            group.shutdown()
    if home is not None and group.cfg.env != home.env:  # (after a failure the caller's stage fails too)
        group.set_domain(home)
    report = build_report(list(runs.values()), cfg.eval.k_values or None, labeller_judge(data_by_domain),
                          in_domain=cfg.eval.in_domain)
    written = write_report(report, out_dir)
    with MetricsLogger(cfg.logging, cfg.run_dir, config=to_dict(cfg), job_type="eval") as log:
        log.log(flat_metrics(report))
        log.log_table("eval/samples", SAMPLE_COLUMNS, sample_rows(list(runs.values()), cfg.eval.sample_trajectories))
    logger.info("evaluation report: %s", written["summary"])
    return report


def _collect_domain(
    cfg: CastConfig, data: Any, n: int, runs: dict[int, EvalRun], paths: dict[int, Path], group: Any
) -> None:
    """Run every configuration on one domain through ``group`` (serving that domain)."""
    splits = (cfg.eval.splits or [cfg.env.split]) + list(unseen_data_dirs(cfg))
    units = [u for s in splits for u in episode_units(replace(cfg, env=replace(cfg.env, split=s)), data, trials=n)]
    for budget, run in runs.items():
        group.set_verification_budget(budget)
        before = group.metrics()
        with tqdm(total=len(units), desc=f"eval {cfg.env.domain} {run.label}", unit="episode") as bar:

            def on_done(traj: Trajectory, path: Path = paths[budget]) -> None:
                write_trajectories(path, [traj], append=True)
                bar.update(1)

            run.trajectories += group.collect(units, on_done=on_done)
        # a restarted worker's counters start again from zero: then this undercounts
        after = group.metrics()
        counted = {k: max(0, int(after.get(k, 0) - before.get(k, 0))) for k in ("rollout/critiques", "rollout/critic_unparsable")}
        run.critiques = (run.critiques or 0) + counted["rollout/critiques"]
        run.unparsable = (run.unparsable or 0) + counted["rollout/critic_unparsable"]


def command(args: argparse.Namespace, cfg: CastConfig) -> int:
    """``cast-rl eval`` and ``python -m launchers.eval`` (:mod:`launchers.commands`): prints the
    summary and where the report is."""
    out = Path(args.out) if args.out else Path(cfg.run_dir) / "eval"
    run_eval(cfg, out)
    print((out / "summary.md").read_text())
    print(f"report: {out / 'report.json'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m launchers.eval``: the same as ``cast-rl eval``."""
    return commands.main("eval", command, argv, description=__doc__)


if __name__ == "__main__":
    sys.exit(main())
