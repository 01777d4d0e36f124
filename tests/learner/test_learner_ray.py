"""The learner on Ray: 2 FSDP workers over gloo equal one process; weights through the object
store; the replay-buffer actor; the weight-broadcast group; GRPO learning on the full Ray path."""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray
import torch

from cast_rl.config.schema import ScheduleConfig
from cast_rl.inference.weight_sync import state_checksum
from cast_rl.learner.engine import LearnerEngine
from cast_rl.learner.sample import Sample

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ray_cluster(ray_local) -> Iterator[None]:  # noqa: ANN001
    """The session's local Ray (one per session: other test modules share it)."""
    yield


def _batch(seed: int) -> list[Sample]:
    from test_learner_engine import make_batch

    return make_batch(12, seed=seed, supervised=3)


def test_two_gloo_workers_equal_one_process_and_publish_weights(ray_cluster: None, make_cfg, tmp_path: Path) -> None:
    from actors.learner import LearnerGroup
    from launchers.train import HFCollectorClient

    common = ("learner.micro_batch_size=2", "learner.global_batch_size=16", "algorithm.kl_coef=0.05",
              "algorithm.old_logprobs=rollout", "learner.lr=1e-2", "learner.num_cpus_per_worker=0.5")
    group = LearnerGroup(make_cfg(*common, "learner.num_workers=2"))
    single = LearnerEngine(make_cfg(*common, "learner.num_workers=1"))
    try:
        # a linear decay over the three steps on every rank: 1e-2 x (3 - t) / 3
        for learner in (group, single):
            learner.set_schedule(ScheduleConfig(name="linear"), 1e-2, 3)
        for step in range(3):
            batch = _batch(step)
            dp, one = group.train_step(batch), single.train_step(batch)
            for key in ("loss", "pg_loss", "kl", "supervised_loss", "grad_norm", "tokens", "pg_clipfrac"):
                assert dp[key] == pytest.approx(one[key], rel=1e-5, abs=1e-6), (step, key)
            assert dp["lr"] == pytest.approx(1e-2 * (3 - step) / 3) == one["lr"]
        version, ref, checksum = group.publish_weights()
        assert version == 3 == single.version
        dp_state, one_state = ray.get(ref), single.full_state_dict()
        assert max(float((dp_state[k] - one_state[k]).abs().max()) for k in one_state) < 1e-5
        assert state_checksum(dp_state) == checksum

        # one object in the store, many readers: other processes read it and see the checksum
        @ray.remote(num_cpus=0)
        def reader(state: dict) -> str:
            return state_checksum(state)

        assert ray.get([reader.remote(ref) for _ in range(3)]) == [checksum] * 3
        collector = HFCollectorClient(str(single.model_path), num_cpus=0)
        assert collector.update_weights(version, ref, checksum) == version
        with pytest.raises(Exception, match="checksum"):
            collector.update_weights(version + 1, ref, "bad")
        out = group.save_hf(tmp_path / "hf")
        assert (out / "config.json").exists() and (out / "tokenizer.json").exists()

        # the GPU path's group broadcast, here over gloo: an engine receives the same weights
        (addr, port), joined = group.init_weight_broadcast(world_size=2)
        engine = Receiver.remote()
        ray.get([joined, engine.join.remote(addr, port, 1, 2)])
        meta, sent, received = group.broadcast_weights(lambda m: [engine.receive.remote(m)])
        assert meta.version == version and received == [sent]  # both ends agree on every bucket
        # the same bytes as the object-store path, for every parameter (a tied lm_head is not resent)
        assert set(meta.names) <= set(dp_state) and len(meta.names) >= len(dp_state) - 1
        assert ray.get(engine.checksum.remote()) == state_checksum({k: dp_state[k] for k in meta.names})
    finally:
        group.shutdown()


@ray.remote(num_cpus=0)
class Receiver:
    """A stand-in rollout engine on the receiving end of the weight-broadcast group."""

    def join(self, addr: str, port: int, rank: int, world_size: int) -> None:
        from cast_rl.learner.nccl_sync import WeightReceiver, weight_sync_group

        self.receiver = WeightReceiver(weight_sync_group(addr, port, rank, world_size, "gloo"), torch.device("cpu"))

    def receive(self, meta: object) -> str:
        self.state = self.receiver.receive(meta)
        return self.receiver.fingerprint

    def checksum(self) -> str:
        return state_checksum(self.state)


def test_replay_buffer_actor_serves_blocking_draws_while_adding(ray_cluster: None, tmp_path: Path) -> None:
    from actors.replay_buffer import ReplayBufferClient
    from cast_rl.config.schema import ReplayBufferConfig

    buf = ReplayBufferClient(ReplayBufferConfig(), tmp_path / "log.jsonl", batch_size=2)
    draw = buf.handle.sample.remote(2, 0, 60)  # blocks inside the actor until two samples exist
    s = [Sample(k, "outcome_groups", [1, 2], [0, 1], [0.0, -1.0]) for k in "abc"]
    assert buf.add(s[:1]).accepted == 1
    assert buf.add(s[:2]).duplicates == 1  # a retried add
    assert [x.key for x in ray.get(draw)] == ["a", "b"]
    assert buf.snapshot()["consumed"] == 2 and buf.cursor() == 1


