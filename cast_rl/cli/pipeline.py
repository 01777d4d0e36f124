"""``cast-rl pipeline [CONFIG] [overrides]``: run the CAST pipeline (resumable by stage)."""

from __future__ import annotations

import argparse

from cast_rl.config.args import add_config_arguments, config_from_args


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("pipeline", help="run the CAST pipeline end to end (resumable)")
    add_config_arguments(parser, example="pipeline.warmstart_epochs=2")
    parser.set_defaults(func=_pipeline)


def _pipeline(args: argparse.Namespace) -> int:
    from launchers.pipeline import print_result, run_pipeline

    cfg = config_from_args(args)
    print_result(run_pipeline(cfg))
    return 0
