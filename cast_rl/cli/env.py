"""``cast-rl env ...``: generate synthetic tasks and replay action sequences through a domain."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("env", help="environments: generate tasks, replay actions")
    sub = parser.add_subparsers(dest="env_command", required=True)

    gen = sub.add_parser("generate", help="write a procedural retail database and tasks")
    gen.add_argument("--domain", default="retail", choices=["retail"])
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--num-tasks", type=int, default=64)
    gen.add_argument("--out", required=True, help="output data directory")
    gen.set_defaults(func=_generate)

    rep = sub.add_parser("replay", help="replay gold or given actions; write observations, hash, reward")
    rep.add_argument("--domain", required=True, choices=["retail", "airline", "telecom", "telehealth"])
    rep.add_argument("--data-dir", required=True)
    rep.add_argument("--split", required=True)
    rep.add_argument("--actions-file", default=None, help='JSON Lines: {"split", "task_index", "actions"}')
    rep.add_argument("--now", default=None, help="ISO time the tools read as now (reproducible replays)")
    rep.add_argument("--out", required=True)
    rep.set_defaults(func=_replay)


def _generate(args: argparse.Namespace) -> int:
    from cast_rl.envs.generate import main

    return main(args)


def _replay(args: argparse.Namespace) -> int:
    from cast_rl.envs.replay import main

    return main(args)
