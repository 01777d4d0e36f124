"""Driver loops in-process: GRPO learns the toy task, resume is exact, async respects staleness."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from cast_rl.config.schema import CastConfig
from cast_rl.learner.checkpoint import latest_checkpoint, read_meta
from cast_rl.learner.engine import LearnerEngine
from cast_rl.learner.loop import LocalLearner, TaskCursor, TrainLoop
from cast_rl.learner.toy import HFCollector
from cast_rl.replay import ReplayBuffer

# GRPO on the first-token task: 8 tasks x 8 trials per step, one optimizer step per batch.
TOY = ("learner.lr=1e-2", "learner.micro_batch_size=32", "learner.global_batch_size=64",
       "rollout.trials_per_task=8")


def build_loop(cfg: CastConfig, run_dir: Path | None = None) -> TrainLoop:
    run_dir = Path(run_dir or cfg.run_dir)
    learner = LocalLearner(LearnerEngine(cfg))
    collector = HFCollector(cfg.policy.path, max_new_tokens=2, seed=cfg.seed)
    buffer = ReplayBuffer(cfg.replay, run_dir / "replay" / "log.jsonl", cfg.learner.global_batch_size)
    return TrainLoop(cfg, collector, learner, buffer, tasks=list(range(16)), split="toy")


def test_task_cursor_epochs_and_unique_trials() -> None:
    cursor = TaskCursor([0, 1, 2], "s", seed=1)
    units = cursor.next_units(6, 2)
    assert sorted(u[1] for u in units[:6]) == [0, 0, 1, 1, 2, 2]
    assert len(set(units)) == 12 and {u[2] for u in units[6:]} == {2, 3}
    again = TaskCursor([0, 1, 2], "s", seed=1, position=3)
    assert again.next_units(3, 2) == units[6:]


def test_grpo_raises_the_toy_reward_to_0_9(make_cfg) -> None:
    loop = build_loop(make_cfg(*TOY, "algorithm.steps=14"))
    history = loop.run()
    rewards = [round(h["train/reward_mean"], 3) for h in history]
    print("reward per step:", rewards)
    assert rewards[0] < 0.3
    assert statistics.fmean(rewards[-2:]) >= 0.9, rewards
    assert all(h["train/staleness_max"] == 0 for h in history)  # sync: always fresh


def test_resume_gives_the_same_losses_as_an_uninterrupted_run(make_cfg, tmp_path: Path) -> None:
    overrides = (*TOY, "learner.global_batch_size=16", "learner.micro_batch_size=8",
                 "rollout.trials_per_task=4", "learner.checkpoint_every=2", "algorithm.kl_coef=0.05")
    keys = ["train/loss", "train/pg_loss", "train/kl", "train/grad_norm", "train/reward_mean"]
    uninterrupted = build_loop(make_cfg(*overrides, run_dir=tmp_path / "a"))
    full = uninterrupted.run(4)
    stopped = build_loop(make_cfg(*overrides, run_dir=tmp_path / "b"))
    stopped.run(2)
    last = latest_checkpoint(tmp_path / "b")
    assert last is not None and read_meta(last)["step"] == 2
    resumed = build_loop(make_cfg(*overrides, run_dir=tmp_path / "b"))
    assert resumed.resume()
    tail = resumed.run(4)[-2:]
    assert len(tail) == 2
    for a, b in zip(full[2:], tail):
        for k in keys:
            assert b[k] == pytest.approx(a[k], abs=1e-5), k
    assert full[3]["train/kl"] > 0
    assert resumed.learner.version == 4
    a, b = (loop.learner.engine.full_state_dict() for loop in (uninterrupted, resumed))
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-5


def test_async_mode_stays_within_the_staleness_bound(make_cfg) -> None:
    cfg = make_cfg(*TOY, "learner.global_batch_size=16", "learner.micro_batch_size=16",
                   "rollout.trials_per_task=4", "algorithm.mode=async", "algorithm.steps=5",
                   "replay.max_staleness=1")
    loop = build_loop(cfg)
    history = loop.run()
    assert len(history) == 5
    assert max(h["train/staleness_max"] for h in history) <= 1
    snap = loop.buffer.snapshot()
    assert snap["consumed"] == 5 * 16
    assert snap["added"] == snap["consumed"] + snap["size"] + snap["dropped_stale"] + snap["dropped_capacity"]


def test_async_wait_policy_throttles_instead_of_dropping(make_cfg) -> None:
    cfg = make_cfg(*TOY, "learner.global_batch_size=16", "learner.micro_batch_size=16",
                   "rollout.trials_per_task=4", "algorithm.mode=async", "algorithm.steps=4",
                   "replay.max_staleness=1", "replay.stale_policy=wait", "replay.wait_timeout_s=120")
    loop = build_loop(cfg)
    history = loop.run()
    assert max(h["train/staleness_max"] for h in history) <= 1
    assert loop.buffer.snapshot()["dropped_stale"] == 0


class _ScriptedCollector:
    """Returns prepared collections in order (task outcomes chosen by the test)."""

    def __init__(self, collections: list[list]) -> None:
        self.collections = list(collections)

    def collect(self, units: list, tree: object = None) -> list:
        return self.collections.pop(0)

    def update_weights(self, version: int, weights: object, checksum: str) -> int:
        return version


class _CountingLearner:
    """Takes steps without a model: records the batches it was given."""

    version = 0

    def __init__(self) -> None:
        self.batches: list[list] = []

    def train_step(self, samples: list) -> dict[str, float]:
        self.batches.append(samples)
        self.version += 1
        return {"loss": 0.0}

    def publish_weights(self) -> tuple[int, object, str]:
        return self.version, {}, ""


def test_a_step_that_collects_twice_reports_both_collections(tmp_path: Path) -> None:
    """Dynamic sampling drops the first collection (one task, equal outcomes) and the loop
    collects again: the step's env steps, episodes and zero-variance share count both."""
    from test_learner_critique_samples import _traj

    from cast_rl.config import load_config

    cfg = load_config(None, [f"run_dir={tmp_path}", "learner.num_workers=1", "learner.micro_batch_size=2",
                             "learner.global_batch_size=2", "rollout.trials_per_task=2",
                             "learner.checkpoint_every=null", "logging.mode=disabled"])
    first = [_traj(0, 0, 1.0), _traj(0, 1, 1.0)]  # no signal: dropped
    second = [_traj(1, 0, 1.0), _traj(1, 1, 0.0)]
    learner = _CountingLearner()
    buffer = ReplayBuffer(cfg.replay, tmp_path / "replay" / "log.jsonl", 2)
    loop = TrainLoop(cfg, _ScriptedCollector([first, second]), learner, buffer, tasks=[0, 1], split="test")
    (out,) = loop.run(1)
    assert len(learner.batches) == 1 and {s.reward for s in learner.batches[0]} == {0.0, 1.0}
    per_episode = 3  # each _traj ran 3 actions (the plain turns)
    assert out["train/collections"] == 2 and out["train/episodes"] == 4
    assert out["train/env_steps"] == 4 * per_episode
    assert out["rollout/zero_variance_group_frac"] == 0.5
    assert out["train/reward_mean"] == 0.75


