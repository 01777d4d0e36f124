"""Tests of ``cast-rl env replay`` (cast_rl/envs/replay.py) on the retail data.

Run: .venv/bin/python -m pytest tests/envs/test_replay.py -q
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from cast_rl.cli import main as cli
from cast_rl.envs.core import load_domain_data

NO_ACTION_TASK = 24  # retail test task without actions: its gold state is the pristine data
CANCEL = {
    "name": "cancel_pending_order",
    "kwargs": {"order_id": "#W5918442", "reason": "no longer needed"},
}
TRANSFER = {"name": "transfer_to_human_agents", "kwargs": {"summary": "x"}}


def _replay(benchmarks_dir: Path, out: Path, *extra: str) -> int:
    """``extra``: config overrides (``key=value``) and flags (``--actions-file F``)."""
    return cli(
        [
            "env",
            "replay",
            "env.domain=retail",
            f"env.data_dir={benchmarks_dir / 'retail'}",
            "env.split=test",
            *extra,
            "--out",
            str(out),
        ]
    )


def _read(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _pristine_hash(benchmarks_dir: Path) -> str:
    """sha256 of the sorted-key JSON of the data files, computed from the files alone."""
    db_dir = benchmarks_dir / "retail" / "db"
    state = {path.stem: json.loads(path.read_text()) for path in sorted(db_dir.glob("*.json"))}
    return hashlib.sha256(json.dumps(state, sort_keys=True).encode()).hexdigest()


def test_gold_replay_of_the_test_split(benchmarks_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "gold.jsonl"
    assert _replay(benchmarks_dir, out, "env.now=2024-05-15T15:00:00") == 0
    records = _read(out)
    tasks = json.loads((benchmarks_dir / "retail" / "tasks_test.json").read_text())
    assert [(r["split"], r["task_index"]) for r in records] == [("test", i) for i in range(115)]
    assert all(r["reward"] == 1.0 for r in records)  # outputs count as said
    assert [len(r["observations"]) for r in records] == [len(t["actions"]) for t in tasks]
    assert records[NO_ACTION_TASK]["final_state_hash"] == _pristine_hash(benchmarks_dir)
    assert records[46]["observations"].count("Error: order not found") == 2
    assert len({r["final_state_hash"] for r in records}) > 50


def test_given_actions_and_terminate_stops_the_replay(benchmarks_dir: Path, tmp_path: Path) -> None:
    actions = tmp_path / "actions.jsonl"
    lines = [
        {"split": "test", "task_index": NO_ACTION_TASK, "actions": []},
        {"task_index": NO_ACTION_TASK, "actions": [TRANSFER, CANCEL]},
        {"split": "test", "task_index": NO_ACTION_TASK, "actions": [CANCEL, TRANSFER, CANCEL]},
        {
            "split": "dev",
            "task_index": 0,
            "actions": [
                {"name": "get_user_details", "kwargs": ["oops"]},
                {"name": "nope"},
                {"name": "respond", "kwargs": {"content": "hi"}},
            ],
        },
    ]
    actions.write_text("\n".join(json.dumps(line) for line in lines) + "\n\n")
    out = tmp_path / "out.jsonl"
    assert _replay(benchmarks_dir, out, "--actions-file", str(actions)) == 0
    empty, transfer_first, cancel_first, dev = _read(out)
    pristine = _pristine_hash(benchmarks_dir)
    assert empty == {
        "split": "test",
        "task_index": NO_ACTION_TASK,
        "observations": [],
        "final_state_hash": pristine,
        "reward": 1.0,
    }
    assert transfer_first["observations"] == ["Transfer successful"]
    assert (transfer_first["final_state_hash"], transfer_first["reward"]) == (pristine, 1.0)
    assert len(cancel_first["observations"]) == 2
    assert json.loads(cancel_first["observations"][0])["status"] == "cancelled"
    assert cancel_first["final_state_hash"] != pristine and cancel_first["reward"] == 0.0
    assert dev["observations"] == [
        "Error: the tool arguments must be a JSON object, got list",
        "Unknown action nope",
        "",
    ]
    assert dev["reward"] == 0.0  # dev task 0 has gold writes that were not made


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "not valid JSON"),
        (
            '{"split": "test", "task_index": 115, "actions": []}',
            "task_index must be an integer in 0..114",
        ),
        (
            '{"split": "nope", "task_index": 0, "actions": []}',
            "unknown split 'nope'; available: dev, test, train",
        ),
        ('{"split": "test", "task_index": 0, "actions": [{"kwargs": {}}]}', "actions[0] must be"),
        ('{"split": "test", "task_index": 0}', "actions must be a list"),
        ("[1]", "expected an object"),
    ],
)
def test_malformed_line_names_file_and_line(
    benchmarks_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture, line: str, message: str
) -> None:
    actions = tmp_path / "actions.jsonl"
    actions.write_text('{"split": "test", "task_index": 0, "actions": []}\n' + line + "\n")
    assert _replay(benchmarks_dir, tmp_path / "out.jsonl", "--actions-file", str(actions)) == 2
    err = capsys.readouterr().err
    assert f"{actions}:2:" in err and message in err
    assert not (tmp_path / "out.jsonl").exists()


def test_bad_now_and_bad_split(
    benchmarks_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    assert _replay(benchmarks_dir, tmp_path / "o.jsonl", "env.now=yesterday") == 2
    assert "env.now='yesterday' is not allowed; give an ISO time" in capsys.readouterr().err
    assert _replay(benchmarks_dir, tmp_path / "o.jsonl", "env.split=holdout") == 2
    assert "available splits of retail: dev, test, train" in capsys.readouterr().err


def test_replay_uses_the_cached_domain_data(benchmarks_dir: Path, tmp_path: Path) -> None:
    data = load_domain_data("retail", benchmarks_dir / "retail")
    actions = tmp_path / "actions.jsonl"
    actions.write_text(json.dumps({"split": "test", "task_index": 3, "actions": []}) + "\n")
    assert _replay(benchmarks_dir, tmp_path / "o.jsonl", "--actions-file", str(actions)) == 0
    assert ("test", 3) in data._gold  # the gold replay was computed on the shared data
