"""The metrics logger writes an offline W&B run that reads back with what was logged."""

from __future__ import annotations

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
