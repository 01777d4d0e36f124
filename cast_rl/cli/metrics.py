"""``cast-rl metrics passk --results R.jsonl [--k K ...]``: pass^k of a results file.

Prints one JSON object, ``{"pass^1": ..., "pass^2": ...}``, with every k up to the number of
trials per task unless ``--k`` names some.  The file format and the success rule are in
:mod:`cast_rl.eval.passk`.
"""

from __future__ import annotations

import argparse
import json
import sys


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("metrics", help="metrics of finished runs (pass^k)")
    sub = parser.add_subparsers(dest="metrics_command", required=True)
    passk = sub.add_parser("passk", help="pass^k of per-trial results (JSON Lines)")
    passk.add_argument("--results", required=True, help='JSON Lines of {"task_id", "trial", "reward"}')
    passk.add_argument("--k", type=int, nargs="+", default=None, help="k values (default: 1..n)")
    passk.set_defaults(func=_passk)


def _passk(args: argparse.Namespace) -> int:
    from cast_rl.eval.passk import as_keys, group_rewards, passk, read_results

    try:
        results = read_results(args.results)
        (tasks,) = group_rewards(results).values()  # results lines carry no domain or split
        table = passk(tasks, args.k)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(as_keys(table)))
    return 0
