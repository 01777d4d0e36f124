"""The pipeline's final report: paired differences before/after and with/without the critic,
and the trajectory viewer it writes and links from summary.md."""

from __future__ import annotations

import json
import re
import shutil
import sys
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from viewer_helpers import make_pipeline_run  # noqa: E402


@pytest.fixture(scope="module")
def pipeline_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    return make_pipeline_run(tmp_path_factory.mktemp("report"))


def test_pipeline_report_links_viewer_and_compares(pipeline_run: tuple[Path, int], tmp_path: Path) -> None:
    from cast_rl.pipeline.report import headline, write_pipeline_report

    run, _ = pipeline_run
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    paths = write_pipeline_report(copy, {"eval_before": copy / "01_eval_before" / "report.json",
                                         "eval_after": copy / "08_eval_after" / "report.json"})
    assert paths["viewer"] == copy / "report" / "viewer" / "index.html" and paths["viewer"].is_file()
    summary = paths["summary"].read_text()
    assert "[viewer/index.html](viewer/index.html)" in summary
    report = json.loads(paths["report"].read_text())
    kinds = Counter(c["kind"] for c in report["comparisons"])
    assert kinds == {"after - before": 2, "with - without critic": 2}
    after_before = next(c for c in report["comparisons"] if c["a"] == "after_no_critic")
    # before, no critic: every task fails one of its two trials (pass^1 0.5); after: none fails
    assert after_before["pass^k"]["pass^1"]["difference"] == pytest.approx(0.5)
    assert "## Paired differences" in summary and "after: no critic - before: no critic" in summary
    lines = headline(report)
    passk_lines = [line for line in lines if "critic in the loop" not in line and not line.startswith("after - before")]
    assert len(passk_lines) == 4 and all(re.search(r"pass\^1=\d\.\d{3} \[\d\.\d\d,\d\.\d\d\]", line)
                                         for line in passk_lines)
    assert sum("critic in the loop: correction=" in line for line in lines) == 2  # before and after, B=1
    (paired,) = [line for line in lines if line.startswith("after - before") and "no critic" in line]
    assert "pass^1=+0.500 [" in paired
