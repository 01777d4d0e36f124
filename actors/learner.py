"""The learner as a Ray actor group: N workers sharing one torch.distributed process group.

Why an actor group and not Ray Train's ``TorchTrainer``: a ``TorchTrainer`` runs one
``train_loop_per_worker`` function to completion, and the driver can talk to it only through
what that function reads (datasets, queues) and reports.  The RL learner is a long-lived service
the driver calls many times — ``train_step(batch)``, ``publish_weights()``, ``save_checkpoint``
— between which rollouts run.  Plain actors give exactly that: each is one process holding its
FSDP2 shard, the driver calls methods on all of them, and ``torch.distributed`` is set up the
same way Ray Train does it (``MASTER_ADDR``/``MASTER_PORT`` from rank 0, gloo on CPUs, NCCL on
GPUs).

Weights reach rollout engines through the Ray object store on CPUs: every rank takes part in the
gather, rank 0 returns the full state dict as the *value* of a Ray call (stored once in the
object store) and its checksum as a second small return value, so
:meth:`LearnerGroup.publish_weights` hands out an ObjectRef that many readers fetch
(``num_returns=2``: the driver reads the checksum without pulling the weights).
With ``rollout.weight_sync=collective`` (the cluster path) nothing goes through the object store:
rank 0 and the engines' workers form a dedicated group and every update is broadcast in buckets
(:class:`BroadcastTicket`, :mod:`cast_rl.learner.nccl_sync`), NCCL on GPUs and gloo on CPUs.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray

from cast_rl.config.schema import CastConfig, ScheduleConfig
from cast_rl.inference.weight_sync import WeightSyncError
from cast_rl.learner.batch import shard
from cast_rl.learner.sample import Sample

logger = logging.getLogger(__name__)


@ray.remote
class LearnerWorkerActor:
    """One FSDP rank: a thin shell around :class:`cast_rl.learner.engine.LearnerEngine`."""

    def __init__(self, cfg: CastConfig, rank: int, world_size: int) -> None:
        self.cfg, self.rank, self.world_size = cfg, rank, world_size
        self.engine: Any = None

    def address(self) -> tuple[str, int]:
        """This node's IP and a free port (asked of rank 0 for the rendezvous)."""
        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return ray.util.get_node_ip_address(), port

    def setup(self, master_addr: str, master_port: int) -> int:
        import torch

        from cast_rl.learner.engine import LearnerEngine

        os.environ.update({"MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port),
                           "RANK": str(self.rank), "WORLD_SIZE": str(self.world_size)})
        # As many intra-op threads as CPUs reserved (at least one): more only spin against
        # the other ranks and the engines on the same cores.
        torch.set_num_threads(max(1, int(self.cfg.learner.num_cpus_per_worker)))
        self.engine = LearnerEngine(self.cfg, self.rank, self.world_size)
        return self.engine.version

    def train_step(self, samples: list[Sample]) -> dict[str, float]:
        return self.engine.train_step(samples)

    def set_lr(self, lr: float) -> None:
        self.engine.set_lr(lr)

    def set_schedule(self, schedule: ScheduleConfig, lr: float, total_steps: int) -> None:
        self.engine.set_schedule(schedule, lr, total_steps)

    @ray.method(num_returns=2)
    def gather_weights(self) -> tuple[dict[str, Any] | None, str | None]:
        """Collective; rank 0 returns (full state dict, checksum), the others (None, None)."""
        from cast_rl.inference.weight_sync import state_checksum

        state = self.engine.full_state_dict()
        return (state, state_checksum(state)) if self.rank == 0 else (None, None)

    @ray.method(num_returns=2)
    def gather_adapter(self) -> tuple[Any, str | None]:
        """Collective (``learner.lora.sync=adapter``); rank 0 returns (the adapter's
        :class:`~cast_rl.inference.adapters.AdapterUpdate`, its checksum), the others (None, None)."""
        update = self.engine.adapter_update()
        return (update, update.checksum) if update is not None else (None, None)

    def save_checkpoint(self, path: str) -> None:
        self.engine.save_checkpoint(path)

    def load_checkpoint(self, path: str, version: int) -> None:
        self.engine.load_checkpoint(path, version)

    def save_hf(self, path: str) -> str | None:
        out = self.engine.save_hf(path)
        return str(out) if out else None

    def logprobs(self, samples: list[Sample]) -> list[list[float]]:
        return self.engine.logprobs(samples)

    def init_weight_broadcast(self, master_addr: str, master_port: int, world_size: int, backend: str = "",
                              timeout_s: float = 600.0) -> None:
        """Rank 0 only: host the learner-to-engines group (NCCL when learner and engines are on
        GPUs, gloo otherwise; gloo buffers live on the CPU)."""
        import torch

        from cast_rl.learner.nccl_sync import WeightBroadcaster, weight_sync_group

        backend = backend or ("nccl" if self.engine.device.type == "cuda" else "gloo")
        group = weight_sync_group(master_addr, master_port, 0, world_size, backend, timeout_s)
        device = self.engine.device if backend == "nccl" else torch.device("cpu")
        self.broadcaster = WeightBroadcaster(group, device, timeout_s)

    def plan_broadcast(self, bucket_bytes: int, dtype: str, checksum_kind: str) -> Any:
        """Rank 0: the bucket plan of the current weights (no gather: shapes and dtypes only)."""
        import torch

        from cast_rl.learner.nccl_sync import plan_for

        return plan_for(self.engine.version, self.engine.param_shapes(), bucket_bytes, getattr(torch, dtype),
                        checksum_kind)

    def broadcast(self, meta: Any) -> str:
        """Collective over the learner ranks (one parameter gathered at a time); rank 0 sends
        every bucket to the engines, which receive meanwhile.  Rank 0 returns the fingerprint."""
        params = self.engine.iter_full_params()
        if self.rank != 0:
            for _ in params:
                pass
            return ""
        return self.broadcaster.send(meta, params)


