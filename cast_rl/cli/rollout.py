"""``cast-rl rollout [CONFIG] [overrides] --out trajectories.jsonl``: collect trajectories."""

from __future__ import annotations

import argparse

from cast_rl.config.args import add_config_arguments, config_from_args


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("rollout", help="collect trajectories with rollout workers on Ray")
    add_config_arguments(parser, example="rollout.num_workers=2")
    parser.add_argument("--out", required=True, help="output JSON Lines file of trajectories")
    parser.set_defaults(func=_rollout)


def _rollout(args: argparse.Namespace) -> int:
    from launchers.rollout import run_rollout

    cfg = config_from_args(args)
    summary = run_rollout(cfg, args.out)
    print(summary)
    return 0
