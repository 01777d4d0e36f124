"""docs/benches.md's generated tables are what bench/results/ gives (``bench/tables.py``)."""

from __future__ import annotations

import copy
import importlib.util
import subprocess
import sys
from pathlib import Path

import jinja2
import pytest

REPO = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("bench_tables", REPO / "bench" / "tables.py")
tables = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tables)


def test_the_manual_holds_the_tables_the_recorded_runs_give() -> None:
    proc = subprocess.run([sys.executable, "bench/tables.py", "render", "--check"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = tables.DOC.read_text()
    assert len(tables.TABLE.findall(text)) >= 2
    for _, name, body, _ in tables.TABLE.findall(text):
        assert body.strip(), f"table {name} is empty: run python bench/tables.py render"


def test_a_changed_result_changes_its_table_and_a_missing_key_is_an_error() -> None:
    text, results = tables.DOC.read_text(), tables.load_results()
    assert {"weight_sync", "async_overlap_hf"} <= set(results)
    changed = copy.deepcopy(results)
    changed["weight_sync"]["result"]["sync_s"] = 123.456
    fresh = tables.render(text, changed)
    assert fresh != text and "123.46 s" in fresh
    assert tables.render(fresh, results) == text  # rendering again from the files restores it
    del changed["weight_sync"]["result"]["probe_s"]
    with pytest.raises(jinja2.UndefinedError):
        tables.render(text, changed)
