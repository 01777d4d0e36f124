"""CI's 90-minute budget holds however the slow suite grows: `.ci/run` sets
``CAST_RL_CI_DEADLINE`` and ``tests/conftest.py`` skips a slow test that would start too close to
it (the reason names the time left); fast tests always run."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _run(deadline: float, node: str, marker: str, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CAST_RL_CI_DEADLINE": str(int(deadline))}
    return subprocess.run(
        [sys.executable, "-m", "pytest", node, "-m", marker, "-rs", "-q", "-p", "no:randomly", "-p", "no:cacheprovider",
         *extra],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )


def test_a_slow_test_near_the_deadline_is_skipped_with_the_time_left() -> None:
    out = _run(time.time() + 60, "tests/bench/test_benches.py::test_weight_sync", "slow")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1 skipped" in out.stdout and "CI time budget" in out.stdout, out.stdout


def test_the_deadline_holds_in_the_test_processes_make_starts() -> None:
    """``make test`` and ``make test-slow`` run the tests in two pytest-xdist processes (docs/testing.md:
    the suites' time on 2 cores); the skip near the deadline happens in those processes too."""
    out = _run(time.time() + 60, "tests/bench/test_benches.py::test_weight_sync", "slow", "-n", "2",
               "--dist", "loadfile")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1 skipped" in out.stdout and "CI time budget" in out.stdout, out.stdout


def test_make_runs_both_suites_in_two_processes_by_default() -> None:
    """What took CI under its hour (docs/testing.md): a Makefile edit that drops the workers fails here."""
    dry = subprocess.run(["make", "-n", "-o", "setup", "-o", ".venv/.cast_rl-installed", "test", "test-slow"],
                         cwd=REPO, capture_output=True, text=True, timeout=60, check=True).stdout
    suites = [line for line in dry.splitlines() if " -m pytest " in line]
    assert len(suites) == 2, dry
    for line in suites:
        assert " -n 2 --dist loadfile" in line, line
    fewer = subprocess.run(["make", "-n", "-o", "setup", "-o", ".venv/.cast_rl-installed", "test", "TEST_WORKERS=0"],
                           cwd=REPO, capture_output=True, text=True, timeout=60, check=True).stdout
    assert " -n 0 --dist loadfile" in fewer, fewer


def test_fast_tests_ignore_the_deadline() -> None:
    out = _run(time.time() - 10, "tests/test_docs.py", "not slow")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "passed" in out.stdout and "CI time budget" not in out.stdout, out.stdout


def test_a_test_with_its_own_reserve_is_skipped_where_the_usual_reserve_would_start_it() -> None:
    """The 4B rehearsal's ``ci_reserve`` (900 s) outweighs the usual reserve (420 s): with 600 s
    left it does not start, and the reason names its own need."""
    node = "tests/test_paper_rehearsal.py::test_layout_rehearses_every_stage_and_four_domains[qwen3_4b_1x8gpu]"
    out = _run(time.time() + 600, node, "slow")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1 skipped" in out.stdout and "needs up to 900 s" in out.stdout, out.stdout
