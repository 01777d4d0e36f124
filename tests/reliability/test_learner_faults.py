"""Kill a learner worker mid-run: the run rebuilds the group, resumes from its checkpoint, finishes.

Real parts: a local Ray, two FSDP learner workers over gloo (:class:`actors.learner.LearnerGroup`),
the replay-buffer actor with its log, a transformers sampler actor as the collector (the toy
first-token task, as ``launchers/train.py --collector toy`` runs it) and the
:class:`~cast_rl.learner.supervisor.Supervisor` that ``launchers/train.py`` wraps its loop in.
During step 4 (checkpoints every 2 steps) the collector hook kills learner rank 1.  The run must
resume from step 2 by itself, replay step 3 on the same batch and reach the same weights, and
finish step 5; the rollout side sees versions 1, 2, 3, 4, 5 exactly once each, and every sample
the buffer accepted is accounted for (lost = 0).

Marked ``slow``: 45-75 s on two shared cores (two learner groups start).

    .venv/bin/python -m pytest tests/reliability/test_learner_faults.py -q -m slow
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import torch
from reliability_helpers import lost_and_duplicated

from cast_rl.config import load_config
from cast_rl.config.schema import ReplayBufferConfig
from cast_rl.learner.checkpoint import latest_checkpoint, read_meta
from cast_rl.replay import ReplayBuffer

pytestmark = pytest.mark.slow

STEPS, KILL_ROUND, GBS = 5, 3, 16


@pytest.fixture(scope="module")
def small_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen3 with the base corpus only (small vocabulary: quick steps on two cores)."""
    from cast_rl.models.tiny import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("models") / "tiny", seed=0)


class KillLearnerDuringRound:
    """Collector hook: when round ``at`` is collected, kill learner worker ``rank``."""

    def __init__(self, collector: Any, at: int, rank: int = 1) -> None:
        self.collector, self.at, self.rank = collector, at, rank
        self.loop: Any = None
        self.rounds = 0
        self.killed: list[Any] = []
        self.versions: list[int] = []
        """Versions whose weights the collector actually loaded, in order."""

    def collect(self, units: list[tuple[str, int, int]], tree: Any = None) -> Any:
        import ray

        if self.rounds == self.at and not self.killed:
            victim = self.loop.learner.workers[self.rank]
            self.killed.append(victim)
            ray.kill(victim)  # a learner rank dies between its collectives
        self.rounds += 1
        return self.collector.collect(units, tree=tree)

    def update_weights(self, version: int, weights: Any, checksum: str) -> Any:
        out = self.collector.update_weights(version, weights, checksum)  # refuses old versions
        self.versions.append(version)
        return out


def test_killed_learner_worker_resumes_from_checkpoint_and_finishes(
    ray_local, small_model_dir: Path, tmp_path: Path  # noqa: ANN001
) -> None:
    from actors.learner import LearnerGroup
    from actors.replay_buffer import ReplayBufferClient
    from actors.supervision import ray_supervisor
    from cast_rl.learner.loop import TrainLoop
    from cast_rl.learner.supervisor import MonotoneCollector
    from launchers.train import HFCollectorClient

    run_dir = tmp_path / "run"
    cfg = load_config(None, [
        f"policy.path={small_model_dir}", f"run_dir={run_dir}", "logging.mode=disabled",
        "learner.num_workers=2", "learner.num_cpus_per_worker=0.5", "learner.micro_batch_size=4",
        f"learner.global_batch_size={GBS}", "learner.lr=1e-3", "learner.checkpoint_every=2",
        "learner.max_restarts=2", "rollout.trials_per_task=4", f"algorithm.steps={STEPS}",
        # one collection per step, one global batch per draw: the step/round/draw bookkeeping
        # below counts on it (dynamic sampling would re-collect and draw what it holds)
        "algorithm.filter_zero_variance_groups=false",
    ])
    torch.set_num_threads(1)
    hook = KillLearnerDuringRound(HFCollectorClient(cfg.policy.path, seed=cfg.seed, num_cpus=0.5), at=KILL_ROUND)
    collector = MonotoneCollector(hook)
    log = run_dir / "replay" / "log.jsonl"
    buffer = ReplayBufferClient(cfg.replay, log, GBS, max_restarts=cfg.learner.max_restarts)
    loop = TrainLoop(cfg, collector, LearnerGroup(cfg), buffer, list(range(16)), split="toy")
    hook.loop = loop
    supervisor = ray_supervisor(loop, lambda: LearnerGroup(cfg), cfg.learner.max_restarts)
    try:
        history = supervisor.run()
        # the run healed itself once and finished every step
        assert len(hook.killed) == 1 and supervisor.restarts == 1
        assert supervisor.failures[0].startswith(f"step {KILL_ROUND + 1}:")
        assert loop.state.step == STEPS == len(history) and loop.learner.version == STEPS
        assert loop.learner.workers[1] is not hook.killed[0]
        meta = read_meta(latest_checkpoint(run_dir))
        assert (meta["step"], meta["policy_version"], meta["replay_cursor"]) == (4, 4, 4)
        # rollout side: every version once, in order, no gap, no reversal
        assert hook.versions == collector.published == list(range(1, STEPS + 1))
        # the resumed learner republished nothing it had published: it recomputed versions 2
        # (from the step-2 checkpoint) and 3 (step 3 replayed) and reached the same weights
        assert sorted(collector.skipped) == [2, 3]
        assert all(collector.skipped[v] == collector.checksums[v] for v in collector.skipped)
    finally:
        loop.learner.shutdown()
        ray_local.kill(buffer.handle)
        ray_local.kill(hook.collector.handle)

    # The replay log: every accepted sample is drawn, held or dropped with a reason (lost = 0),
    # and the draws undone by the resume were served again, batch for batch.
    records = [json.loads(line) for line in log.read_text().splitlines()]
    accepted = [r["sample"]["key"] for r in records if r["op"] == "add"]
    rewinds = [i for i, r in enumerate(records) if r["op"] == "rewind"]
    assert [records[i]["to"] for i in rewinds] == [2]
    draws: dict[int, list[list[str]]] = defaultdict(list)
    for r in records:
        if r["op"] == "consume":
            draws[r["seq"]].append(r["keys"])
    assert sorted(draws) == list(range(1, STEPS + 1))
    assert all(len(batches) == 2 and batches[0] == batches[1] for seq, batches in draws.items() if seq in (3, 4))
    final_lineage = [key for seq in sorted(draws) for key in draws[seq][-1]]
    snap = ReplayBuffer(ReplayBufferConfig(), log).snapshot()
    lost = snap["added"] - snap["consumed"] - snap["dropped_stale"] - snap["dropped_capacity"] - snap["size"]
    assert lost == 0 and snap["added"] == len(accepted) == len(set(accepted))
    assert snap["consumed"] == len(final_lineage) == STEPS * GBS
    assert lost_and_duplicated(final_lineage, final_lineage) == (0, 0)
    assert snap["duplicates"] > 0  # the replayed rounds' samples came back and were ignored
