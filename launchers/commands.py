"""The driver commands' command line, written once for both ways of starting them.

``cast-rl pipeline|train|eval|rollout ...`` (:mod:`cast_rl.cli`) and
``python -m launchers.pipeline|train|eval|rollout ...`` (the module ``ray job submit`` and the
Slurm scripts run) take the same arguments, run the same handler and print the same output: a
:class:`Command` below holds a command's help line and flags, ``launchers.<name>.command`` is its
handler (given the parsed arguments and the resolved configuration); :func:`register` adds it to
the ``cast-rl`` parser and :func:`main` is a launcher module's ``main``.  :func:`setup_logging` and
:func:`run_command` are the logging set-up and the error printing of both (a
:class:`~cast_rl.config.loader.ConfigError`, e.g. an unknown key or the resource pre-flight, is
one line on stderr and exit status 2, nothing started).

This module stays light (argparse and the config helper only) and imports no driver:
``cast-rl --help`` imports it, and the drivers (Ray, torch, vLLM) import it.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass

from cast_rl.config import ConfigError
from cast_rl.config.args import add_config_arguments, config_from_args
from cast_rl.config.schema import CastConfig

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

Handler = Callable[[argparse.Namespace, CastConfig], int]
"""A driver command's handler, ``launchers.<name>.command``: the parsed arguments and the
resolved configuration in, the exit status out."""


@dataclass(frozen=True)
class Command:
    """One driver command: its ``cast-rl`` help line and its arguments."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]


def _pipeline_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser, example="pipeline.warmstart_epochs=2")


def _train_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser, example="algorithm.steps=20")
    parser.add_argument("--collector", choices=("rollout", "toy"), default="rollout",
                        help="rollout: the rollout group on the real environments; toy: the first-token toy task")
    parser.add_argument("--no-resume", action="store_true", help="ignore checkpoints under run_dir")


def _eval_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser, example="eval.verification_budgets=[0,1]")
    parser.add_argument("--out", default=None, help="output directory (default: <run_dir>/eval)")


def _rollout_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser, example="rollout.num_workers=2")
    parser.add_argument("--out", required=True, help="output JSON Lines file of trajectories")


COMMANDS: dict[str, Command] = {
    command.name: command
    for command in (
        Command("pipeline", "run the CAST pipeline end to end (resumable)", _pipeline_arguments),
        Command("train", "train the policy alone (rollout workers, replay buffer, FSDP learner; resumes)",
                _train_arguments),
        Command("eval", "evaluate pass^k without and with the critic in the loop", _eval_arguments),
        Command("rollout", "collect trajectories with rollout workers on Ray", _rollout_arguments),
    )
}
"""The commands both command lines have, by name (``launchers/<name>.py`` is the driver)."""


def _resolving(handler: Handler) -> Callable[[argparse.Namespace], int]:
    """``handler`` given the configuration resolved from the arguments (``args.func``)."""

    def handle(args: argparse.Namespace) -> int:
        return handler(args, config_from_args(args))

    return handle


def register(subparsers: argparse._SubParsersAction, name: str, handler: Handler) -> None:
    """Add the command ``name`` to the ``cast-rl`` parser, ``handler`` in ``args.func``."""
    command = COMMANDS[name]
    parser = subparsers.add_parser(name, help=command.help, description=command.help)
    command.add_arguments(parser)
    parser.set_defaults(func=_resolving(handler))


def setup_logging(level: str | None = None) -> None:
    """The console log handler of both command lines: ``level`` (INFO unless given) until the
    configuration is resolved, which sets the root level from ``logging.level``."""
    logging.basicConfig(level=(level or "INFO").upper(), format=LOG_FORMAT)


def run_command(args: argparse.Namespace) -> int:
    """Run ``args.func``; a :class:`ConfigError` is its one line on stderr and exit status 2."""
    try:
        return int(args.func(args) or 0)
    except ConfigError as exc:
        print(str(exc), file=sys.stderr)
        return 2


def main(name: str, handler: Handler, argv: list[str] | None = None, description: str | None = None) -> int:
    """``python -m launchers.<name> [argv]``, ``handler`` its ``command``: the same as
    ``cast-rl <name> [argv]``."""
    command = COMMANDS[name]
    parser = argparse.ArgumentParser(
        prog=f"python -m launchers.{name}",
        description=description or command.help,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    command.add_arguments(parser)
    parser.set_defaults(func=_resolving(handler))
    args = parser.parse_args(argv)
    setup_logging()
    return run_command(args)
