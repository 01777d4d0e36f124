"""Rollout configuration: the rollout workers (environment pools plus a policy engine each, and how
new weights reach their engines) and the replay buffer between them and the learner.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cast_rl.config._checks import _check_choice, _check_positive, _check_ray_resources


@dataclass(frozen=True)
class RolloutConfig:
    """Rollout workers: environment pools plus a policy engine each."""

    num_workers: int = 2
    """Rollout worker actors."""
    episodes_in_flight: int = 32
    """Concurrent episodes per worker sharing one engine."""
    trials_per_task: int = 4
    """Trials of each task (the GRPO group size, and n for pass^k)."""
    num_cpus_per_worker: float = 1.0
    """Ray CPUs per rollout worker."""
    num_gpus_per_worker: float = 0.0
    """Ray GPUs per rollout worker."""
    max_restarts: int = 3
    """Times a crashed rollout worker is restarted."""
    restart_wait_s: float = 600.0
    """Longest the group waits for a restarted rollout worker to answer again (its engine
    reloads) before the collection fails."""
    chunk_size: int | None = None
    """Episodes a worker takes per request from the group's queue (a crashed worker's chunk runs
    again); None: ceil(units / num_workers) when that fits in episodes_in_flight (one chunk per
    worker, all in flight together), else ceil(units / (2 x num_workers)), at most
    episodes_in_flight, so each worker gets about two chunks."""
    weight_sync: str = "object_store"
    """How new weights reach the engines: object_store (full state dict through Ray, checked
    with sha256; works anywhere), collective (learner rank 0 broadcasts buckets in policy.dtype
    to every engine worker over one process group: NCCL on GPUs, gloo on CPUs) or vllm_api (the
    same buckets and checks, received through vLLM's own weight-transfer API by cast_rl's
    transfer engine registered in vLLM's factory; vLLM >= 0.16)."""
    weight_sync_bucket_mb: float = 256.0
    """For weight_sync=collective or vllm_api: the most megabytes one broadcast bucket holds (a
    larger tensor gets a bucket of its own); two buckets are in memory at a time on each side.
    Smaller buckets overlap receiving, checking and loading better: over gloo on a 2-core CPU
    (bench/weight_sync.py, 417 MB) 16 MB took 0.76 s, 64 MB 1.02 s, 256 MB 1.23 s, 4 MB 1.32 s."""
    ray_resources: dict[str, float] = field(default_factory=dict)
    """Custom Ray resources each rollout worker asks for (e.g. {rollout_node: 1}), which places
    the workers on the nodes started with them (``ray start --resources``); empty: anywhere."""

    def __post_init__(self) -> None:
        _check_ray_resources("rollout.ray_resources", self.ray_resources)
        _check_choice("rollout.weight_sync", self.weight_sync, ("object_store", "collective", "vllm_api"))
        _check_positive("rollout.weight_sync_bucket_mb", self.weight_sync_bucket_mb)
        _check_positive("rollout.num_workers", self.num_workers)
        _check_positive("rollout.episodes_in_flight", self.episodes_in_flight)
        _check_positive("rollout.trials_per_task", self.trials_per_task)
        _check_positive("rollout.num_cpus_per_worker", self.num_cpus_per_worker, allow_zero=True)
        _check_positive("rollout.num_gpus_per_worker", self.num_gpus_per_worker, allow_zero=True)
        _check_positive("rollout.max_restarts", self.max_restarts, allow_zero=True)
        _check_positive("rollout.restart_wait_s", self.restart_wait_s)
        if self.chunk_size is not None:
            _check_positive("rollout.chunk_size", self.chunk_size)


@dataclass(frozen=True)
class ReplayBufferConfig:
    """The buffer between rollout workers and the learner."""

    capacity: int = 4096
    """Samples held at most; the oldest are dropped (and counted) beyond it."""
    sampling: str = "fifo"
    """fifo or priority (critique-changed samples first)."""
    max_staleness: int = 1
    """Policy versions a sample may lag the learner."""
    stale_policy: str = "drop"
    """drop stale samples, or wait for fresh ones."""
    log_dir: str = ""
    """Append-only log directory; empty means <run_dir>/replay."""
    wait_timeout_s: float = 600.0
    """Longest a draw waits for enough fresh samples (and, with stale_policy=wait, a producer
    waits for admission) before raising TimeoutError."""

    def __post_init__(self) -> None:
        _check_positive("replay.capacity", self.capacity)
        _check_positive("replay.wait_timeout_s", self.wait_timeout_s)
        _check_choice("replay.sampling", self.sampling, ("fifo", "priority"))
        _check_positive("replay.max_staleness", self.max_staleness, allow_zero=True)
        _check_choice("replay.stale_policy", self.stale_policy, ("drop", "wait"))
