"""Driver loops: collect, label, update, sync, checkpoint — synchronous or asynchronous.

``algorithm.mode=sync``: each step collects ``tasks_per_step`` tasks x ``trials_per_task`` trials
with the current weights, turns them into samples, puts them in the replay buffer, draws one
global batch, takes one optimizer step and publishes the new weights to the collector.

``algorithm.mode=async``: a producer thread keeps collecting (and adding to the buffer) while the
learner trains; the learner draws whatever fresh samples are there.  The replay buffer enforces
the staleness bound (drop, or throttle the producer under ``replay.stale_policy=wait``).  New
weights reach the collector between its collections.

Checkpoints (every ``learner.checkpoint_every`` steps) hold the learner's shards, the data cursor
and the replay cursor; :meth:`TrainLoop.resume` restores them and rewinds the buffer, so a sync
run resumes exactly.  In async mode, tasks handed to a collection that was still running at the
checkpoint are not collected again after a resume (skipped, never duplicated).

A collection's trajectories cross the cluster once.  With a Ray rollout group and the Ray replay
buffer (:class:`RefCollector` and :class:`CollectionBuffer`), the driver asks the group for the
workers' result references and episode summaries only, and hands the references to the buffer's
actor with the sample recipe (:func:`~cast_rl.samples.builders.build_samples` bound to the
config and the collection's round id): the actor receives the trajectories from the workers'
object stores, builds the samples and logs both; the driver keeps the summaries for the step's
metrics.  In process, the loop builds the samples and adds them with the trajectories.

The loop talks to three parts through small interfaces, in-process or Ray alike:
a collector (:class:`cast_rl.rollout.collector.Collector`: ``collect(units, tree=None)``,
``update_weights(version, weights, checksum)``; the rollout group, or
:class:`cast_rl.learner.toy.HFCollector`), a learner (:class:`LocalLearner` here, or
:class:`actors.learner.LearnerGroup`), and a replay buffer (:class:`cast_rl.replay.ReplayBuffer`,
or a client of :class:`actors.replay_buffer.ReplayBufferActor`).
"""

from __future__ import annotations

import dataclasses
import logging
import random
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from cast_rl.config.schema import CastConfig, ScheduleConfig
from cast_rl.inference.weight_sync import state_checksum
from cast_rl.learner import checkpoint
from cast_rl.records import EpisodeSummary
from cast_rl.rollout.collector import Collector, Tree, Unit
from cast_rl.samples import Sample, batch_metrics  # batch_metrics: importable from here too
from cast_rl.samples.builders import build_samples, zero_variance_groups
from cast_rl.telemetry.metrics import MetricsLogger

logger = logging.getLogger(__name__)


class Learner(Protocol):
    version: int

    def train_step(self, samples: list[Sample]) -> dict[str, float]: ...
    def publish_weights(self) -> tuple[int, Any, str]: ...
    def save_checkpoint(self, path: str | Path) -> None: ...
    def load_checkpoint(self, path: str | Path, version: int) -> None: ...


@runtime_checkable
class ShardDrawer(Protocol):
    """A replay buffer that draws a global batch where it lives, already split into
    ``shards`` parts: returns the batch's :func:`batch_metrics` and one handle per shard (the
    Ray buffer's object references), so the samples never pass through the driver."""

    def draw(self, n: int, learner_version: int, shards: int) -> tuple[dict[str, float], list[Any]]: ...


@runtime_checkable
class RefCollector(Protocol):
    """A collector whose trajectories can stay where they were made: ``collect_refs`` returns,
    for a collection, handles of the trajectories (the Ray rollout group: its workers' result
    object references, whose values concatenated hold one trajectory per unit, tree
    continuations after their root) and the episodes' summaries."""

    def collect_refs(self, units: list[Unit], tree: Tree | None = None) -> tuple[list[Any], list[EpisodeSummary]]: ...


