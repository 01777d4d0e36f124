"""Gold trajectories of every benchmark task are labelled (almost) all valid, with no leakage.

The gold conversation (:func:`cast_rl.critique.gold.gold_trajectory`) is the task's gold actions
with authentication, status checks and confirmations done as each policy asks.  What stays
invalid are faults of the benchmark's gold actions themselves (documented in the benchmark
README: gift-card balances too low, refunds to a non-original method, ids the conversation never
shows, a cancellation the policy forbids), so the bound is 1% of all actions.
"""

from __future__ import annotations

import logging

import pytest
from critique_helpers import DOMAINS, benchmarks_dir

from cast_rl.critique.gold import gold_trajectory
from cast_rl.critique.labeller import Labeller
from cast_rl.envs.core import fixed_clock, load_domain_data
from cast_rl.envs.generate import write_retail

logger = logging.getLogger(__name__)


def test_gold_trajectories_of_every_benchmark_task_are_valid() -> None:
    root = benchmarks_dir()
    if not (root / "README.md").exists():
        pytest.skip(f"benchmark data not found at {root} (it lives beside the repo)")
    total = invalid = drops = 0
    report = {}
    for domain in DOMAINS:
        data = load_domain_data(domain, root / domain, clock=fixed_clock("2025-01-01T12:00:00"))
        labeller = Labeller(data)
        n = bad = 0
        for split in data.splits:
            for i in range(len(data.tasks(split))):
                labels = labeller.label(gold_trajectory(data, split, i), i)
                n += len(labels)
                bad += sum(label.verdict == "invalid" for label in labels)
        report[domain] = (bad, n)
        total, invalid, drops = total + n, invalid + bad, drops + labeller.stats.leakage_drops
        assert n > 0
    logger.info("gold invalid rate per domain: %s", {d: f"{b}/{n}" for d, (b, n) in report.items()})
    assert drops == 0
    assert invalid / total <= 0.01, report
    # each domain well under a few percent (its own gold faults only)
    assert all(b / n <= 0.04 for b, n in report.values()), report


def test_gold_trajectories_of_generated_retail_tasks_are_all_valid(tmp_path) -> None:  # noqa: ANN001
    write_retail(tmp_path / "retail", seed=3, num_tasks=40)
    data = load_domain_data("retail", tmp_path / "retail")
    labeller = Labeller(data)
    for split in data.splits:
        for i in range(len(data.tasks(split))):
            trajectory = gold_trajectory(data, split, i)
            assert trajectory.reward == 1.0
            labels = labeller.label(trajectory, i)
            assert [lab.to_json() for lab in labels if lab.verdict != "valid"] == []
    assert labeller.stats.leakage_drops == 0
