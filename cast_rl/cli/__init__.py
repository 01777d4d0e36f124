"""The ``cast-rl`` command line.  Run ``cast-rl --help`` for the subcommands.

Each subcommand lives in its own module under :mod:`cast_rl.cli` with a ``register(subparsers)``
function; heavy imports (torch, vLLM, Ray) happen inside the command handlers so ``--help`` and
``config show`` stay fast.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from cast_rl.config import ConfigError

_COMMAND_MODULES = (
    "config", "model", "env", "rollout", "label", "blame", "benefit", "critic", "eval", "metrics", "pipeline", "plan", "view",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cast-rl",
        description="CAST: critique-aware supervision for long-horizon tool-calling agents.",
    )
    parser.add_argument(
        "--log-level", default=None, help="console log level (INFO unless given; with a config it is logging.level)"
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in _COMMAND_MODULES:
        importlib.import_module(f"cast_rl.cli.{name}").register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=(args.log_level or "INFO").upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        return int(args.func(args) or 0)
    except ConfigError as exc:
        print(str(exc), file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