@runtime_checkable
class CollectionBuffer(Protocol):
    """A replay buffer that takes a collection by its handles and builds its samples itself:
    ``build(trajectories, advantages=...)`` gives the samples (the actor supplies how advantages
    are computed, so it stays torch-free)."""

    def add_collection(self, handles: list[Any], build: Callable[..., list[Sample]]) -> Any: ...


@runtime_checkable
class ShardLearner(Protocol):
    """A learner whose ranks each take their shard of a global batch by handle."""

    world_size: int

    def train_shards(self, shards: list[Any]) -> dict[str, float]: ...


class LocalLearner:
    """An in-process :class:`~cast_rl.learner.engine.LearnerEngine` behind the learner interface."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    @property
    def version(self) -> int:
        return self.engine.version

    def train_step(self, samples: list[Sample]) -> dict[str, float]:
        return self.engine.train_step(samples)

    def set_lr(self, lr: float) -> None:
        self.engine.set_lr(lr)

    def set_schedule(self, schedule: ScheduleConfig, lr: float, total_steps: int) -> None:
        self.engine.set_schedule(schedule, lr, total_steps)

    def publish_weights(self) -> tuple[int, Any, str]:
        lora = self.engine.cfg.learner.lora
        if lora.enabled and lora.sync == "adapter":
            update = self.engine.adapter_update()
            return self.engine.version, update, update.checksum
        state = self.engine.full_state_dict()
        return self.engine.version, state, state_checksum(state)

    def save_checkpoint(self, path: str | Path) -> None:
        self.engine.save_checkpoint(path)

    def load_checkpoint(self, path: str | Path, version: int) -> None:
        self.engine.load_checkpoint(path, version)


@dataclass
class TaskCursor:
    """Tasks in seeded shuffled epochs; ``position`` (tasks handed out so far) is the data cursor."""

    tasks: list[int]
    split: str
    seed: int = 0
    position: int = 0

    def next_units(self, n_tasks: int, trials: int) -> list[Unit]:
        """``n_tasks`` tasks x ``trials`` trials; trial numbers never repeat for a task."""
        import random

        units = []
        for _ in range(n_tasks):
            epoch, i = divmod(self.position, len(self.tasks))
            order = list(self.tasks)
            random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
            units += [(self.split, order[i], epoch * trials + j) for j in range(trials)]
            self.position += 1
        return units


@dataclass
class LoopState:
    step: int = 0
    """Optimizer steps completed."""
    rounds: int = 0
    """Collections done (names GRPO groups)."""


def tasks_per_step(cfg: CastConfig) -> int:
    if cfg.algorithm.tasks_per_step is not None:
        return cfg.algorithm.tasks_per_step
    return max(1, cfg.learner.global_batch_size // cfg.rollout.trials_per_task)


def collection_metrics(collections: list[list[EpisodeSummary]]) -> dict[str, float]:
    """What the collections behind one optimizer step cost and held: counts summed over all of
    them (a sync step collects again while dynamic sampling leaves it short of a batch), means
    over their episodes, and zero-variance groups counted within each collection."""
    episodes = [e for c in collections for e in c]
    if not episodes:
        return {}
    zero, groups = (sum(x) for x in zip(*(zero_variance_groups(c) for c in collections if c)))
    roots = [e for e in episodes if not e.continuation]
    return {
        "train/reward_mean": statistics.fmean(e.reward for e in episodes),
        "train/episodes": float(len(episodes)),
        "train/collections": float(sum(1 for c in collections if c)),
        # environment steps the collections cost (a tree continuation counts only what follows
        # its branch point): the x axis for comparing tree and plain collection
        "train/env_steps": float(sum(e.env_steps for e in episodes)),
        "train/root_reward_mean": statistics.fmean(e.reward for e in roots) if roots else 0.0,
        "rollout/critique_rounds": float(sum(e.critique_rounds for e in episodes)),
        "rollout/zero_variance_group_frac": zero / groups,
    }


def _newer(version: list[int], than: int, stop: threading.Event) -> bool:
    return version[0] > than or stop.is_set()


class TrainLoop:
    """Runs ``algorithm.steps`` optimizer steps in sync or async mode (see the module doc)."""

    def __init__(self, cfg: CastConfig, collector: Collector, learner: Learner, buffer: Any,
                 tasks: list[int], metrics: MetricsLogger | None = None, split: str | None = None) -> None:
        self.cfg = cfg
        self.collector = collector
        self.learner = learner
        self.buffer = buffer
        self.metrics = metrics
        self.cursor = TaskCursor(list(tasks), split or cfg.env.split, seed=cfg.learner.seed)
        self.state = LoopState()
        # Dynamic sampling needs the sync loop's re-collection: in async mode a filtered
        # collection could leave a staleness-bounded buffer short of a batch for good.
        algo = cfg.algorithm
        self._sample_cfg = cfg if algo.mode == "sync" else dataclasses.replace(
            cfg, algorithm=dataclasses.replace(algo, filter_zero_variance_groups=False))
        self.history: list[dict[str, float]] = []
        self._lock = threading.Lock()  # cursor and round counter, shared with the producer thread
        self._collections: list[list[EpisodeSummary]] = []  # since the last finished step

    # ------------------------------------------------------------------ named steps

    def collect_and_label(self) -> tuple[list[EpisodeSummary], int]:
        """Collect one round of episodes and add their samples to the buffer (by reference
        when both sides can, see the module doc); returns the episodes' summaries and how many
        samples the buffer accepted."""
        with self._lock:
            units = self.cursor.next_units(tasks_per_step(self.cfg), self.cfg.rollout.trials_per_task)
            round_id = f"r{self.state.rounds}"
            self.state.rounds += 1
        algo = self.cfg.algorithm
        # step_groups: tree rollouts, continuations from decision points
        tree = (algo.tree_branches, algo.tree_points) if "step_groups" in algo.samples else None
        recipe = partial(build_samples, cfg=self._sample_cfg, round_id=round_id)
        if isinstance(self.collector, RefCollector) and isinstance(self.buffer, CollectionBuffer):
            handles, summaries = self.collector.collect_refs(units, tree=tree)
            added = self.buffer.add_collection(handles, recipe)
        else:
            trajs = self.collector.collect(units, tree=tree)
            added = self.buffer.add(recipe(trajs), trajs)  # the log refers to the trajectories' tokens
            summaries = [t.summary() for t in trajs]
        with self._lock:
            self._collections.append(summaries)
        return summaries, added.accepted

    def update(self, size: int | None = None) -> dict[str, float]:
        """Draw a global batch (``size`` samples, default the configured one) and take one step."""
        t0 = time.perf_counter()
        version = self.learner.version
        n = size or self.cfg.learner.global_batch_size
        if isinstance(self.buffer, ShardDrawer) and isinstance(self.learner, ShardLearner):
            # buffer -> learner ranks directly (object references); the driver sees the metrics
            out, shards = self.buffer.draw(n, version, self.learner.world_size)
            wait_s = time.perf_counter() - t0
            step = self.learner.train_shards(shards)
        else:
            batch = self.buffer.sample(n, version)
            wait_s = time.perf_counter() - t0
            out = batch_metrics(batch, version)
            step = self.learner.train_step(batch)
        out.update({f"train/{k}": v for k, v in step.items()})
        self.buffer.set_learner_version(self.learner.version)  # producers see it before the sync
        out["train/batch_wait_s"] = wait_s
        return out

    def sync(self) -> dict[str, float]:
        """Publish the learner's weights to the collector (loud on failure)."""
        t0 = time.perf_counter()
        version, weights, checksum = self.learner.publish_weights()
        self.collector.update_weights(version, weights, checksum)
        self.buffer.set_learner_version(version)
        return {"train/sync_s": time.perf_counter() - t0}

    def checkpoint(self) -> Path:
        path = checkpoint.checkpoint_dir(self.cfg.run_dir, self.state.step)
        self.learner.save_checkpoint(path)
        with self._lock:
            meta = {"step": self.state.step, "rounds": self.state.rounds,
                    "policy_version": self.learner.version, "data_cursor": self.cursor.position,
                    "replay_cursor": self.buffer.cursor()}
        checkpoint.write_meta(path, meta)
        logger.info("checkpoint at step %d: %s", self.state.step, path)
        return path

    def resume(self, path: str | Path | None = None) -> bool:
        """Restore from ``path`` or the latest complete checkpoint; False when there is none."""
        path = Path(path) if path else checkpoint.latest_checkpoint(self.cfg.run_dir)
        if path is None:
            return False
        meta = checkpoint.read_meta(path)
        self.learner.load_checkpoint(path, meta["policy_version"])
        restored = self.buffer.rewind(meta["replay_cursor"])
        self.cursor.position = meta["data_cursor"]
        self.state = LoopState(step=meta["step"], rounds=meta["rounds"])
        self.sync()
        logger.info("resumed from %s at step %d (%d samples put back in the buffer)", path, self.state.step, restored)
        return True

    def _finish_step(self, out: dict[str, float], t0: float) -> None:
        self.state.step += 1
        with self._lock:
            collections, self._collections = self._collections, []
        out.update(collection_metrics(collections))
        out.update({f"train/replay_{k}": float(v) for k, v in self.buffer.snapshot().items()})
        out["train/step_s"] = time.perf_counter() - t0
        self.history.append(out)
        if self.metrics is not None:
            self.metrics.log(out, step=self.state.step)
        every = self.cfg.learner.checkpoint_every
        if every is not None and self.state.step % every == 0:
            self.checkpoint()

    # ------------------------------------------------------------------ loops

    def run(self, steps: int | None = None) -> list[dict[str, float]]:
        """Train until ``steps`` (default ``algorithm.steps``) optimizer steps are done in total."""
        total = self.cfg.algorithm.steps if steps is None else steps
        if self.cfg.algorithm.mode == "sync":
            self._run_sync(total)
        else:
            self._run_async(total)
        return self.history

    def _run_sync(self, total: int) -> None:
        """Collect, update, sync.  Dynamic sampling can leave a collection short of a batch (its
        zero-variance groups dropped): collect again, up to ``algorithm.max_collections_per_step``
        times, then train on everything held, so no sample outlives the weights that made it."""
        while self.state.step < total:
            t0 = time.perf_counter()
            held = 0
            for _ in range(self.cfg.algorithm.max_collections_per_step):
                held += self.collect_and_label()[1]
                if held >= self.cfg.learner.global_batch_size:
                    break
            if held == 0:  # nothing to learn from this step's episodes; the weights stay
                out = {**batch_metrics([], self.learner.version), "train/skipped_empty": 1.0}
            else:
                out = self.update(held)
                out.update(self.sync())
            self._finish_step(out, t0)

    def _run_async(self, total: int) -> None:
        stop = threading.Event()
        failure: list[BaseException] = []
        n_units = tasks_per_step(self.cfg) * self.cfg.rollout.trials_per_task
        weights = threading.Condition()
        collector_version = [self.learner.version]

        def produce() -> None:
            try:
                while not stop.is_set():
                    with weights:
                        held = collector_version[0]
                    if self.buffer.admit(held, n_units):
                        self.collect_and_label()
                        continue
                    with weights:  # refused (its weights are too old): wait for newer ones
                        weights.wait_for(partial(_newer, collector_version, held, stop))
            except BaseException as exc:  # noqa: BLE001 - re-raised in the driver thread
                failure.append(exc)
                self.buffer.close(f"producer failed: {exc!r}")

        producer = threading.Thread(target=produce, name="collector", daemon=True)
        producer.start()
        try:
            while self.state.step < total:
                t0 = time.perf_counter()
                out = self.update()
                out.update(self.sync())
                with weights:
                    collector_version[0] = self.learner.version
                    weights.notify_all()
                self._finish_step(out, t0)
        except BaseException:
            if failure:
                raise failure[0] from None
            raise
        finally:
            stop.set()
            with weights:
                weights.notify_all()
            self.buffer.close("training finished")
            producer.join()
        if failure:
            raise failure[0]


