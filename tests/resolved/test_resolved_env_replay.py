"""Issue 3's check through the command a person runs: ``cast-rl env replay`` replays the gold
actions of every task of every split of the four benchmark domains to reward 1.0.

The library-level replays (``tests/envs/test_{retail,airline,telecom,telehealth}.py``) step
:class:`ToolEnv` directly; this runs the CLI subcommand and reads its output file, so a change in
the command, its config surface or its output records breaks here.  ``env.now`` is the injectable
clock (telehealth's ``cancel_appointment`` stamps the time; without it a rerun differs).  No task
is listed as an exception: the source gives 1.0 on every one of them once the required outputs are
said, and the replay's reward is the database check alone (``cast_rl.envs.replay``).

Retail (635 tasks) is ``slow``: each record's ``final_state_hash`` hashes the whole database, about
0.1 s a task on a loaded 2-core machine (75 s in all); its test split also runs in the default suite through
``tests/envs/test_replay.py::test_gold_replay_of_the_test_split``.

Run: .venv/bin/python -m pytest tests/resolved/test_resolved_env_replay.py -q
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cast_rl.cli import main as cli
from cast_rl.config.schema import DOMAIN_NAMES

NOW = "2031-01-02T08:00:00"
CAST_RL = Path(sys.executable).with_name("cast-rl")


def _tasks(data_dir: Path) -> dict[str, list[dict]]:
    return {p.stem.removeprefix("tasks_"): json.loads(p.read_text()) for p in sorted(data_dir.glob("tasks_*.json"))}


def _replay(data_dir: Path, domain: str, split: str, out: Path) -> list[dict]:
    argv = ["env", "replay", f"env.domain={domain}", f"env.data_dir={data_dir}", f"env.split={split}",
            f"env.now={NOW}", "--out", str(out)]
    assert cli(argv) == 0
    return [json.loads(line) for line in out.read_text().splitlines()]


DOMAINS = [pytest.param(d, marks=pytest.mark.slow) if d == "retail" else d for d in DOMAIN_NAMES]


@pytest.mark.parametrize("domain", DOMAINS)
def test_gold_replay_of_every_split_earns_reward_one(benchmarks_dir: Path, tmp_path: Path, domain: str) -> None:
    data_dir = benchmarks_dir / domain
    splits = _tasks(data_dir)
    assert splits, f"no tasks_*.json in {data_dir}"
    for split, tasks in splits.items():
        records = _replay(data_dir, domain, split, tmp_path / f"{split}.jsonl")
        assert [(r["split"], r["task_index"]) for r in records] == [(split, i) for i in range(len(tasks))]
        failed = [(r["task_index"], r["reward"]) for r in records if r["reward"] != 1.0]
        assert not failed, f"{domain}/{split}: gold replay below 1.0 on {failed}"
        # one observation per gold action, up to and including a terminate tool (telehealth test 13
        # transfers mid-sequence and stops there)
        assert all(0 < len(r["observations"]) <= len(t["actions"]) or not t["actions"]
                   for r, t in zip(records, tasks, strict=True))
        if domain == "telehealth":  # the clock-dependent domain: the injected clock makes a rerun equal
            again = _replay(data_dir, domain, split, tmp_path / f"{split}-again.jsonl")
            assert [r["final_state_hash"] for r in again] == [r["final_state_hash"] for r in records]


def test_the_console_script_replays_and_reports_the_mean(benchmarks_dir: Path, tmp_path: Path) -> None:
    """The installed ``cast-rl`` entry point itself, on the smallest split that has a write."""
    out = tmp_path / "airline.jsonl"
    done = subprocess.run(
        [str(CAST_RL), "env", "replay", "env.domain=airline", f"env.data_dir={benchmarks_dir / 'airline'}",
         "env.split=test", "--out", str(out)],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"replayed 50 task(s) -> {out} (mean reward 1.000)"
    assert len(out.read_text().splitlines()) == 50
