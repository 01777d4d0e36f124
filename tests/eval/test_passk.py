"""pass^k: the formula, tau-bench's success rule and display_metrics, the results-file CLI."""

from __future__ import annotations

import ast
import contextlib
import functools
import io
import itertools
import json
import math
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import upstream_sources
from hypothesis import given, settings
from hypothesis import strategies as st

from cast_rl.eval.passk import (
    ResultsFormatError,
    TrialResult,
    is_success,
    pass_hat_k,
    passk,
    passk_by_group,
    read_results,
)

# Rewards around the success boundary: 1 - 1e-6 and 1 + 1e-6 pass, 1 - 2e-6 does not.
REWARDS = [0.0, 1.0, 0.5, 1.0 - 1e-6, 1.0 + 1e-6, 1.0 - 2e-6, 1.0 - 1e-7]


def brute_force(tables: dict[int, list[float]], k: int) -> float:
    """Mean over tasks of the share of k-subsets of trials that all succeed (no formula)."""
    shares = []
    for rewards in tables.values():
        subsets = list(itertools.combinations(rewards, k))
        shares.append(sum(all(is_success(r) for r in s) for s in subsets) / len(subsets))
    return sum(shares) / len(shares)


@st.composite
def result_tables(draw: st.DrawFn) -> dict[int, list[float]]:
    n = draw(st.integers(1, 6))
    num_tasks = draw(st.integers(1, 8))
    row = st.lists(st.sampled_from(REWARDS), min_size=n, max_size=n)
    tables = {i: draw(row) for i in range(num_tasks)}
    if draw(st.booleans()):  # make sure the extremes turn up often
        tables[num_tasks] = [0.0] * n
        tables[num_tasks + 1] = [1.0] * n
    return tables


def test_success_rule_matches_tau_bench_bounds() -> None:
    assert is_success(1.0) and is_success(1.0 - 1e-6) and is_success(1.0 + 1e-6)
    assert not is_success(1.0 - 2e-6) and not is_success(0.999) and not is_success(0.0)
    assert not is_success(1.0 + 2e-6)


def test_hand_computed_example() -> None:
    # c = 2, 0, 3 successes of n = 3 trials
    tables = {"a": [1.0, 1.0, 0.0], "b": [0.0, 0.0, 0.3], "c": [1.0, 1.0, 1.0]}
    table = passk(tables)
    assert table[1] == pytest.approx((2 / 3 + 0 + 1) / 3)  # 5/9
    assert table[2] == pytest.approx((1 / 3 + 0 + 1) / 3)  # C(2,2)/C(3,2) = 1/3 -> 4/9
    assert table[3] == pytest.approx(1 / 3)
    assert passk(tables, [2]) == {2: pytest.approx(4 / 9)}


def test_all_failed_and_all_passed_tasks() -> None:
    assert passk({0: [0.0] * 4}) == {1: 0.0, 2: 0.0, 3: 0.0, 4: 0.0}
    assert passk({0: [1.0] * 4}) == {1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0}
    assert passk({0: [0.0] * 2, 1: [1.0] * 2}) == {1: 0.5, 2: 0.5}


@settings(max_examples=200, deadline=None)
@given(result_tables())
def test_formula_agrees_with_brute_force(tables: dict[int, list[float]]) -> None:
    n = len(next(iter(tables.values())))
    table = passk(tables)
    assert list(table) == list(range(1, n + 1))
    for k, value in table.items():
        assert value == pytest.approx(brute_force(tables, k), abs=1e-12)
        c = [sum(map(is_success, r)) for r in tables.values()]
        assert value == pytest.approx(sum(math.comb(ci, k) / math.comb(n, k) for ci in c) / len(c), abs=1e-12)
    # pass^k never rises with k
    values = list(table.values())
    assert all(a >= b - 1e-12 for a, b in zip(values, values[1:]))


@functools.cache
def _tau_bench_display_metrics():  # noqa: ANN202
    """tau-bench's own display_metrics, read from its git history (skips when absent)."""
    with tempfile.TemporaryDirectory() as tmp:
        root = upstream_sources.require(upstream_sources.TAU_BENCH_ENV, ("tau_bench/run.py",), Path(tmp))
        source = (root / "tau_bench" / "run.py").read_text()
    (node,) = [n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == "display_metrics"]
    namespace = {"comb": math.comb, "List": list, "EnvRunResult": object}
    exec(compile(ast.Module(body=[node], type_ignores=[]), "tau_bench/run.py", "exec"), namespace)
    return namespace["display_metrics"]


