"""The tables that say what is tested name tests that exist, with the markers they really carry.

``docs/resolved_checks.md`` (every check a resolved issue asked for, and the test that guards it)
and ``docs/reliability.md`` (issue 8's table of faults, bad inputs and secrets) name tests as
backticked node ids, ``tests/path.py::test_name``, optionally followed by ``(slow)``, ``(e2e)``,
``(gpu)`` or ``(partly slow)`` (some parametrizations are ``slow``).  A node id without one of
these runs in the default suite.  Renaming, deleting or re-marking a named test fails here until
the table says so, so a table cannot go on naming a guard that no longer runs.

Run: .venv/bin/python -m pytest tests/resolved/test_resolved_tables.py -q
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TABLES = ["docs/resolved_checks.md", "docs/reliability.md"]
NODE = re.compile(r"`(tests/[\w/]+\.py)(?:::([\w\[\]\-.,: ]+))?`(?: \((slow|e2e|gpu|partly slow)\))?")
MARKS = ("slow", "e2e", "gpu")


@functools.cache
def _markers(path: str) -> dict[str, tuple[set[str], bool]]:
    """Test function name -> (markers on it or its module, whether some parametrization is slow)."""
    tree = ast.parse((REPO / path).read_text())
    module: set[str] = set()
    assigned: dict[str, str] = {}  # module-level name -> its value's source (parametrize lists)
    for node in tree.body:
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    assigned[target.id] = ast.unparse(node.value)
            if any(getattr(t, "id", None) == "pytestmark" for t in node.targets):
                module |= {m for m in MARKS if f"mark.{m}" in ast.unparse(node.value)}
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test"):
            own, partly = set(module), False
            for decorator in node.decorator_list:
                text = ast.unparse(decorator)
                if text.startswith("pytest.mark.parametrize"):
                    names = {n.id for n in ast.walk(decorator) if isinstance(n, ast.Name)}
                    partly |= any("mark.slow" in t for t in (text, *(assigned.get(n, "") for n in names)))
                else:
                    own |= {m for m in MARKS if text.startswith(f"pytest.mark.{m}")}
            found[node.name] = (own, partly)
    return found


def _named(table: str) -> list[tuple[str, str | None, str | None]]:
    return [(m[1], m[2], m[3]) for m in NODE.finditer((REPO / table).read_text())]


@pytest.mark.parametrize("table", TABLES)
def test_every_test_a_table_names_exists_with_its_marker(table: str) -> None:
    named = _named(table)
    assert named, f"{table} names no test"
    wrong = []
    for path, node, note in named:
        if not (REPO / path).is_file():
            wrong.append(f"{path}: no such file")
            continue
        if node is None:
            continue
        name = node.split("::")[-1].split("[")[0]
        if name not in _markers(path):
            wrong.append(f"{path}::{name}: no such test")
            continue
        marks, partly = _markers(path)[name]
        expected = {"slow": {"slow"}, "e2e": {"slow", "e2e"}, "gpu": {"gpu"}}.get(note or "", set())
        if note == "partly slow":
            ok = partly and "slow" not in marks
        else:
            ok = expected <= marks and (note is not None or not marks) and (not partly or note == "slow")
        if not ok:
            wrong.append(f"{path}::{name}: written ({note or 'default'}), marked {sorted(marks) or 'default'}"
                         f"{' with slow parametrizations' if partly else ''}")
    assert not wrong, f"{table}:\n" + "\n".join(wrong)


def test_every_test_of_tests_resolved_is_in_the_table() -> None:
    """Each check written for this table is listed in it."""
    listed = {(p, n.split("[")[0]) for p, n, _ in _named("docs/resolved_checks.md") if n}
    here = Path(__file__).parent
    for path in sorted(here.glob("test_*.py")):
        rel = path.relative_to(REPO).as_posix()
        missing = [name for name in _markers(rel) if (rel, name) not in listed]
        assert not missing, f"docs/resolved_checks.md does not list {rel}::{missing}"
