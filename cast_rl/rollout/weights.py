"""A rollout worker's end of the collective weight sync (``rollout.weight_sync=collective`` or
``vllm_api``).

:func:`join` puts the worker's engine into the learner-to-engines process group; :func:`receive`
takes one broadcast update into it with the same guarantees as the object-store path
(:meth:`cast_rl.rollout.worker.RolloutWorker.update_weights`): generation paused and drained
while weights change, versions only rise, every bucket checked, and the greedy probe must move
unless the weights are equal to those served before (equal fingerprints, or, on the first update,
equal to the checkpoint the engine started from).  With ``vllm_api`` the engine joins and
receives through vLLM's own weight-transfer API
(:meth:`~cast_rl.inference.vllm_engine.VLLMEngine.init_weight_transfer`,
:meth:`~cast_rl.inference.vllm_engine.VLLMEngine.transfer_weights`); the bucket protocol, the
learner's end and these guarantees are the same.
"""

from __future__ import annotations

from typing import Any

from cast_rl.inference.base import Sampling
from cast_rl.inference.weight_sync import (
    WeightMeta,
    WeightSyncError,
    checkpoint_tensors,
    state_fingerprint,
)


async def join(worker: Any, addr: str, port: int, rank_offset: int, world_size: int, backend: str,
               timeout_s: float, key: str) -> list[int]:
    """Join the group as ranks ``rank_offset``..; ``key`` names the group (see :func:`joined`)."""
    engine = worker.engine.engine
    if _native(worker):
        await engine.init_weight_transfer(addr, port, rank_offset, world_size, backend, timeout_s)
        ranks = list(range(rank_offset, rank_offset + worker.cfg.inference.tensor_parallel_size))
    else:
        ranks = await engine.join_weight_sync(addr, port, rank_offset, world_size, backend, timeout_s)
    worker.weight_sync_key = key
    return ranks


def _native(worker: Any) -> bool:
    """Whether updates go through vLLM's weight-transfer API (``rollout.weight_sync=vllm_api``)."""
    return worker.cfg.rollout.weight_sync == "vllm_api"


def joined(worker: Any) -> str:
    """The key of the group this worker's engine is in ('' if none: new or restarted)."""
    return getattr(worker, "weight_sync_key", "")


async def receive(worker: Any, version: int, meta: WeightMeta) -> tuple[int, str]:
    """Receive version ``version`` (collective with the learner's send); returns (version, fingerprint).

    A stale version or a corrupted bucket is refused by the engine's receiver after it has
    drained the broadcast, so the learner never hangs; the worker keeps its version.
    """
    if version != meta.version:
        raise WeightSyncError(f"weights version {version} announced with a plan for version {meta.version}")
    engine = worker.engine.engine
    receive = engine.transfer_weights if _native(worker) else engine.receive_weights

    def same_as_initial(printed: str) -> bool:
        disk = checkpoint_tensors(engine.model_path, meta.names)  # the fingerprint needs every name
        return disk.keys() == set(meta.names) and state_fingerprint(meta, disk) == printed

    printed = await worker.swap(version, lambda: receive(meta, newer_than=worker.version), same_as_initial)
    return version, printed


async def greedy_answer(worker: Any, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """The served model's greedy continuation of ``prompt_ids`` (for checks that an update landed)."""
    out = await worker.engine.generate(prompt_ids, Sampling(max_new_tokens=max_new_tokens, temperature=0.0,
                                                            logprobs=False))
    return list(out.token_ids)
