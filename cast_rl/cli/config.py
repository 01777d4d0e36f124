"""``cast-rl config show [CONFIG] [key=value ...]``: print the resolved configuration."""

from __future__ import annotations

import argparse

from cast_rl.config.args import add_config_arguments, config_from_args


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("config", help="inspect configurations")
    sub = parser.add_subparsers(dest="config_command", required=True)
    show = sub.add_parser("show", help="print the resolved config (defaults < YAML < overrides)")
    add_config_arguments(show)
    show.set_defaults(func=_show)


def _show(args: argparse.Namespace) -> int:
    from cast_rl.config import to_yaml

    print(to_yaml(config_from_args(args)), end="")
    return 0
