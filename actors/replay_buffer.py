"""The replay buffer as a Ray actor, and a blocking client with the in-process interface.

The actor is threaded (``max_concurrency``): a learner blocked in ``sample`` (waiting for fresh
samples) or a producer blocked in ``admit`` does not stop rollout workers from adding.

The training loop hands the actor a collection by reference (:meth:`ReplayBufferClient.add_collection`):
the trajectories come from the rollout workers' object stores, and the actor builds their
samples (:mod:`cast_rl.samples.builders`) where they arrive.  The actor imports no torch and none
of the learner (``tests/learner/test_replay_buffer.py`` checks): samples, their builders, sharding
and batch metrics come from the torch-free :mod:`cast_rl.samples`; verl's advantage estimator
runs in a Ray task (:func:`advantages_in_task`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray

from cast_rl.config.schema import ReplayBufferConfig
from cast_rl.records import Trajectory
from cast_rl.replay.buffer import AddResult, ReplayBuffer
from cast_rl.samples import Sample, batch_metrics, shard


@ray.remote(num_cpus=0, max_concurrency=16)  # type: ignore[call-overload]
class ReplayBufferActor:
    """A shell around :class:`cast_rl.replay.ReplayBuffer`."""

    def __init__(self, cfg: ReplayBufferConfig, log_path: str | None, batch_size: int) -> None:
        self.buffer = ReplayBuffer(cfg, log_path, batch_size)

    def add(self, samples: list[Sample], trajectories: list[Trajectory] | None = None) -> AddResult:
        return self.buffer.add(samples, trajectories)

    def add_collection(self, build: Callable[..., list[Sample]], *chunks: list[Trajectory]) -> AddResult:
        """A collection given as the rollout workers' chunk results, in order (each argument an
        object reference Ray resolves here, from the store the result lies in: the trajectories
        never pass through the driver): builds its samples with ``build`` (advantages computed
        in a Ray task, :func:`advantages_in_task`) and adds them with the trajectories."""
        trajectories = [t for chunk in chunks for t in chunk]
        return self.buffer.add(build(trajectories, advantages=advantages_in_task), trajectories)

    def admit(self, policy_version: int, n: int, timeout_s: float | None = None) -> bool:
        return self.buffer.admit(policy_version, n, timeout_s)

    def sample(self, n: int, learner_version: int | None = None, timeout_s: float | None = None) -> list[Sample]:
        return self.buffer.sample(n, learner_version, timeout_s)

    def draw(self, n: int, learner_version: int, timeout_s: float | None, shards: int) -> tuple[Any, ...]:
        """``sample``, then the batch's metrics and its ``shards`` token-balanced parts, each its
        own return value (called with ``num_returns=shards + 1``: one object reference each)."""
        batch = self.buffer.sample(n, learner_version, timeout_s)
        return (batch_metrics(batch, learner_version), *shard(batch, shards))

    def set_learner_version(self, version: int) -> None:
        self.buffer.set_learner_version(version)

    def cursor(self) -> int:
        return self.buffer.cursor()

    def rewind(self, cursor: int) -> int:
        return self.buffer.rewind(cursor)

    def close(self, reason: str = "replay buffer closed") -> None:
        self.buffer.close(reason)

    def snapshot(self) -> dict[str, Any]:
        return self.buffer.snapshot()

    def size(self) -> int:
        return len(self.buffer)


@ray.remote(num_cpus=0)
def _advantages(*args: Any) -> list[float]:
    # torch and verl load here, in this task's process, never in the buffer's actor
    from cast_rl.samples.builders import verl_advantages

    return verl_advantages(*args)


def advantages_in_task(*args: Any) -> list[float]:
    """:func:`cast_rl.samples.builders.verl_advantages` run in a Ray task, so the buffer's actor
    builds samples without importing torch (it sends rewards, masks and group ids; one float per
    sequence comes back)."""
    return ray.get(_advantages.remote(*args))


class ReplayBufferClient:
    """Calls the actor and waits: the same methods as :class:`ReplayBuffer` for the driver loop."""

    def __init__(self, cfg: ReplayBufferConfig, log_path: str | Path | None, batch_size: int, **options: Any) -> None:
        actor: Any = ReplayBufferActor
        self.handle = actor.options(**options).remote(cfg, str(log_path) if log_path else None, batch_size)

    def add(self, samples: list[Sample], trajectories: list[Trajectory] | None = None) -> AddResult:
        return ray.get(self.handle.add.remote(samples, trajectories))

    def add_collection(self, handles: list[Any], build: Callable[..., list[Sample]]) -> AddResult:
        """A rollout group's collection by its chunk results' references
        (:meth:`actors.rollout_group.RolloutGroup.collect_refs`): the actor fetches the
        trajectories from the workers' object stores and builds the samples with ``build``."""
        return ray.get(self.handle.add_collection.remote(build, *handles))

    def admit(self, policy_version: int, n: int, timeout_s: float | None = None) -> bool:
        return ray.get(self.handle.admit.remote(policy_version, n, timeout_s))

    def sample(self, n: int, learner_version: int | None = None, timeout_s: float | None = None) -> list[Sample]:
        return ray.get(self.handle.sample.remote(n, learner_version, timeout_s))

    def draw(self, n: int, learner_version: int, shards: int,
             timeout_s: float | None = None) -> tuple[dict[str, float], list[Any]]:
        """Draw a global batch in the actor: its metrics here, its ``shards`` parts as object
        references a learner group's ranks fetch from the object store themselves."""
        refs = self.handle.draw.options(num_returns=shards + 1).remote(n, learner_version, timeout_s, shards)
        return ray.get(refs[0]), list(refs[1:])

    def set_learner_version(self, version: int) -> None:
        ray.get(self.handle.set_learner_version.remote(version))

    def cursor(self) -> int:
        return ray.get(self.handle.cursor.remote())

    def rewind(self, cursor: int) -> int:
        return ray.get(self.handle.rewind.remote(cursor))

    def close(self, reason: str = "replay buffer closed") -> None:
        ray.get(self.handle.close.remote(reason))

    def snapshot(self) -> dict[str, Any]:
        return ray.get(self.handle.snapshot.remote())

    def __len__(self) -> int:
        return ray.get(self.handle.size.remote())
