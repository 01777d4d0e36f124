"""``cast-rl plan CONFIG [key=value ...] [--gpu-gib 80] [--markdown]``: the GPU memory each actor
of a configuration needs, estimated from its model sizes (:mod:`cast_rl.config.memory`).

Prints one table, GiB per GPU; exits 1 when an actor's estimate does not fit (``NO``), naming it.
"""

from __future__ import annotations

import argparse
import sys

from cast_rl.config.args import add_config_arguments, config_from_args


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("plan", help="GPU memory per actor, estimated from the model sizes")
    add_config_arguments(parser)
    parser.add_argument("--gpu-gib", type=float, default=80.0, help="memory of one GPU in GiB (default 80)")
    parser.add_argument("--markdown", action="store_true",
                        help="a Markdown table with the layout's GPU counts, as docs/reproduce.md shows it")
    parser.set_defaults(func=_plan)


def _plan(args: argparse.Namespace) -> int:
    from cast_rl.config.memory import layout_markdown, not_fitting, plan, plan_text

    cfg = config_from_args(args)
    try:
        rows = plan(cfg, args.gpu_gib)
    except ValueError as exc:  # a model whose size is known nowhere
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(layout_markdown(cfg, args.gpu_gib) if args.markdown else plan_text(rows), end="")
    short = [line for line in not_fitting(rows) if line.endswith(": NO")]
    if short:
        print(f"does not fit on {args.gpu_gib:g} GiB GPUs: {'; '.join(short)}", file=sys.stderr)
    return 1 if short else 0