def critic_learner_config(cfg: CastConfig, base: str | Path) -> CastConfig:
    """The learner config of the critic's training (stage train_critic, and the benches that train
    a critic as it does): the model at ``base``, ``pipeline.critic_lr``, and up to
    ``pipeline.critic_micro_batch_size`` examples per pass (None: ``learner.micro_batch_size``),
    rounded down to a divisor of a rank's share of the global batch
    (:meth:`~cast_rl.config.learner.LearnerConfig.with_micro_batch`)."""
    pipe = cfg.pipeline
    learner = dataclasses.replace(cfg.learner, lr=pipe.critic_lr)
    if pipe.critic_micro_batch_size is not None:
        learner = learner.with_micro_batch(pipe.critic_micro_batch_size)
    return dataclasses.replace(cfg, policy=dataclasses.replace(cfg.policy, path=str(base)), learner=learner)


def train_critic_phase(learner: Any, samples: list[Sample], cfg: CastConfig, log: MetricsLogger) -> list[float]:
    """The critic's training phase on ``learner`` (built from :func:`critic_learner_config`):
    ``pipeline.critic_train_steps`` optimizer steps (or ``pipeline.critic_epochs`` passes) of
    ``learner.global_batch_size`` examples, the learning rate following ``pipeline.critic_schedule``
    up to ``pipeline.critic_lr``; returns the losses (logged as ``train/critic_*``)."""
    from cast_rl.learner.schedule import phase_steps

    pipe, batch = cfg.pipeline, cfg.learner.global_batch_size
    steps = phase_steps(pipe.critic_train_steps, pipe.critic_epochs, len(samples), batch)
    return train_supervised(learner, samples, steps, batch, log, "critic", cfg.learner.seed,
                            schedule=pipe.critic_schedule, lr=pipe.critic_lr)


