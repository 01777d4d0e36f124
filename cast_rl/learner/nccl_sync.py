"""Weight broadcast from learner rank 0 to rollout engines over a dedicated process group.

The GPU path for weight sync (what verl and OpenRLHF do): learner rank 0 and every rollout
engine worker form a *separate* process group (its own ``TCPStore`` rendezvous, outside the
learner's default group), rank 0 being the learner.  For each update the learner sends a small
:class:`WeightMeta` (version, checksum, names, dtypes, shapes) through Ray, then broadcasts the
tensors one by one in that order; receivers allocate, receive, verify the checksum and load.
Every failure is loud: a timeout, a metadata mismatch, a checksum mismatch, a stale version.

The backend is NCCL on GPUs; the very same code runs over gloo on CPUs, which is how the logic is
tested here (the NCCL run is a ``gpu`` test).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from cast_rl.inference.weight_sync import WeightSyncError, state_checksum

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class WeightMeta:
    """What receivers need before a broadcast: sent through Ray, a few KB."""

    version: int
    checksum: str
    entries: tuple[tuple[str, str, tuple[int, ...]], ...]
    """(name, dtype without the ``torch.`` prefix, shape) in broadcast order."""

    @classmethod
    def of(cls, version: int, state: Mapping[str, torch.Tensor], checksum: str | None = None) -> WeightMeta:
        entries = tuple((n, str(t.dtype).removeprefix("torch."), tuple(t.shape)) for n, t in state.items())
        return cls(version, checksum or state_checksum(state), entries)


def weight_sync_group(
    master_addr: str, master_port: int, rank: int, world_size: int, backend: str, timeout_s: float = 600.0
) -> dist.ProcessGroup:
    """Join the learner-to-engines group (rank 0 = learner rank 0, which hosts the store)."""
    timeout = timedelta(seconds=timeout_s)
    tcp = dist.TCPStore(master_addr, master_port, world_size, is_master=rank == 0, timeout=timeout)
    store = dist.PrefixStore("cast_rl_weight_sync", tcp)
    group: Any
    if backend == "nccl":
        opts = dist.ProcessGroupNCCL.Options()  # type: ignore[attr-defined]
        opts._timeout = timeout
        group = dist.ProcessGroupNCCL(store, rank, world_size, opts)  # type: ignore[attr-defined]
        return group
    if backend == "gloo":
        group = dist.ProcessGroupGloo(store, rank, world_size, timeout)
        return group
    raise ValueError(f"backend={backend!r} is not allowed; choose nccl or gloo")


def _broadcast(group: dist.ProcessGroup, tensor: torch.Tensor, timeout_s: float) -> None:
    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    work = group.broadcast([tensor], opts)
    if not work.wait(timedelta(seconds=timeout_s)):
        raise WeightSyncError(f"weight broadcast timed out after {timeout_s:.0f} s")


class WeightBroadcaster:
    """Learner rank 0's end: publish metadata, then broadcast every tensor."""

    def __init__(self, group: dist.ProcessGroup, device: torch.device, timeout_s: float = 600.0) -> None:
        self.group, self.device, self.timeout_s = group, device, timeout_s
        self.version = 0

    def prepare(self, version: int, state: Mapping[str, torch.Tensor]) -> WeightMeta:
        if version <= self.version:
            raise WeightSyncError(f"version {version} is not newer than the last broadcast {self.version}")
        return WeightMeta.of(version, state)

    def send(self, meta: WeightMeta, state: Mapping[str, torch.Tensor]) -> None:
        """Collective with every receiver's :meth:`WeightReceiver.receive` (same ``meta``)."""
        if [e[0] for e in meta.entries] != list(state):
            raise WeightSyncError("state does not match the metadata it was announced with")
        for tensor in state.values():
            _broadcast(self.group, tensor.detach().to(self.device).contiguous(), self.timeout_s)
        self.version = meta.version
        logger.info("broadcast weights version %d (%d tensors)", meta.version, len(meta.entries))


class WeightReceiver:
    """A rollout engine's end: receive, verify, hand the state dict to the engine's loader."""

    def __init__(self, group: dist.ProcessGroup, device: torch.device, timeout_s: float = 600.0,
                 verify_checksum: bool = True) -> None:
        self.group, self.device, self.timeout_s = group, device, timeout_s
        self.verify_checksum = verify_checksum
        self.version = 0

    def receive(self, meta: WeightMeta) -> dict[str, torch.Tensor]:
        if meta.version <= self.version:
            raise WeightSyncError(f"weights version {meta.version} is not newer than {self.version}")
        state: dict[str, torch.Tensor] = {}
        for name, dtype, shape in meta.entries:
            tensor = torch.empty(shape, dtype=getattr(torch, dtype), device=self.device)
            _broadcast(self.group, tensor, self.timeout_s)
            state[name] = tensor
        if self.verify_checksum:
            got = state_checksum(state)
            if got != meta.checksum:
                raise WeightSyncError(f"checksum mismatch for version {meta.version}: {got[:12]} != {meta.checksum[:12]}")
        self.version = meta.version
        return state