class _RefCollector(_ScriptedCollector):
    """Hands out each prepared collection as one 'reference' (its position in a store the
    buffer reads), with the episodes' summaries; ``collect`` by value must not be called."""

    def __init__(self, collections: list[list], store: dict[int, list]) -> None:
        super().__init__(collections)
        self.store = store

    def collect(self, units: list, tree: object = None) -> list:
        raise AssertionError("the loop asked for the trajectories by value")

    def collect_refs(self, units: list, tree: object = None) -> tuple[list, list]:
        trajs = self.collections.pop(0)
        self.store[len(self.store)] = trajs
        return [len(self.store) - 1], [t.summary() for t in trajs]


class _StoreBuffer(ReplayBuffer):
    """The in-process buffer with the Ray buffer's by-reference entry point."""

    def __init__(self, store: dict[int, list], *args: object) -> None:
        super().__init__(*args)
        self.store = store

    def add_collection(self, handles: list, build):  # noqa: ANN001, ANN201
        trajs = [t for h in handles for t in self.store[h]]
        return self.add(build(trajs), trajs)


def test_the_loop_hands_a_collection_by_reference_when_both_sides_can(tmp_path: Path) -> None:
    """A collector with ``collect_refs`` and a buffer with ``add_collection``: the driver never
    reads a trajectory, the buffer builds the same samples, the step's metrics come from the
    summaries and equal the by-value loop's."""
    from test_learner_critique_samples import _traj

    from cast_rl.config import load_config

    cfg = load_config(None, [f"run_dir={tmp_path}", "learner.num_workers=1", "learner.micro_batch_size=2",
                             "learner.global_batch_size=2", "rollout.trials_per_task=2",
                             "learner.checkpoint_every=null", "logging.mode=disabled"])
    runs = []
    for by_ref in (False, True):
        collections = [[_traj(0, 0, 1.0), _traj(0, 1, 1.0)], [_traj(1, 0, 1.0), _traj(1, 1, 0.0)]]
        store: dict[int, list] = {}
        log = tmp_path / str(by_ref) / "log.jsonl"
        collector = _RefCollector(collections, store) if by_ref else _ScriptedCollector(collections)
        buffer = _StoreBuffer(store, cfg.replay, log, 2) if by_ref else ReplayBuffer(cfg.replay, log, 2)
        learner = _CountingLearner()
        (out,) = TrainLoop(cfg, collector, learner, buffer, tasks=[0, 1], split="test").run(1)
        runs.append((out, [[(s.key, s.advantage) for s in b] for b in learner.batches], log.read_bytes()))
    (by_value, batches_v, log_v), (by_ref, batches_r, log_r) = runs
    assert batches_r == batches_v and log_r == log_v
    keys = ("train/episodes", "train/collections", "train/env_steps", "train/reward_mean",
            "rollout/zero_variance_group_frac", "rollout/critique_rounds", "train/root_reward_mean")
    assert {k: by_ref[k] for k in keys} == {k: by_value[k] for k in keys}
    assert by_ref["train/episodes"] == 4
