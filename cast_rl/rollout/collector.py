"""The one collector protocol: what the training loop and the pipeline ask of whatever collects.

A collector turns units of work into trajectories and follows the learner's weights:

* ``collect(units, tree=None)``: one trajectory per ``(split, task_index, trial)`` unit, in the
  order given; with ``tree = (branches, points)`` each unit is a tree rollout (step-level GRPO):
  its root, then its continuations
  (:meth:`~cast_rl.rollout.runner.EpisodeRunner.run_tree`).
* ``update_weights(version, weights, checksum)``: serve the learner's published weights
  (a state dict, an adapter update, an object reference to one, or a broadcast ticket) as policy
  ``version``; loud on a stale version or a checksum mismatch.

The implementations: :class:`cast_rl.rollout.worker.RolloutWorker` (async: its ``collect`` is a
coroutine, awaited by its Ray actor shell), :class:`actors.rollout_worker.RolloutWorkerActor`,
:class:`actors.rollout_group.RolloutGroup`, :class:`cast_rl.learner.toy.HFCollector`,
:class:`cast_rl.learner.supervisor.MonotoneCollector`, :class:`launchers.train.HFCollectorClient`
and the pipeline's ``launchers.stages._VersionedCollector``.  Their signatures match this one
exactly (``tests/rollout/test_collector_protocol.py``); an implementation may take more options
only as keyword-only parameters with defaults (the rollout group's ``on_done`` and
``chunk_size``), never ``**kwargs``.

A collector on a Ray cluster (the rollout group) also offers ``collect_refs(units, tree=None)``:
the same collection as object references of its workers' results, plus the episodes'
summaries, so the training loop hands the trajectories to the replay buffer's actor without
receiving them (:class:`cast_rl.learner.loop.RefCollector`).

This module imports nothing of the library but the record types, so every layer can name it.
"""

from __future__ import annotations

from typing import Any, Protocol

from cast_rl.records import Trajectory

Unit = tuple[str, int, int]
"""One episode to run: (split, task_index, trial)."""
Tree = tuple[int, str]
"""Step-level GRPO's tree rollouts: (continuations per decision point, which points)."""


class Collector(Protocol):
    def collect(self, units: list[Unit], tree: Tree | None = None) -> list[Trajectory]:
        """One trajectory per unit in unit order; with ``tree``, each followed by its
        continuations."""
        ...

    def update_weights(self, version: int, weights: Any, checksum: str) -> Any:
        """Serve ``weights`` as policy ``version`` (checked against ``checksum``)."""
        ...
