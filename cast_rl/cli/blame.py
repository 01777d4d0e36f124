"""``cast-rl blame``: verified blame of labelled trajectories, by counterfactual branches.

Run::

    cast-rl blame configs/quickstart.yaml pipeline.blame_k=4 policy.path=runs/x/policy \\
        --trajectories runs/x/02_collect/trajectories.jsonl --labels runs/x/03_label/labels.jsonl \\
        --out runs/x/blame.jsonl

For every failed trajectory and every action labelled invalid that ran, the state before the
action is rebuilt by replaying the recorded prefix, the action is replaced by the privileged
correction (the next gold step, or the confirmation it needs) and the episode continues
``pipeline.blame_k`` times with the policy at ``policy.path`` (served in this process by
``inference.*``; no critic in the loop).  The configuration must be the one the trajectories were
collected with (``seed``, ``env.*``, ``user.*``): the replay checks that every recorded message
comes out again and says where it does not.  One line per checked label goes to ``--out``;
precision per error type and per rule goes to stderr and to ``blame/`` metrics.  See
:mod:`cast_rl.critique.blame`.
"""

from __future__ import annotations

import argparse
import sys

from cast_rl.config.args import add_config_arguments, config_from_args


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("blame", help="verify labels by counterfactual branches (does the fix flip the outcome?)")
    add_config_arguments(parser, example="pipeline.blame_k=4")
    parser.add_argument("--trajectories", required=True, help="the labelled trajectories (JSON Lines)")
    parser.add_argument("--labels", required=True, help="their labels (JSON Lines, cast-rl label)")
    parser.add_argument("--out", required=True, help="blame records to write (JSON Lines)")
    parser.set_defaults(func=_blame)


def _blame(args: argparse.Namespace) -> int:
    import asyncio
    from dataclasses import replace

    from cast_rl.config import ConfigError
    from cast_rl.critique.blame import blame_metrics, count_failed, verify_blame, write_blame
    from cast_rl.critique.datasets import read_labels
    from cast_rl.envs.setup import load_env_data
    from cast_rl.envs.users import user_engine
    from cast_rl.inference import build_engine
    from cast_rl.records import read_trajectories
    from cast_rl.rollout.runner import EpisodeRunner
    from cast_rl.telemetry.metrics import MetricsLogger

    cfg = config_from_args(args)
    if cfg.pipeline.blame_k < 1:
        raise ConfigError("pipeline.blame_k=0 is not allowed for cast-rl blame; give the continuations "
                          "per label, e.g. pipeline.blame_k=4")
    data = load_env_data(cfg)
    trajectories = read_trajectories(args.trajectories)
    labels = read_labels(args.labels)
    cfg = replace(cfg, critic=replace(cfg.critic, verification_budget=0))

    async def run() -> list:
        engine = build_engine(cfg.policy.path, cfg.inference, seed=cfg.seed, dtype=cfg.policy.dtype)
        users, complete = user_engine(cfg.user, seed=cfg.seed)
        try:
            runner = EpisodeRunner(cfg, data, engine, user_complete=complete)
            return await verify_blame(data, trajectories, labels, lambda _: runner, cfg.pipeline.blame_k, cfg.seed)
        finally:
            await engine.close()
            if users is not None:
                await users.close()

    records = asyncio.run(run())
    write_blame(args.out, records)
    metrics = blame_metrics(records, count_failed(trajectories))
    print(f"blame: {int(metrics['blame/checked'])} labels checked ({int(metrics['blame/uncorrectable'])} "
          f"without a correction), {int(metrics['blame/confirmed'])} confirmed -> {args.out}", file=sys.stderr)
    print(f"precision {metrics['blame/precision']:.3f}; failures with a confirmed decisive action "
          f"{metrics['blame/confirmed_decisive_share']:.3f}", file=sys.stderr)
    for key, value in metrics.items():
        if key.startswith(("blame/precision_type/", "blame/precision_rule/")) and not key.endswith("_n"):
            print(f"  {key.removeprefix('blame/')}: {value:.3f} (n={int(metrics[key + '_n'])})", file=sys.stderr)
    with MetricsLogger(replace(cfg.logging, run_name=cfg.logging.run_name or "blame"), cfg.run_dir,
                       job_type="blame") as logger:
        logger.log(metrics)
    return 0