class LearnerGroup:
    """Driver-side handle on the learner workers; implements the loop's learner interface."""

    def __init__(self, cfg: CastConfig, num_workers: int | None = None) -> None:
        self.cfg = cfg
        n = num_workers or cfg.learner.num_workers
        from cast_rl.config.resources import actor_request

        options = actor_request(cfg, "learner").ray_options()  # what the resource check counts
        actor: Any = LearnerWorkerActor
        self.workers = [actor.options(**options).remote(cfg, r, n) for r in range(n)]
        ip, port = ray.get(self.workers[0].address.remote())
        addr = ip if cfg.learner.master_addr == "auto" else cfg.learner.master_addr
        versions = ray.get([w.setup.remote(addr, port) for w in self.workers])
        self.version = versions[0]
        logger.info("learner group: %d workers, rendezvous %s:%d", n, addr, port)

    @property
    def world_size(self) -> int:
        return len(self.workers)

    def train_step(self, samples: list[Sample]) -> dict[str, float]:
        """One optimizer step on a global batch, split over the workers by token count."""
        return self.train_shards(shard(samples, len(self.workers)))

    def set_lr(self, lr: float) -> None:
        """Every rank's learning rate for the steps after this call."""
        ray.get([w.set_lr.remote(lr) for w in self.workers])

    def set_schedule(self, schedule: ScheduleConfig, lr: float, total_steps: int) -> None:
        """Every rank's learning-rate schedule for a phase of ``total_steps`` steps peaking at ``lr``."""
        ray.get([w.set_schedule.remote(schedule, lr, total_steps) for w in self.workers])

    def train_shards(self, shards: list[Any]) -> dict[str, float]:
        """One optimizer step, rank ``r`` on ``shards[r]`` (samples, or an object reference Ray
        resolves in the worker: the replay buffer's draw goes there without the driver)."""
        results = ray.get([w.train_step.remote(s) for w, s in zip(self.workers, shards)])
        self.version = int(results[0]["policy_version"])
        return results[0]

    def publish_weights(self) -> tuple[int, Any, str]:
        """Gather full weights; returns (version, ObjectRef of the state dict, checksum).  With
        ``learner.lora.sync=adapter`` the ObjectRef holds the adapter alone (an
        :class:`~cast_rl.inference.adapters.AdapterUpdate` the workers serve as ``policy``).

        With ``rollout.weight_sync=collective`` (or ``vllm_api``) nothing is gathered here: the
        second item is a :class:`BroadcastTicket` the collector delivers (the learner broadcasts
        while the engines receive), and the checksum comes with the delivery.
        """
        lora = self.cfg.learner.lora
        if lora.enabled and lora.sync == "adapter":  # megabytes: the object store whatever weight_sync says
            refs = [w.gather_adapter.remote() for w in self.workers]
        elif self.cfg.rollout.weight_sync in ("collective", "vllm_api"):
            return self.version, BroadcastTicket(self.version, self), ""
        else:
            refs = [w.gather_weights.remote() for w in self.workers]
        state_ref, checksum_ref = refs[0]
        checksum = ray.get(checksum_ref)
        ray.get([r[1] for r in refs[1:]])  # every rank finished the collective
        return self.version, state_ref, checksum

    def init_weight_broadcast(self, world_size: int, backend: str = "") -> tuple[tuple[str, int], Any]:
        """Start the weight-sync group; returns ((addr, port), ObjectRef of rank 0's join).

        Engines join as ranks 1..world_size-1 at that address (``weight_sync_group``) before the
        returned ref is awaited: the rendezvous needs every rank.
        """
        addr, port = ray.get(self.workers[0].address.remote())
        return (addr, port), self.workers[0].init_weight_broadcast.remote(addr, port, world_size, backend)

    def plan_broadcast(self, checksum_kind: str = "crc32") -> Any:
        """The :class:`~cast_rl.inference.weight_sync.WeightMeta` of the current weights, in
        ``policy.dtype`` and buckets of ``rollout.weight_sync_bucket_mb``."""
        bucket = int(self.cfg.rollout.weight_sync_bucket_mb * 2**20)
        return ray.get(self.workers[0].plan_broadcast.remote(bucket, self.cfg.policy.dtype, checksum_kind))

    def broadcast_weights(
        self, receive: Callable[[Any], list[Any]], checksum_kind: str = "crc32"
    ) -> tuple[Any, str, list[Any]]:
        """Plan, announce, broadcast: ``receive(meta)`` starts every engine's receive and
        returns their ObjectRefs; all must succeed (any failure raises here).  Returns the
        plan, the sender's fingerprint and what the receives returned."""
        meta = self.plan_broadcast(checksum_kind)
        sends = [w.broadcast.remote(meta) for w in self.workers]
        out = ray.get(sends + receive(meta))
        return meta, out[0], out[len(sends):]

    def save_checkpoint(self, path: str | Path) -> None:
        ray.get([w.save_checkpoint.remote(str(path)) for w in self.workers])

    def load_checkpoint(self, path: str | Path, version: int) -> None:
        ray.get([w.load_checkpoint.remote(str(path), version) for w in self.workers])
        self.version = version

    def save_hf(self, path: str | Path) -> Path:
        outs = ray.get([w.save_hf.remote(str(path)) for w in self.workers])
        return Path(outs[0])

    def logprobs(self, samples: list[Sample]) -> list[list[float]]:
        """Every rank runs the forward passes (FSDP collectives); rank 0's answer is returned."""
        return ray.get([w.logprobs.remote(samples) for w in self.workers])[0]

    def shutdown(self) -> None:
        for w in self.workers:
            ray.kill(w)