def test_a_drawn_batch_goes_from_the_buffer_actor_to_the_ranks_not_through_the_driver(
    ray_cluster: None, make_cfg, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from actors.learner import LearnerGroup
    from actors.replay_buffer import ReplayBufferClient
    from cast_rl.learner.loop import TrainLoop, batch_metrics

    common = ("learner.micro_batch_size=2", "learner.global_batch_size=12", "algorithm.old_logprobs=rollout",
              "learner.lr=1e-2", "learner.num_cpus_per_worker=0.5")
    cfg = make_cfg(*common, "learner.num_workers=2")
    group, single = LearnerGroup(cfg), LearnerEngine(make_cfg(*common, "learner.num_workers=1"))
    buf = ReplayBufferClient(cfg.replay, tmp_path / "log.jsonl", batch_size=12)
    # the train loop must not fetch the batch into the driver
    monkeypatch.setattr(ReplayBufferClient, "sample", lambda *a, **k: pytest.fail("batch fetched by the driver"))
    try:
        batch = _batch(0)
        assert buf.add(batch).accepted == 12
        loop = TrainLoop(cfg, None, group, buf, tasks=[0], split="toy")  # type: ignore[arg-type]
        out = loop.update()
        one = single.train_step(batch)
        for key in ("loss", "pg_loss", "supervised_loss", "grad_norm"):
            assert out[f"train/{key}"] == pytest.approx(one[key], rel=1e-5, abs=1e-6), key
        expected = batch_metrics(batch, 0)  # computed where the batch is (the buffer actor)
        assert {k: out[k] for k in expected} == pytest.approx(expected)
        assert group.version == 1 and buf.cursor() == 1
        # the shards themselves are object references the ranks resolve
        assert buf.add(_batch(1)).accepted == 12
        metrics, shards = buf.draw(12, 1, group.world_size)
        assert len(shards) == 2 and all(isinstance(r, ray.ObjectRef) for r in shards)
        assert metrics["train/samples"] == 12 and sum(len(part) for part in ray.get(shards)) == 12
    finally:
        group.shutdown()


def test_weight_broadcast_group_over_gloo(ray_cluster: None) -> None:
    """The NCCL sync path's logic, run on its gloo backend: metadata, order, checksum, versions."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]

    @ray.remote(num_cpus=0)
    def endpoint(rank: int) -> str:
        from cast_rl.learner.nccl_sync import (
            WeightBroadcaster,
            WeightReceiver,
            plan_for,
            weight_sync_group,
        )

        state = {"a.weight": torch.arange(6.0).reshape(2, 3), "b.bias": torch.ones(4, dtype=torch.bfloat16)}
        group = weight_sync_group("127.0.0.1", port, rank, 2, "gloo", timeout_s=60)
        meta = plan_for(1, state, bucket_bytes=1 << 20)
        if rank == 0:
            return WeightBroadcaster(group, torch.device("cpu")).send(meta, state)
        receiver = WeightReceiver(group, torch.device("cpu"))
        got = receiver.receive(meta)
        assert torch.equal(got["a.weight"], state["a.weight"]) and got["b.bias"].dtype == torch.bfloat16
        assert state_checksum(got) == state_checksum(state)
        return receiver.fingerprint

    sent, received = ray.get([endpoint.remote(0), endpoint.remote(1)], timeout=120)
    assert sent == received


@pytest.mark.gpu
def test_weight_broadcast_over_nccl() -> None:
    """Learner rank 0 on GPU 0 broadcasts to an engine on GPU 1 (needs 2 GPUs)."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA GPUs")
    import torch.multiprocessing as mp

    mp.spawn(_nccl_endpoint, args=(29517,), nprocs=2, join=True)


def _nccl_endpoint(rank: int, port: int) -> None:
    from cast_rl.learner.nccl_sync import (
        WeightBroadcaster,
        WeightReceiver,
        plan_for,
        weight_sync_group,
    )

    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    state = {"w": torch.randn(1024, 1024, generator=torch.Generator().manual_seed(0)).to(device)}
    group = weight_sync_group("127.0.0.1", port, rank, 2, "nccl", timeout_s=120)
    meta = plan_for(1, state, bucket_bytes=1 << 20, dtype=torch.bfloat16, checksum_kind="isum")
    if rank == 0:
        WeightBroadcaster(group, device).send(meta, state)
    else:
        got = WeightReceiver(group, device).receive(meta)
        assert got["w"].device == device and torch.equal(got["w"], state["w"].bfloat16())


@pytest.mark.slow
def test_grpo_learns_on_the_ray_path(ray_cluster: None, make_cfg) -> None:
    """Replay-buffer actor, 2 FSDP learner workers, weights through the object store to a
    transformers sampler actor: the toy reward rises to >= 0.9."""
    from actors.learner import LearnerGroup
    from actors.replay_buffer import ReplayBufferClient
    from cast_rl.learner.loop import TrainLoop
    from launchers.train import HFCollectorClient

    cfg = make_cfg("learner.num_workers=2", "learner.num_cpus_per_worker=0.5", "learner.lr=1e-2",
                   "learner.micro_batch_size=16", "learner.global_batch_size=64",
                   "rollout.trials_per_task=8", "algorithm.steps=14")
    learner = LearnerGroup(cfg)
    collector = HFCollectorClient(cfg.policy.path, seed=cfg.seed, num_cpus=0.5)
    buffer = ReplayBufferClient(cfg.replay, Path(cfg.run_dir) / "replay" / "log.jsonl", 64)
    try:
        history = TrainLoop(cfg, collector, learner, buffer, list(range(16)), split="toy").run()
    finally:
        learner.shutdown()
    rewards = [round(h["train/reward_mean"], 3) for h in history]
    print("ray path reward per step:", rewards)
    assert rewards[0] < 0.3 and statistics.fmean(rewards[-2:]) >= 0.9, rewards
