"""The metrics logger writes an offline W&B run that reads back with what was logged."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cast_rl.config.schema import LoggingConfig
from cast_rl.telemetry import MetricsLogger, read_offline_history


def test_offline_run_reads_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    cfg = LoggingConfig(project="cast_rl_test", group="g", run_name="metrics-test")
    with MetricsLogger(cfg, tmp_path, config={"learner": {"lr": 0.1}}) as metrics:
        metrics.log({"train/loss": 1.5, "rollout/reward_mean": 0.25}, step=0)
        metrics.log({"train/loss": 0.75}, step=1)
        run_path = metrics.run_path
    assert run_path is not None and run_path.name.startswith("offline-run-")
    assert run_path.parent == tmp_path / "wandb"
    rows = read_offline_history(run_path)
    assert [r["train/loss"] for r in rows] == [1.5, 0.75]
    assert rows[0]["rollout/reward_mean"] == 0.25
    assert [r["_step"] for r in rows] == [0, 1]


def test_metric_names_must_be_namespaced(tmp_path: Path) -> None:
    with MetricsLogger(LoggingConfig(mode="disabled"), tmp_path) as metrics:
        with pytest.raises(ValueError, match="must start with one of rollout, critic, train"):
            metrics.log({"loss": 1.0})


_FIRST_RUN = """
import sys
from pathlib import Path
from cast_rl.config.schema import LoggingConfig
from cast_rl.telemetry import MetricsLogger, read_offline_history
with MetricsLogger(LoggingConfig(project="p", run_name="first"), Path(sys.argv[1])) as metrics:
    metrics.log({"train/loss": 1.5}, step=0)
    run_path = metrics.run_path
print([row["train/loss"] for row in read_offline_history(run_path, timeout=0.0)])
"""


def test_first_run_of_a_process_is_on_disk_when_finish_returns(tmp_path: Path) -> None:
    # wandb-core used to leave only the file's header on disk for the first run of a process
    # when finish() returned (CI read back [] once); finish() now waits for the exit record.
    env = {**os.environ, "WANDB_MODE": "offline", "PYTHONPATH": str(Path(__file__).parents[1])}
    out = subprocess.run(
        [sys.executable, "-c", _FIRST_RUN, str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert out.stdout.strip().splitlines()[-1] == "[1.5]"


def test_unfinished_log_is_waited_for_then_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    with MetricsLogger(LoggingConfig(project="p", run_name="whole"), tmp_path / "a") as metrics:
        metrics.log({"train/loss": 1.5}, step=0)
        run_path = metrics.run_path
    (log,) = run_path.glob("*.wandb")
    raw = log.read_bytes()
    for cut in (7, len(raw) // 2, len(raw) - 3):  # header only, mid-log, inside the exit record
        (tmp_path / "cut").mkdir(exist_ok=True)
        (tmp_path / "cut" / log.name).write_bytes(raw[:cut])
        with pytest.raises(TimeoutError, match="no exit record"):
            read_offline_history(tmp_path / "cut", timeout=0.1)
    assert [row["train/loss"] for row in read_offline_history(run_path, timeout=0.0)] == [1.5]
