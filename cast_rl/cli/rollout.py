"""``cast-rl rollout CONFIG [overrides] --out trajectories.jsonl``: collect trajectories."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("rollout", help="collect trajectories with rollout workers on Ray")
    parser.add_argument("config", help="YAML file, or 'default'")
    parser.add_argument("overrides", nargs="*", help="dotted overrides such as rollout.num_workers=2")
    parser.add_argument("--out", required=True, help="output JSON Lines file of trajectories")
    parser.set_defaults(func=_rollout)


def _rollout(args: argparse.Namespace) -> int:
    from cast_rl.config import load_config
    from launchers.rollout import run_rollout

    cfg = load_config(None if args.config == "default" else args.config, args.overrides)
    summary = run_rollout(cfg, args.out)
    print(summary)
    return 0
