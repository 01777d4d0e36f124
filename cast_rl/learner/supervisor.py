"""Self-healing training: when a learner worker dies, rebuild the group and resume from a checkpoint.

:class:`Supervisor` runs a :class:`~cast_rl.learner.loop.TrainLoop` in ``sync`` mode.  When a step
fails because an actor died -- a learner worker (Ray does not restart those: the survivors'
process group dies with it) or an actor Ray restarts by itself (the replay buffer) -- it

1. shuts the learner group down and builds a new one if any of its workers is dead or silent
   (or if there is no checkpoint yet: the new group starts from the initial weights),
2. resumes the loop from the latest complete checkpoint (:meth:`TrainLoop.resume`: learner
   shards and RNG, data cursor, replay-buffer rewind), or from step 0 when there is none,
3. carries on, at most ``learner.max_restarts`` times.

Resuming replays the steps after the checkpoint exactly: the buffer puts back what those steps
drew, re-collected samples have the same keys and are ignored as duplicates, and the learner's
RNG is restored, so it recomputes the versions the collector already serves.  Those publishes are
skipped by :class:`MonotoneCollector`, so the policy versions rollout workers see rise by one at a
time, without gaps or reversals, across any number of restarts.

Async mode is not supervised (its loop closes the replay buffer when it stops); a failure there
ends the run as before.

The supervisor knows nothing of Ray: it is given the errors that mean "an actor died"
(``failures``) and a probe that names the learner workers that are down (``find_down``);
:func:`actors.supervision.ray_supervisor` passes Ray's.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from cast_rl.learner import checkpoint
from cast_rl.learner.loop import LoopState, TrainLoop
from cast_rl.records import Trajectory
from cast_rl.rollout.collector import Collector, Tree, Unit

logger = logging.getLogger(__name__)


class MonotoneCollector:
    """A collector that forwards only weights newer than the newest it has published.

    ``published`` is the sequence of versions the rollout workers received, in order;
    ``skipped`` maps versions a resumed learner recomputed (and did not republish) to their
    checksums, next to ``checksums`` of what was published.
    """

    def __init__(self, collector: Collector) -> None:
        self.collector = collector
        self.published: list[int] = []
        self.checksums: dict[int, str] = {}
        self.skipped: dict[int, str] = {}

    def collect(self, units: list[Unit], tree: Tree | None = None) -> list[Trajectory]:
        return self.collector.collect(units, tree=tree)

    def update_weights(self, version: int, weights: Any, checksum: str) -> Any:
        if self.published and version <= self.published[-1]:
            logger.info("not republishing policy version %d: rollout workers already serve %d",
                        version, self.published[-1])
            self.skipped[version] = checksum
            return self.published[-1]
        out = self.collector.update_weights(version, weights, checksum)
        self.published.append(version)
        self.checksums[version] = checksum
        return out

    def __getattr__(self, name: str) -> Any:  # metrics(), shutdown(), ... of the wrapped collector
        if name == "collector":  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.collector, name)


class Supervisor:
    """Runs a sync :class:`TrainLoop`, healing it after actor deaths (see the module doc)."""

    def __init__(self, loop: TrainLoop, make_learner: Callable[[], Any], max_restarts: int,
                 failures: tuple[type[BaseException], ...],
                 find_down: Callable[[Any], list[int]],
                 wait_s: float = 600.0) -> None:
        self.loop = loop
        self.make_learner = make_learner
        self.failures_to_heal = failures
        """Errors that mean an actor died or is restarting (Ray's, for Ray actors)."""
        self.find_down = find_down
        """``find_down(learner)``: indices of the learner's workers that are dead or silent."""
        self.max_restarts = max_restarts
        self.wait_s = wait_s
        """How long a resume waits for a restarting actor (the replay buffer) to answer."""
        self.restarts = 0
        self.failures: list[str] = []
        """One line per recovered failure: the step it hit and the error."""

    def run(self, steps: int | None = None) -> list[dict[str, float]]:
        """``loop.run(steps)``, resuming after actor deaths; returns the loop's history."""
        if self.loop.cfg.algorithm.mode != "sync":
            logger.info("algorithm.mode=%s: training runs unsupervised", self.loop.cfg.algorithm.mode)
            return self.loop.run(steps)
        while True:
            try:
                return self.loop.run(steps)
            except Exception as exc:
                down = self.find_down(self.loop.learner)
                if not (down or isinstance(exc, self.failures_to_heal)) or self.restarts >= self.max_restarts:
                    raise
                self.restarts += 1
                failed_at = self.loop.state.step
                self.failures.append(f"step {failed_at + 1}: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
                logger.warning("training failed in step %d (%s); learner workers down: %s; "
                               "restart %d of %d", failed_at + 1, self.failures[-1], down or "none",
                               self.restarts, self.max_restarts)
                self._recover(rebuild=bool(down), failed_at=failed_at)

    def _recover(self, rebuild: bool, failed_at: int) -> None:
        loop = self.loop
        path = checkpoint.latest_checkpoint(loop.cfg.run_dir)
        if rebuild or path is None:
            loop.learner.shutdown()
            loop.learner = self.make_learner()
        deadline = time.monotonic() + self.wait_s
        while True:
            try:
                if path is not None:
                    loop.resume(path)
                else:  # no checkpoint yet: the new group holds the initial weights
                    loop.state = LoopState()
                    loop.cursor.position = 0
                    loop.buffer.rewind(0)
                    loop.sync()
                break
            except self.failures_to_heal:
                if time.monotonic() > deadline:
                    raise
                time.sleep(1.0)  # an actor Ray restarts (the replay buffer) is not up yet: back off
        redo = failed_at - loop.state.step
        if redo > 0:  # these steps run again; keep one history entry per step
            del loop.history[len(loop.history) - redo :]
        logger.info("resumed at step %d; %d step(s) run again", loop.state.step, max(redo, 0))
