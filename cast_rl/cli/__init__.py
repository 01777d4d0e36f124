"""The ``cast-rl`` command line.  Run ``cast-rl --help`` for the subcommands.

Each subcommand lives in its own module under :mod:`cast_rl.cli` with a ``register(subparsers)``
function, except the driver commands (``pipeline``, ``train``, ``eval``, ``rollout``): their
arguments are :data:`launchers.commands.COMMANDS` and their handler ``launchers.<name>.command``,
so ``cast-rl X`` and ``python -m launchers.X`` are one command.  Heavy imports (torch, vLLM, Ray)
happen inside the command handlers so ``--help`` and ``config show`` stay fast; the logging set-up
and the one-line config errors are :mod:`launchers.commands`' too.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from cast_rl.config.schema import CastConfig
from launchers import commands

_COMMANDS = (
    "config", "model", "env", "rollout", "label", "blame", "benefit", "critic", "eval", "metrics", "pipeline", "plan",
    "train", "view",
)
"""The subcommands in the order ``--help`` lists them: a module of :mod:`cast_rl.cli`, or a
driver command of :data:`launchers.commands.COMMANDS`."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cast-rl",
        description="CAST: critique-aware supervision for long-horizon tool-calling agents.",
    )
    parser.add_argument(
        "--log-level", default=None, help="console log level (INFO unless given; with a config it is logging.level)"
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in _COMMANDS:
        if name in commands.COMMANDS:
            commands.register(subparsers, name, _driver_command)
        else:
            importlib.import_module(f"cast_rl.cli.{name}").register(subparsers)
    return parser


def _driver_command(args: argparse.Namespace, cfg: CastConfig) -> int:
    """A driver command: ``launchers.<command>.command``, imported when it runs (Ray, torch)."""
    return importlib.import_module(f"launchers.{args.command}").command(args, cfg)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    commands.setup_logging(args.log_level)
    return commands.run_command(args)


if __name__ == "__main__":
    sys.exit(main())
