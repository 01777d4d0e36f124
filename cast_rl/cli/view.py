"""``cast-rl view RUN_OR_EVAL_DIR [--out DIR] [--config CONFIG]``: the trajectory viewer.

Writes a static site (``OUT/index.html``, one page per episode) for an evaluation directory, a
pipeline run directory or a directory with a ``trajectories.jsonl``; open ``index.html`` in a
browser, no server needed.  See :mod:`cast_rl.viewer.site`.
"""

from __future__ import annotations

import argparse
import sys


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("view", help="write a static HTML viewer of a run's trajectories")
    parser.add_argument("run_dir", metavar="RUN_OR_EVAL_DIR", help="pipeline run, eval output or collection directory")
    parser.add_argument("--out", default=None, help="output directory (default: RUN_OR_EVAL_DIR/viewer)")
    parser.add_argument(
        "--config", default=None,
        help="the run's config (YAML or config.json) when the directory has no config.json; "
             "used to find the data for final-database differences",
    )
    parser.set_defaults(func=_view)


def _view(args: argparse.Namespace) -> int:
    from cast_rl.viewer import build_viewer
    from cast_rl.viewer.sources import ViewerInputError

    try:
        index = build_viewer(args.run_dir, args.out, args.config)
    except (OSError, ViewerInputError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"viewer: {index}")
    return 0
