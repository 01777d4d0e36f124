"""Issue 7's check through the command itself: ``cast-rl metrics passk --results R.jsonl`` agrees
with the formula on random result tables, including tasks whose every trial failed or passed.

``tests/eval/test_passk.py`` checks the library function on random tables and the command on one
hand-worked table; here the command reads random files (lines shuffled, task ids of mixed kinds,
rewards on both sides of the success bound) and its printed JSON is compared with the formula
written out in the test: pass^k = mean over tasks of C(c, k) / C(n, k), c successes of n trials,
a trial succeeding when its reward is within 1e-6 of 1.

Run: .venv/bin/python -m pytest tests/resolved/test_resolved_passk_cli.py -q
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from math import comb
from pathlib import Path

import pytest

from cast_rl.cli import main as cli

CAST_RL = Path(sys.executable).with_name("cast-rl")
# Rewards around the bound: 1 - 1e-7 and 1 + 1e-7 succeed, 1 - 1e-5 and 0.5 do not.
SUCCESS, FAILURE = [1.0, 1.0 - 1e-7, 1.0 + 1e-7], [0.0, 0.5, 1.0 - 1e-5]


def _table(rng: random.Random) -> tuple[list[dict], dict[str, float]]:
    """Result lines of a random table and the pass^k the formula gives for it."""
    n = rng.randint(1, 6)
    successes = [rng.randint(0, n) for _ in range(rng.randint(1, 9))] + [0, n]  # every one failed / passed
    lines = []
    for task, c in enumerate(successes):
        task_id = task if task % 2 else f"task-{task}"
        outcomes = [True] * c + [False] * (n - c)
        rng.shuffle(outcomes)
        lines += [{"task_id": task_id, "trial": trial, "reward": rng.choice(SUCCESS if ok else FAILURE)}
                  for trial, ok in enumerate(outcomes)]
    rng.shuffle(lines)
    expected = {f"pass^{k}": sum(comb(c, k) / comb(n, k) for c in successes) / len(successes) for k in range(1, n + 1)}
    return lines, expected


def _write(path: Path, lines: list[dict]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


@pytest.mark.parametrize("seed", range(25))
def test_command_agrees_with_the_formula_on_random_tables(
    seed: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines, expected = _table(random.Random(seed))
    assert cli(["metrics", "passk", "--results", str(_write(tmp_path / "r.jsonl", lines))]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert list(printed) == list(expected)  # pass^1 .. pass^n, in order
    assert printed == pytest.approx(expected, abs=1e-12)


def test_console_script_prints_one_json_object(tmp_path: Path) -> None:
    # two tasks that always pass, one that never does: pass^k is 2/3 for every k
    lines = [{"task_id": t, "trial": i, "reward": float(t != 2)} for t in range(3) for i in range(4)]
    path = _write(tmp_path / "r.jsonl", lines)
    done = subprocess.run([str(CAST_RL), "metrics", "passk", "--results", str(path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    (line,) = done.stdout.strip().splitlines()
    assert json.loads(line) == pytest.approx({f"pass^{k}": 2 / 3 for k in range(1, 5)})
