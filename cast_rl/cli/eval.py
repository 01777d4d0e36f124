"""``cast-rl eval [CONFIG] [overrides] [--out DIR]``: pass^k with and without the critic.

Runs n trials per task for every configuration of ``eval.verification_budgets`` (0: no critic),
writes trajectories, ``report.json``, ``summary.md`` and ``plots/`` under ``--out`` (default
``<run_dir>/eval``) and prints the summary.  See :mod:`launchers.eval`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from cast_rl.config.args import add_config_arguments, config_from_args


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("eval", help="evaluate pass^k without and with the critic in the loop")
    add_config_arguments(parser, example="eval.verification_budgets=[0,1]")
    parser.add_argument("--out", default=None, help="output directory (default: <run_dir>/eval)")
    parser.set_defaults(func=_eval)


def _eval(args: argparse.Namespace) -> int:
    from launchers.eval import run_eval

    cfg = config_from_args(args)
    out = Path(args.out) if args.out else Path(cfg.run_dir) / "eval"
    run_eval(cfg, out)
    print((out / "summary.md").read_text())
    print(f"report: {out / 'report.json'}")
    return 0