class BroadcastTicket:
    """What :meth:`LearnerGroup.publish_weights` hands the collector under
    ``rollout.weight_sync=collective`` or ``vllm_api``: the version, and the learner end that sends
    it (the same broadcast either way; the engines receive it with cast_rl's worker extension or
    through vLLM's weight-transfer API, :mod:`cast_rl.rollout.weights`).

    :meth:`deliver` (called by :meth:`actors.rollout_group.RolloutGroup.update_weights`) forms
    the learner-to-engines group when its members changed (first sync, a new learner group, a
    restarted rollout worker), then broadcasts while every engine receives, and checks that
    every engine got what was sent.
    """

    def __init__(self, version: int, learner: LearnerGroup) -> None:
        self.version, self.learner = version, learner

    def deliver(self, workers: list[Any], ranks_per_worker: int, timeout_s: float = 600.0) -> list[int]:
        learner = self.learner
        gpus = learner.cfg.learner.num_gpus_per_worker > 0 and learner.cfg.rollout.num_gpus_per_worker > 0
        backend = "nccl" if gpus else "gloo"
        key = f"{id(learner)}-{len(workers)}"
        if ray.get([w.weight_sync_key.remote() for w in workers]) != [key] * len(workers) \
                or getattr(learner, "_sync_key", None) != key:
            world = 1 + len(workers) * ranks_per_worker
            (addr, port), hosted = learner.init_weight_broadcast(world, backend)
            joins = [w.join_weight_sync.remote(addr, port, 1 + i * ranks_per_worker, world, backend, timeout_s, key)
                     for i, w in enumerate(workers)]
            ray.get([hosted, *joins])
            learner._sync_key = key  # type: ignore[attr-defined]
            logger.info("weight-sync group formed: %d ranks over %s at %s:%d", world, backend, addr, port)
        kind = "isum" if backend == "nccl" else "crc32"
        _, sent, received = learner.broadcast_weights(
            lambda m: [w.receive_weights.remote(self.version, m) for w in workers], kind)
        for i, (version, printed) in enumerate(received):
            if printed != sent:
                raise WeightSyncError(f"rollout worker {i} received weights {printed[:12]} for version "
                                      f"{version}, the learner sent {sent[:12]}")
        return [version for version, _ in received]
