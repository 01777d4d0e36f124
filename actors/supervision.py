"""Ray's side of self-healing training: which errors mean an actor died, which workers are down.

:class:`cast_rl.learner.supervisor.Supervisor` is told both; :func:`ray_supervisor` builds one
for a learner group of Ray actors (``actors.learner.LearnerGroup``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import ray
from ray.exceptions import ActorDiedError, ActorUnavailableError, GetTimeoutError, RayActorError

from cast_rl.learner.loop import TrainLoop
from cast_rl.learner.supervisor import Supervisor

ACTOR_FAILURES: tuple[type[BaseException], ...] = (RayActorError, ActorDiedError, ActorUnavailableError)
"""Errors Ray raises for a call to an actor that died or is restarting."""


def unresponsive_workers(learner: Any, timeout_s: float = 30.0) -> list[int]:
    """Indices of the learner's workers that are dead or do not answer within ``timeout_s``."""
    down, pending = [], {}
    for i, w in enumerate(getattr(learner, "workers", [])):
        try:
            pending[i] = w.address.remote()
        except ACTOR_FAILURES:
            down.append(i)
    deadline = time.monotonic() + timeout_s
    for i, ref in pending.items():
        try:
            ray.get(ref, timeout=max(0.1, deadline - time.monotonic()))
        except (*ACTOR_FAILURES, GetTimeoutError):
            down.append(i)
    return sorted(down)


def ray_supervisor(loop: TrainLoop, make_learner: Callable[[], Any], max_restarts: int,
                   wait_s: float = 600.0) -> Supervisor:
    """A :class:`Supervisor` that heals after Ray actor deaths."""
    return Supervisor(loop, make_learner, max_restarts, failures=ACTOR_FAILURES,
                      find_down=unresponsive_workers, wait_s=wait_s)
