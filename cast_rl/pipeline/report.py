"""The pipeline's final report: pass^k before and after training, each configuration side by side.

It merges the ``eval_before`` and ``eval_after`` reports (schema of :mod:`cast_rl.eval.report`)
into one report whose configurations are labelled ``before: ...`` and ``after: ...``, written with
the same writer (``report.json``, ``summary.md``, pass^k-against-k plots) under
``<run_dir>/report/``, plus a short ``headline`` for the console.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def merge_reports(before: dict[str, Any] | None, after: dict[str, Any] | None) -> dict[str, Any]:
    merged: dict[str, Any] = {"schema_version": 1, "configurations": []}
    for tag, report in (("before", before), ("after", after)):
        if report is None:
            continue
        merged["success"] = report["success"]
        for config in report["configurations"]:
            merged["configurations"].append(
                {**config, "name": f"{tag}_{config['name']}", "label": f"{tag}: {config['label']}",
                 "stage": tag}
            )
    return merged


def headline(report: dict[str, Any]) -> list[str]:
    """One line per configuration and domain/split: pass^1..pass^n."""
    lines = []
    for config in report["configurations"]:
        for group, values in config["groups"].items():
            cells = "  ".join(f"{k}={v:.3f}" for k, v in values["pass^k"].items())
            lines.append(f"{config['label']:<24} {group:<14} {cells}")
    return lines


def write_pipeline_report(run_dir: Path, before: Path | None, after: Path | None) -> dict[str, Path]:
    from cast_rl.eval.report import write_report

    load = lambda p: json.loads(p.read_text()) if p is not None and p.exists() else None  # noqa: E731
    merged = merge_reports(load(before), load(after))
    return write_report(merged, run_dir / "report")
