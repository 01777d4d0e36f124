"""``cast-rl config show CONFIG [key=value ...]``: print the resolved configuration."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("config", help="inspect configurations")
    sub = parser.add_subparsers(dest="config_command", required=True)
    show = sub.add_parser("show", help="print the resolved config (defaults < YAML < overrides)")
    show.add_argument("config", help="YAML file, or 'default' for the built-in defaults")
    show.add_argument("overrides", nargs="*", help="dotted overrides such as learner.lr=1e-6")
    show.set_defaults(func=_show)


def _show(args: argparse.Namespace) -> int:
    from cast_rl.config import load_config, to_yaml

    path = None if args.config == "default" else args.config
    print(to_yaml(load_config(path, args.overrides)), end="")
    return 0
