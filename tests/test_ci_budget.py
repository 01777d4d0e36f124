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


def test_the_slow_suite_starts_its_longest_files_first() -> None:
    """Under --dist loadfile a long file started last runs alone at the end (the 4B rehearsal did,
    505 s, 2026-12-07): the files tests/conftest.py names start first, in its order, whatever
    pytest-randomly's seed, and `make test-slow` keeps that order (--no-loadscope-reorder)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_root_conftest", REPO / "tests" / "conftest.py")
    conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conftest)
    LONGEST_FIRST = conftest.LONGEST_FIRST  # noqa: N806

    assert all((REPO / path).is_file() for path in LONGEST_FIRST), "a renamed file drops out of the order"
    dry = subprocess.run(["make", "-n", "-o", "setup", "-o", ".venv/.cast_rl-installed", "test-slow"],
                         cwd=REPO, capture_output=True, text=True, timeout=60, check=True).stdout
    assert " --no-loadscope-reorder" in dry, dry
    other = "tests/eval/test_eval_e2e.py"  # a slow file not in the list, given first, then the list reversed
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "slow and not rehearse", other,
         *reversed(LONGEST_FIRST), "-p", "randomly", "--randomly-seed=7", "-p", "no:cacheprovider"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    files = list(dict.fromkeys(line.split("::", 1)[0] for line in out.stdout.splitlines() if "::" in line))
    assert files == [*LONGEST_FIRST, other], files


def test_ci_runs_the_e2e_quickstart_alone_and_in_its_own_process() -> None:
    """`.ci/run` runs the e2e quickstart first and on its own, then the other slow tests: beside
    them its learner's two torch threads fell to a fifth of their tokens per second (2026-12-07).
    The quickstart itself runs as `make quickstart` does, in its own process: `make test-slow`
    runs that file's other slow tests in the same test process on ``ray_local``'s 2-CPU Ray,
    which an in-process pipeline would join (and fail its own resource check, 4 CPUs)."""
    import importlib.util
    import inspect
    import shlex

    ci = (REPO / ".ci" / "run").read_text()
    runs = [line.strip() for line in ci.splitlines() if line.strip().startswith("slow \"")]
    markers = [shlex.split(shlex.split(run)[1])[1] for run in runs]
    assert markers == ["e2e", "slow and not e2e and not rehearse"], markers
    spec = importlib.util.spec_from_file_location("_quickstart_tests", REPO / "tests" / "test_quickstart_pipeline.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fixture = inspect.getsource(module.quickstart)
    assert "subprocess.run" in fixture and '"cast-rl"' in fixture and "run_pipeline" not in fixture, fixture