def train_supervised(
    learner: Any, samples: list[Sample], steps: int, batch_size: int, log: MetricsLogger, tag: str, seed: int,
    schedule: ScheduleConfig | None = None, lr: float | None = None,
) -> list[float]:
    """The one supervised loop (the pipeline's warm-start, critique-aware SFT, the RFT arm and
    the critic's training; the benches that train a critic): ``steps`` optimizer steps of
    ``batch_size`` over shuffled passes of ``samples``; returns the losses.  With
    ``schedule``, the learning rate follows it over the ``steps``, peaking at ``lr``; without, it
    stays as the learner has it."""
    if not samples:
        raise ValueError(f"{tag}: no supervised samples to train on")
    if schedule is not None:
        if lr is None:
            raise ValueError(f"{tag}: a schedule needs the learning rate it peaks at (lr)")
        learner.set_schedule(schedule, lr, steps)
    rng, order, losses = random.Random(seed), [], []
    for step in range(steps):
        if len(order) < batch_size:
            order += rng.sample(samples, len(samples))
        batch, order = order[:batch_size], order[batch_size:]
        out = learner.train_step(batch)
        losses.append(out["supervised_loss"])
        log.log({f"train/{tag}_loss": out["supervised_loss"], f"train/{tag}_grad_norm": out["grad_norm"],
                 f"train/{tag}_tokens_per_s": out["tokens_per_s"], f"train/{tag}_lr": out["lr"],
                 **{f"train/{tag}_{k}": out[k] for k in ("verdict_loss", "explanation_loss") if k in out}}, step=step)
    return losses
