"""The bucket protocol of the collective weight sync, over gloo between two threads (no vLLM):
plan, dtype, checksums, a refused bucket sent again, an abandoned update that leaves no one hanging."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch

from cast_rl.inference import weight_sync
from cast_rl.inference.weight_sync import (
    WeightMeta,
    WeightReceiver,
    WeightSyncError,
    state_fingerprint,
)
from cast_rl.learner import nccl_sync
from cast_rl.learner.nccl_sync import WeightBroadcaster, plan_for, weight_sync_group


def _state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"embed.weight": torch.randn(40, 16, generator=g), "layer.bias": torch.randn(5, generator=g),
            "layer.weight": torch.randn(16, 16, generator=g), "steps": torch.arange(3)}


def _pair(meta: WeightMeta, state: dict, receive: Callable[[WeightReceiver], Any]) -> tuple[Any, Any]:
    """Run a sender (this thread) and a receiver (another thread) in one fresh gloo group."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out: dict[str, Any] = {}

    def receiver() -> None:
        try:
            r = WeightReceiver(weight_sync_group("127.0.0.1", port, 1, 2, "gloo", 30), torch.device("cpu"), 30)
            out["value"] = receive(r)
            out["receiver"] = r
        except Exception as exc:  # handed to the test thread
            out["error"] = exc

    thread = threading.Thread(target=receiver)
    thread.start()
    sender = WeightBroadcaster(weight_sync_group("127.0.0.1", port, 0, 2, "gloo", 30), torch.device("cpu"), 30)
    try:
        sent: Any = sender.send(meta, state)
    except WeightSyncError as exc:
        sent = exc
    thread.join(timeout=60)
    assert not thread.is_alive(), "receiver hung"
    out["sender"] = sender
    return sent, out


def test_plan_packs_aligned_buckets_in_the_send_dtype() -> None:
    state = _state()
    meta = plan_for(1, state, bucket_bytes=1500, dtype=torch.bfloat16)
    assert meta.names == list(state)
    # embed (40x16 bf16 = 1280 B) and bias (10 B, padded to 64) fill the first bucket; the
    # 512 B weight would bring it to 1856 B: it starts the second
    assert [len(b.entries) for b in meta.buckets] == [2, 2]
    assert all(off % 64 == 0 for b in meta.buckets for *_, off in b.entries)
    dtypes = {e[0]: e[1] for b in meta.buckets for e in b.entries}
    assert dtypes == {"embed.weight": "bfloat16", "layer.bias": "bfloat16", "layer.weight": "bfloat16", "steps": "int64"}
    assert WeightMeta.from_wire(meta.to_wire()) == meta
    big = plan_for(1, {"x": torch.zeros(4096)}, bucket_bytes=1024)  # larger than a bucket: its own
    assert len(big.buckets) == 1 and big.nbytes == 4096 * 4


@pytest.mark.parametrize("kind", ["crc32", "isum"])
def test_broadcast_delivers_every_tensor_and_both_ends_agree_on_the_fingerprint(kind: str) -> None:
    state = _state()
    meta = plan_for(3, state, bucket_bytes=1024, dtype=torch.bfloat16, checksum_kind=kind)
    sent, out = _pair(meta, state, lambda r: r.receive(meta))
    got = out["value"]
    assert all(torch.equal(got[k], (v.bfloat16() if v.is_floating_point() else v)) for k, v in state.items())
    assert sent == out["receiver"].fingerprint == state_fingerprint(meta, state)
    assert out["receiver"].version == 3
    # a different update has a different fingerprint
    assert state_fingerprint(meta, {**state, "layer.bias": state["layer.bias"] + 1}) != sent


def _damaging(meta: WeightMeta, times: int, bucket_index: int) -> Callable:
    packed, count = weight_sync.pack_bucket, []

    def pack(bucket, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        buf = packed(bucket, *args, **kwargs)
        count.append(bucket)
        if bucket == meta.buckets[bucket_index] and count.count(bucket) <= times:
            buf[0] ^= 0x01  # one bit flips after the checksum was written
        return buf

    return pack


def test_a_damaged_bucket_is_refused_then_sent_again(monkeypatch: pytest.MonkeyPatch) -> None:
    state = _state()
    meta = plan_for(1, state, bucket_bytes=1024)
    monkeypatch.setattr(nccl_sync, "pack_bucket", _damaging(meta, times=1, bucket_index=1))
    sent, out = _pair(meta, state, lambda r: r.receive(meta))
    assert out["sender"].resent_buckets == 1 and out["receiver"].refused_buckets == 1
    assert sent == out["receiver"].fingerprint == state_fingerprint(meta, state)
    assert all(torch.equal(out["value"][k], v) for k, v in state.items())


def test_a_bucket_damaged_every_time_abandons_the_update_on_both_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    state = _state()
    meta = plan_for(1, state, bucket_bytes=1024)
    monkeypatch.setattr(nccl_sync, "pack_bucket", _damaging(meta, times=99, bucket_index=0))
    yielded: list[str] = []

    def receive(r: WeightReceiver) -> None:
        for name, _ in r.iter_weights(meta):
            yielded.append(name)

    sent, out = _pair(meta, state, receive)
    assert isinstance(sent, WeightSyncError) and "refused 3 times" in str(sent)
    assert isinstance(out["error"], WeightSyncError) and "bucket 0" in str(out["error"])
    assert yielded == []  # nothing damaged reached the loader


def test_a_stale_version_is_drained_without_loading() -> None:
    state = _state()
    meta = plan_for(2, state, bucket_bytes=1024)

    def receive(r: WeightReceiver) -> str:
        r.version = 2
        with pytest.raises(WeightSyncError, match="not newer"):
            next(r.iter_weights(meta))
        r.drain(meta)  # what the engine extension does instead of loading
        return "drained"

    sent, out = _pair(meta, state, receive)
    assert out["value"] == "drained" and isinstance(sent, str)
