"""Learner rank 0's end of the collective weight sync: plan, pack, checksum and broadcast buckets.

The path verl and OpenRLHF use (``rollout.weight_sync=collective``): learner rank 0 and every
rollout engine worker form a *separate* process group
(:func:`cast_rl.inference.weight_sync.weight_sync_group`, its own ``TCPStore``), rank 0 being the
learner.  For each update the learner sends a small :class:`WeightMeta` (version, buckets of
names, dtypes, shapes and offsets) through Ray; then it broadcasts the buckets in order, each
packed in the dtype the engines serve and ending with its checksum.  Packing bucket k+1 overlaps
the transfer of bucket k; at most two buckets are held at a time.  Receivers
(:class:`~cast_rl.inference.weight_sync.WeightReceiver`, inside the vLLM worker) check every
bucket; the group then agrees (a one-integer all-reduce) whether all receivers accepted it, and a
refused bucket is packed and sent again (up to ``RESENDS`` times), so bad bytes never reach an
engine's loader, which streams in each accepted bucket while the next one is on the wire.  Every failure is loud: a timeout, a plan
mismatch, a checksum mismatch, a stale version.

The backend is NCCL on GPUs; the very same code runs over gloo on CPUs, which is how it is
tested here (the NCCL run is a ``gpu`` test and part of ``bench/gpu_check.sh``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch

from cast_rl.inference.weight_sync import (
    RESENDS,
    WeightMeta,
    WeightReceiver,
    WeightSyncError,
    agree,
    broadcast_async,
    fingerprint,
    pack_bucket,
    wait,
    weight_sync_group,
)

logger = logging.getLogger(__name__)

__all__ = ["WeightBroadcaster", "WeightMeta", "WeightReceiver", "plan_for", "weight_sync_group"]


def plan_for(
    version: int,
    params: Mapping[str, Any],
    bucket_bytes: int,
    dtype: torch.dtype | None = None,
    checksum_kind: str = "crc32",
) -> WeightMeta:
    """The bucket plan of ``params`` (tensors or DTensors: only names, shapes and dtypes are read),
    sent in ``dtype`` (None: each tensor's own; floating tensors only are cast)."""

    def send_dtype(t: Any) -> torch.dtype:
        return dtype if dtype is not None and t.dtype.is_floating_point else t.dtype

    return WeightMeta.plan(
        version, ((n, send_dtype(t), tuple(t.shape)) for n, t in params.items()), bucket_bytes, checksum_kind
    )


class WeightBroadcaster:
    """Learner rank 0's end: broadcast every bucket of a plan."""

    def __init__(self, group: Any, device: torch.device, timeout_s: float = 600.0) -> None:
        self.group, self.device, self.timeout_s = group, device, timeout_s
        self.version = 0
        self.resent_buckets = 0
        """Buckets broadcast again because a receiver refused them (bad checksum)."""

    def check(self, meta: WeightMeta) -> None:
        if meta.version <= self.version:
            raise WeightSyncError(f"version {meta.version} is not newer than the last broadcast {self.version}")

    def send(self, meta: WeightMeta, tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]) -> str:
        """Collective with every receiver's ``iter_weights(meta)``; returns the update's fingerprint.

        ``tensors``: (name, full tensor) in plan order, or a mapping; a lazy iterator lets the
        caller gather each parameter just before it is packed.
        """
        self.check(meta)
        items = iter(tensors.items()) if isinstance(tensors, Mapping) else iter(tensors)
        sums: list[int] = []
        nxt = self._pack(meta, 0, items) if meta.buckets else None
        for i, bucket in enumerate(meta.buckets):
            assert nxt is not None
            tensors, buf = nxt
            for attempt in range(RESENDS + 1):
                work = broadcast_async(self.group, buf)
                if attempt == 0:  # pack the next bucket while this one is on the wire
                    nxt = self._pack(meta, i + 1, items) if i + 1 < len(meta.buckets) else None
                wait(work, self.timeout_s)
                if not agree(self.group, 0, self.device, self.timeout_s):
                    break
                self.resent_buckets += 1
                logger.warning("weights version %d: bucket %d refused by a receiver; sending it again", meta.version, i)
                if attempt == RESENDS:
                    raise WeightSyncError(f"weights version {meta.version}: bucket {i} refused {RESENDS + 1} times; "
                                          "update abandoned")
                buf = pack_bucket(bucket, tensors, self.device, meta.checksum_kind)
            sums.append(int(buf[bucket.nbytes :].view(torch.int64)[0]))
        if next(items, None) is not None:
            raise WeightSyncError("more tensors than the plan announced")
        self.version = meta.version
        logger.info("broadcast weights version %d (%d buckets, %.1f MB)", meta.version, len(meta.buckets),
                    meta.nbytes / 2**20)
        return fingerprint(sums)


    def _pack(self, meta: WeightMeta, i: int, items: Iterator[tuple[str, torch.Tensor]]) -> tuple[list, torch.Tensor]:
        """Bucket ``i``'s tensors (kept for a resend) and its packed buffer."""
        bucket = meta.buckets[i]
        tensors = list(_take(items, bucket.entries))
        return tensors, pack_bucket(bucket, tensors, self.device, meta.checksum_kind)


def _take(items: Iterator[tuple[str, torch.Tensor]], entries: tuple) -> Iterator[torch.Tensor]:
    for name, *_ in entries:
        got = next(items, None)
        if got is None or got[0] != name:
            raise WeightSyncError(f"tensor {got[0] if got else 'end of weights'!r} sent where the plan has {name!r}")
        yield got[1]
