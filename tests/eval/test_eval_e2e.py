"""``cast-rl eval`` end to end: a tiny policy in vLLM on a local Ray, without and with the critic."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cast_rl.records import read_trajectories


@pytest.mark.slow
def test_cast_rl_eval_tiny(ray_local, tiny_model_dir: Path, retail_data_dir: Path, tmp_path: Path, capsys) -> None:  # noqa: ANN001
    from cast_rl.cli import main
    from cast_rl.telemetry.metrics import read_offline_history

    out = tmp_path / "eval"
    overrides = [
        f"run_dir={tmp_path / 'run'}",
        f"policy.path={tiny_model_dir}",
        f"env.data_dir={retail_data_dir}",
        "env.split=test",
        "env.task_indices=[0,1]",
        "env.max_steps=2",
        "inference.max_new_tokens=16",
        "rollout.num_workers=1",
        "rollout.episodes_in_flight=4",
        "critic.backend=rule",
        "eval.trials=2",
        "eval.verification_budgets=[0,1]",
        "eval.sample_trajectories=2",
        "logging.mode=offline",
    ]
    assert main(["eval", "default", *overrides, "--out", str(out)]) == 0
    assert "| configuration | budget | pass^1 | pass^2 |" in capsys.readouterr().out

    units = {("test", t, i) for t in (0, 1) for i in (0, 1)}
    for name in ("no_critic", "critic_b1"):
        trajectories = read_trajectories(out / "trajectories" / f"{name}.jsonl")
        assert {(t.split, t.task_index, t.trial) for t in trajectories} == units
    assert not any(t.verification_rounds for t in read_trajectories(out / "trajectories" / "no_critic.jsonl"))

    report = json.loads((out / "report.json").read_text())
    configs = {c["name"]: c for c in report["configurations"]}
    assert list(configs) == ["no_critic", "critic_b1"]
    for c in configs.values():
        group = c["groups"]["retail/test"]
        assert (group["tasks"], group["n"]) == (2, 2)
        assert list(group["pass^k"]) == ["pass^1", "pass^2"]
        assert c["cost"]["policy_tokens"] > 0 and c["cost"]["wall_s"] > 0
    assert configs["no_critic"]["critic"]["critiques"] == 0
    # the rule critic was consulted on every well-formed proposal of the B=1 configuration
    b1 = read_trajectories(out / "trajectories" / "critic_b1.jsonl")
    proposals = sum(1 for t in b1 for m in t.messages if m["role"] == "assistant")
    if proposals > sum(t.malformed_calls for t in b1):
        assert configs["critic_b1"]["critic"]["critiques"] > 0
    assert sorted(p.name for p in (out / "plots").glob("*.png")) == [
        "passk_vs_budget_retail_test.png", "passk_vs_k_retail_test.png",
    ]

    (run,) = (tmp_path / "run" / "wandb").glob("offline-run-*")
    logged = {k: v for row in read_offline_history(run) for k, v in row.items()}
    assert logged["eval/critic_b1/retail/test/pass^2"] == configs["critic_b1"]["groups"]["retail/test"]["pass^k"]["pass^2"]
    assert logged["eval/samples/nrows"] == 4  # eval.sample_trajectories per configuration