@settings(max_examples=50, deadline=None)
@given(result_tables())
def test_agrees_with_tau_bench_display_metrics(tables: dict[int, list[float]]) -> None:
    display_metrics = _tau_bench_display_metrics()
    results = [
        SimpleNamespace(task_id=task, trial=trial, reward=reward, info={}, traj=[])
        for task, rewards in tables.items()
        for trial, reward in enumerate(rewards)
    ]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        display_metrics(results)
    reference = {
        int(line.split("k=")[1].split(":")[0]): float(line.rsplit(":", 1)[1])
        for line in out.getvalue().splitlines()
        if line.strip().startswith("k=")
    }
    assert reference == pytest.approx(passk(tables), abs=1e-12)


def test_unequal_trial_counts_are_an_error_naming_the_task() -> None:
    with pytest.raises(ValueError, match=r"same number of trials.*n=3.*task 'short' has 2"):
        passk({"a": [1.0] * 3, "b": [0.0] * 3, "short": [1.0] * 2})


def test_k_outside_one_to_n_is_an_error() -> None:
    with pytest.raises(ValueError, match=r"k=3 is not allowed; with n=2"):
        passk({0: [1.0, 0.0]}, [3])
    with pytest.raises(ValueError, match=r"k=0"):
        passk({0: [1.0, 0.0]}, [0])
    with pytest.raises(ValueError):
        pass_hat_k(3, 2, 1)


def test_per_domain_and_split_and_duplicates() -> None:
    results = [
        TrialResult(0, 0, 1.0, "retail", "test"), TrialResult(0, 1, 0.0, "retail", "test"),
        TrialResult(0, 0, 1.0, "airline", "test"), TrialResult(0, 1, 1.0, "airline", "test"),
    ]
    assert passk_by_group(results) == {("retail", "test"): {1: 0.5, 2: 0.0}, ("airline", "test"): {1: 1.0, 2: 1.0}}
    with pytest.raises(ValueError, match="trial 1 of task 0 .retail/test. appears twice"):
        passk_by_group(results + [TrialResult(0, 1, 1.0, "retail", "test")])


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def test_cli_prints_one_json_object(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from cast_rl.cli import main

    rows = [(0, [1, 1, 0]), (1, [0, 0, 0]), (2, [1, 1, 1])]
    path = _write(tmp_path / "r.jsonl", [
        json.dumps({"task_id": task, "trial": trial, "reward": reward, "extra": "ignored"})
        for task, rewards in rows for trial, reward in enumerate(rewards)
    ])
    assert main(["metrics", "passk", "--results", str(path)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert list(out) == ["pass^1", "pass^2", "pass^3"]
    assert out == pytest.approx({"pass^1": 5 / 9, "pass^2": 4 / 9, "pass^3": 1 / 3})
    assert main(["metrics", "passk", "--results", str(path), "--k", "3", "1"]) == 0
    assert json.loads(capsys.readouterr().out) == pytest.approx({"pass^1": 5 / 9, "pass^3": 1 / 3})
    assert main(["metrics", "passk", "--results", str(path), "--k", "4"]) == 2
    assert "k=4 is not allowed" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("not json", "not a trial result"),
        ('[1, 2]', "expected a JSON object"),
        ('{"task_id": 1, "trial": 0}', "missing keys: reward"),
        ('{"task_id": 1, "trial": -1, "reward": 1}', "trial must be an integer >= 0"),
        ('{"task_id": 1, "trial": 0, "reward": "1"}', "reward must be a finite number"),
        ('{"task_id": 1.5, "trial": 0, "reward": 1}', "task_id must be an integer or a string"),
    ],
)
def test_malformed_line_names_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    path = _write(tmp_path / "r.jsonl", ['{"task_id": 0, "trial": 0, "reward": 1.0}', line])
    with pytest.raises(ResultsFormatError, match=rf"{path}:2: .*{message}"):
        read_results(path)


def test_duplicate_trial_names_both_lines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from cast_rl.cli import main

    path = _write(tmp_path / "r.jsonl", [
        '{"task_id": "a", "trial": 0, "reward": 1.0}',
        '{"task_id": "a", "trial": 1, "reward": 0.0}',
        "",
        '{"task_id": "a", "trial": 0, "reward": 0.0}',
    ])
    with pytest.raises(ResultsFormatError, match=rf"{path}:4: task_id='a' trial=0 repeats line 1"):
        read_results(path)
    assert main(["metrics", "passk", "--results", str(path)]) == 2
    assert f"{path}:4" in capsys.readouterr().err
