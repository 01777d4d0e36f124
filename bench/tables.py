"""The results tables of docs/benches.md, generated from the bench output files in bench/results/.

A bench's figures reach the manual as the JSON object the script printed last, saved with the
command that produced it, the date and the machine; the tables are rendered from those files, never
edited by hand::

    python bench/tables.py record weight_sync weight_sync            # runs bench/weight_sync.py
    python bench/tables.py record async_overlap_hf async_overlap -- --engine hf
    python bench/tables.py render                                    # rewrites docs/benches.md's tables
    python bench/tables.py render --check                            # exit 1 when they are stale

``record NAME SCRIPT [-- ARGS]`` runs ``bench/SCRIPT.py ARGS`` and writes
``bench/results/NAME.json``: ``{"command", "date", "machine", "result"}``.  In docs/benches.md a
generated table sits between ``<!-- table:TEMPLATE -->`` and ``<!-- /table -->``; it is
``bench/templates/TEMPLATE.md.j2`` (Jinja2) rendered with ``results`` (every file of
bench/results/ by name).  ``tests/bench/test_tables.py`` checks that the manual is what the files
give.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
from datetime import date
from pathlib import Path
from typing import Any

import jinja2

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
TEMPLATES = REPO / "bench" / "templates"
DOC = REPO / "docs" / "benches.md"
TABLE = re.compile(r"(<!-- table:([a-z0-9_]+) -->\n)(.*?)(<!-- /table -->)", re.S)


def load_results(root: Path = RESULTS) -> dict[str, dict[str, Any]]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(root.glob("*.json"))}


def render(text: str, results: dict[str, dict[str, Any]], templates: Path = TEMPLATES) -> str:
    """``text`` with every generated table rendered again from ``results``."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(templates), undefined=jinja2.StrictUndefined,
                             keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True)

    def table(match: re.Match[str]) -> str:
        body = env.get_template(f"{match[2]}.md.j2").render(results=results)
        return match[1] + body + match[4]

    return TABLE.sub(table, text)


def record(name: str, script: str, args: list[str]) -> Path:
    command = [sys.executable, f"bench/{script}.py", *args]
    proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"bench/{script}.py exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    result = json.loads(lines[-1])
    out = RESULTS / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    shown = ["python", f"bench/{script}.py", *args]
    out.write_text(json.dumps({"command": " ".join(shown), "date": date.today().isoformat(),
                               "machine": f"{platform.machine()}, {_cores()} cores", "result": result},
                              indent=2) + "\n")
    return out


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    rec = sub.add_parser("record", help="run a bench and save its JSON line under bench/results/")
    rec.add_argument("name")
    rec.add_argument("script")
    rec.add_argument("args", nargs=argparse.REMAINDER)
    ren = sub.add_parser("render", help="rewrite docs/benches.md's generated tables")
    ren.add_argument("--check", action="store_true", help="only say whether they are up to date (exit 1 if not)")
    args = parser.parse_args(argv)
    if args.what == "record":
        print(record(args.name, args.script, [a for a in args.args if a != "--"]))
        return 0
    text, results = DOC.read_text(), load_results()
    fresh = render(text, results)
    if args.check and fresh != text:
        print(f"{DOC.relative_to(REPO)}: generated tables differ from bench/results/ "
              "(run python bench/tables.py render)")
        return 1
    if not args.check:
        DOC.write_text(fresh)
    print(json.dumps({"tables": len(TABLE.findall(text)), "results": sorted(results)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
