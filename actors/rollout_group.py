"""Fan rollout work out over N rollout-worker actors, surviving worker crashes.

Work is a list of (split, task_index, trial) units cut into chunks; each idle worker takes the next
chunk.  If a worker dies mid-chunk (engine crash, node preemption), Ray restarts the actor
(``rollout.max_restarts``) and the chunk goes back on the queue: its episodes run again from the
start, and results are keyed by unit so nothing is lost or duplicated.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import ray
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError

from actors import rollout_worker
from cast_rl.config.resources import actor_request
from cast_rl.config.schema import CastConfig, CriticConfig
from cast_rl.critique.blame import BlameRecord
from cast_rl.envs.types import is_success
from cast_rl.eval.net_benefit import BenefitReport
from cast_rl.records import EpisodeSummary, Trajectory
from cast_rl.rollout.collector import Tree, Unit
from cast_rl.rollout.worker import merge_worker_metrics

logger = logging.getLogger(__name__)

_WORKER_FAILURES = (RayActorError, ActorDiedError, ActorUnavailableError)


def default_chunk_size(units: int, workers: int, episodes_in_flight: int) -> int:
    """``rollout.chunk_size=None``.  When every worker's share fits in flight at once
    (``ceil(units / workers) <= episodes_in_flight``), one chunk per worker: a worker runs one
    chunk at a time, so a second chunk would halve what its engine batches for no gain: small
    collections are latency-bound (the 4B rehearsal's evaluation, two episodes per configuration:
    14-17 s as two chunks of one, 7-10 s as one chunk; its eval_before stage 157 s -> 109 s on 2
    cores, 2026-12-05).  Larger collections: about two chunks per worker, none above
    ``episodes_in_flight``, so a fast worker takes a slow one's share."""
    share = -(-units // workers)
    if share <= episodes_in_flight:
        return max(1, share)
    return max(1, min(episodes_in_flight, -(-units // (2 * workers))))


class RolloutGroup:
    """N :class:`actors.rollout_worker.RolloutWorkerActor` and the work queue between them.

    The collector the library's :class:`~cast_rl.learner.loop.TrainLoop` and the evaluation
    take as an argument (``collect``, ``update_weights``, ``metrics``, ``shutdown``); it lives
    here, next to :class:`actors.learner.LearnerGroup`, because it holds Ray actors.
    """

    def __init__(self, cfg: CastConfig, num_workers: int | None = None, kind: str = "rollout") -> None:
        """``kind``: ``rollout`` (the policy's workers) or ``teacher`` (the teacher model plays,
        :mod:`cast_rl.rollout.teacher`; ``teacher.num_workers`` workers on ``teacher.num_gpus``)."""
        self.cfg = cfg
        """The config later episodes run under: its ``env`` follows :meth:`set_domain`."""
        self.built_cfg = cfg
        """What a restarted actor is rebuilt from (:meth:`_wait_alive` re-applies the changes since)."""
        request = actor_request(cfg, kind)  # what the resource check counts
        n = num_workers or request.count
        options = {
            **request.ray_options(),
            "max_restarts": cfg.rollout.max_restarts,
            "max_task_retries": 0,  # we resubmit chunks ourselves, keyed by unit
        }
        self.workers = [rollout_worker.RolloutWorkerActor.options(**options).remote(cfg, i, kind) for i in range(n)]
        self.resubmitted_chunks = 0
        # The budget and critic every worker uses now (the domain: self.cfg.env); re-applied to a
        # restarted worker.
        self.verification_budget = cfg.critic.verification_budget
        self.critic = cfg.critic
        ray.get([w.ready.remote() for w in self.workers])

    def collect(
        self,
        units: list[Unit],
        tree: Tree | None = None,
        *,
        on_done: Callable[[Trajectory], None] | None = None,
        chunk_size: int | None = None,
    ) -> list[Trajectory]:
        """One trajectory per unit (in the order given), whatever crashes happen on the way;
        with ``tree = (branches, points)``, each unit's tree rollout (root, then continuations).

        The :class:`~cast_rl.rollout.collector.Collector` protocol, plus two keyword-only
        options: ``on_done`` sees each trajectory as its chunk returns (the pipeline streams them
        to disk), ``chunk_size`` overrides ``rollout.chunk_size``."""
        chunks = self._run_chunks(units, chunk_size, lambda worker, chunk: (worker.collect.remote(chunk, tree), None),
                                  on_done)
        done: dict[Unit, list[Trajectory]] = {}
        for _, trajectories in chunks:
            for traj in trajectories:
                done.setdefault((traj.split, traj.task_index, traj.trial), []).append(traj)
        return [t for u in units for t in done[u]]

    def collect_refs(self, units: list[Unit], tree: Tree | None = None) -> tuple[list[Any], list[EpisodeSummary]]:
        """``collect`` for a consumer on the cluster (the replay buffer's actor): the object
        references of the workers' results, in chunk order (their values concatenated hold one
        trajectory per unit, each tree's continuations after its root), and the episodes'
        summaries; the trajectories themselves never come to the caller."""
        def submit(worker: Any, chunk: list[Unit]) -> tuple[Any, Any]:
            trajectories, summaries = worker.collect_summarized.remote(chunk, tree)
            return summaries, trajectories

        chunks = self._run_chunks(units, None, submit)
        return [ref for ref, _ in chunks], [s for _, summaries in chunks for s in summaries]

    def _run_chunks(self, units: list[Unit], chunk_size: int | None,
                    submit: Callable[[Any, list[Unit]], tuple[Any, Any]],
                    on_done: Callable[[Any], None] | None = None) -> list[tuple[Any, list[Any]]]:
        """Cut ``units`` into chunks and run them on idle workers until each has returned:
        ``submit(worker, chunk)`` starts one and gives (the reference to wait on and read, a
        handle kept beside it); a chunk whose worker died goes back on the queue.  Returns
        (handle, what was read) per chunk, in chunk order, after checking that the episodes read
        (trajectories or summaries) are the units, each once (tree continuations aside)."""
        if len(set(units)) != len(units):
            raise ValueError("collect() got duplicate (split, task_index, trial) units")
        size = chunk_size or self.cfg.rollout.chunk_size or default_chunk_size(
            len(units), len(self.workers), self.cfg.rollout.episodes_in_flight
        )
        queue: deque[tuple[int, list[Unit]]] = deque(enumerate(units[i : i + size] for i in range(0, len(units), size)))
        results: dict[int, tuple[Any, list[Any]]] = {}
        running: dict[Any, tuple[int, int, list[Unit], Any]] = {}
        idle = list(range(len(self.workers)))
        while queue or running:
            while queue and idle:
                w = idle.pop(0)
                c, chunk = queue.popleft()
                ref, handle = submit(self.workers[w], chunk)
                running[ref] = (w, c, chunk, handle)
            ready, _ = ray.wait(list(running), num_returns=1)
            w, c, chunk, handle = running.pop(ready[0])
            try:
                episodes = ray.get(ready[0])
            except _WORKER_FAILURES as exc:
                logger.warning("rollout worker %d failed (%s); requeueing %d episodes", w, type(exc).__name__, len(chunk))
                self.resubmitted_chunks += 1
                queue.appendleft((c, chunk))
                self._wait_alive(w)
                idle.append(w)
                continue
            results[c] = (handle, episodes)
            if on_done is not None:
                for episode in episodes:
                    on_done(episode)
            idle.append(w)
        ordered = [results[c] for c in sorted(results)]
        roots = [(e.split, e.task_index, e.trial) for _, episodes in ordered for e in episodes if not e.continuation]
        # cannot fail with unit-keyed chunks: a worker's answer is its chunk's units
        assert sorted(roots) == sorted(units) and len(set(roots)) == len(roots), "lost or duplicated units"
        return ordered

    def _wait_alive(self, w: int) -> None:
        """Block until the restarted actor answers (its engine reloads), or give up loudly
        after ``rollout.restart_wait_s``."""
        deadline = time.monotonic() + self.cfg.rollout.restart_wait_s
        while True:
            try:
                ray.get(self.workers[w].ready.remote(), timeout=max(1.0, deadline - time.monotonic()))
                # a restarted actor is rebuilt from the construction config
                if self.cfg.env != self.built_cfg.env:
                    ray.get(self.workers[w].set_domain.remote(self.cfg))
                if self.critic != self.built_cfg.critic:
                    ray.get(self.workers[w].set_critic.remote(self.critic))
                if self.verification_budget != self.built_cfg.critic.verification_budget:
                    ray.get(self.workers[w].set_verification_budget.remote(self.verification_budget))
                return
            except _WORKER_FAILURES:
                if time.monotonic() > deadline:
                    raise
                time.sleep(1.0)  # Ray is still restarting the actor: back off, then ask again

    def blame(self, trajectories: list[Trajectory], labels: list[dict[str, Any]], k: int,
              seed: int) -> list[BlameRecord]:
        """Verified blame of a labelled file's failed trajectories, shared out over the workers
        (trajectory by trajectory); records sorted by (trajectory_index, message_index)."""
        failed = [i for i, t in enumerate(trajectories) if not is_success(t.reward)]
        shares = [failed[w :: len(self.workers)] for w in range(len(self.workers))]
        refs = []
        for worker, share in zip(self.workers, shares):
            if share:
                keep = set(share)
                refs.append(worker.blame.remote(
                    {i: trajectories[i] for i in share}, [lab for lab in labels if lab["trajectory_index"] in keep],
                    k, seed))
        records = [r for part in ray.get(refs) for r in part]
        return sorted(records, key=lambda r: (r.trajectory_index, r.message_index))

    def benefit(self, cfg: CastConfig, tasks: list[int], split: str) -> BenefitReport:
        """:func:`~cast_rl.eval.net_benefit.measure_benefit` of ``tasks`` on the first worker (its
        policy and critic): one worker, so that every budget's episodes share one engine and the
        budgets compare like with like.  Its largest budget must have been set (the verifier)."""
        return ray.get(self.workers[0].benefit.remote(cfg, tasks, split))

    def update_weights(self, version: int, weights: Any, checksum: str) -> list[int]:
        """Every worker loads the published weights (``weights``: an object reference, one
        object-store put, many readers), or, given a broadcast ticket
        (``rollout.weight_sync=collective``), receives them from the learner over the
        weight-sync group."""
        if hasattr(weights, "deliver"):
            return weights.deliver(self.workers, self.cfg.inference.tensor_parallel_size)
        return ray.get([w.update_weights.remote(version, weights, checksum) for w in self.workers])

    def load_policy(self, cfg: CastConfig) -> bool:
        """Every worker serves ``cfg.policy.path`` as a restart on it would (version 0), its
        running engine loading the checkpoint's weights in place: seconds instead of an engine
        start.  Returns False, with nothing changed, when a worker cannot (another architecture
        or tokenizer, an adapter served): then the caller restarts the group.  A worker Ray
        restarts later is rebuilt on ``cfg.policy``."""
        path = cfg.policy.path
        if not all(ray.get([w.can_load_policy.remote(path) for w in self.workers])):
            return False
        ray.get([w.load_policy.remote(path) for w in self.workers])
        self.cfg = dataclasses.replace(self.cfg, policy=cfg.policy)
        self.built_cfg = dataclasses.replace(self.built_cfg, policy=cfg.policy)
        return True

    def set_verification_budget(self, budget: int) -> None:
        """Every worker runs later episodes with this many critique-revise rounds (0: no critic).

        Lets one group (one vLLM engine per worker) serve a sweep of budgets; call it between
        ``collect`` calls.
        """
        ray.get([w.set_verification_budget.remote(budget) for w in self.workers])
        self.verification_budget = budget

    def set_domain(self, cfg: CastConfig) -> None:
        """Every worker runs later episodes in ``cfg.env``'s domain (only ``env`` is read), on
        the engines it has, with the same critic and budget.

        Lets one group (one vLLM engine per worker) serve every domain of ``eval.domains``; call
        it between ``collect`` calls.  A restarted worker gets the domain again.
        """
        ray.get([w.set_domain.remote(cfg) for w in self.workers])
        self.cfg = dataclasses.replace(self.cfg, env=cfg.env)

    def set_critic(self, critic: CriticConfig) -> str:
        """Every worker consults ``critic`` from now on (same budget); returns its description.

        The pipeline switches from the rule critic to the one it trained this way, keeping the
        policy engines; call it between ``collect`` calls.
        """
        described = ray.get([w.set_critic.remote(critic) for w in self.workers])
        self.critic = critic
        return described[0]

    def metrics(self) -> dict[str, float]:
        """The workers' ``rollout/`` metrics merged (:func:`~cast_rl.rollout.worker.merge_worker_metrics`:
        counts and throughputs summed, per-episode rates weighted by episodes)."""
        return merge_worker_metrics(ray.get([w.metrics.remote() for w in self.workers]))

    def shutdown(self) -> None:
        """Close every engine, then end the actors (a dead worker is just ended)."""
        closing = [w.close.remote() for w in self.workers]
        for ref in closing:
            try:
                ray.get(ref, timeout=60)
            except Exception as exc:  # a crashed or hung worker: it is killed below anyway
                logger.warning("rollout worker did not close cleanly: %s", exc)
        for w in self.workers:
            ray.kill(w)
