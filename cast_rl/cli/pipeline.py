"""``cast-rl pipeline CONFIG [overrides]``: run the CAST pipeline (resumable by stage)."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("pipeline", help="run the CAST pipeline end to end (resumable)")
    parser.add_argument("config", help="YAML file, or 'default'")
    parser.add_argument("overrides", nargs="*", help="dotted overrides such as pipeline.warmstart_epochs=2")
    parser.set_defaults(func=_pipeline)


def _pipeline(args: argparse.Namespace) -> int:
    from cast_rl.config import load_config
    from launchers.pipeline import print_result, run_pipeline

    cfg = load_config(None if args.config == "default" else args.config, args.overrides)
    print_result(run_pipeline(cfg))
    return 0
