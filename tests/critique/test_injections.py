"""Injected errors are found and typed: recall >= 95%, type accuracy >= 90%, zero leakage.

Every injection kind of :mod:`cast_rl.critique.inject` (missing confirmation, fabricated id,
unauthenticated access, an action the visible state forbids, a second customer, the wrong record
among visible ones, a lookup with an id of the wrong kind, wrong arguments, a once-only tool
repeated) on generated retail tasks and on the benchmark tasks of all four domains.  Tasks whose
own gold trajectory is already faulty are left out: their gold error would mask the injected one.
"""

from __future__ import annotations

import logging

import pytest
from critique_helpers import DOMAINS, benchmarks_dir, flawed_tasks, injection_scores

from cast_rl.critique.inject import EXPECTED
from cast_rl.envs.core import fixed_clock, load_domain_data
from cast_rl.envs.generate import write_retail

logger = logging.getLogger(__name__)


def _check(scores, labeller, min_cases: int) -> None:  # noqa: ANN001
    assert labeller.stats.leakage_drops == 0
    for kind, s in scores.items():
        logger.info("%s: %d cases, recall %.3f, type accuracy %.3f", kind, s["cases"],
                    s["detected"] / s["cases"], s["typed"] / s["cases"])
        assert s["detected"] / s["cases"] >= 0.95, (kind, s)
        assert s["typed"] / s["cases"] >= 0.90, (kind, s)
    assert sum(s["cases"] for s in scores.values()) >= min_cases


def test_injected_errors_on_generated_retail_tasks(tmp_path) -> None:  # noqa: ANN001
    write_retail(tmp_path / "retail", seed=1, num_tasks=40)
    data = load_domain_data("retail", tmp_path / "retail")
    tasks = [(split, i) for split in data.splits for i in range(len(data.tasks(split)))]
    scores, labeller = injection_scores(data, tasks, skip=set())
    assert set(scores) == set(EXPECTED)  # every kind has occasions in generated retail
    covered = {EXPECTED[k] for k in scores}
    assert covered == {"hallucination", "policy_violation", "wrong_tool_usage"}
    _check(scores, labeller, min_cases=200)


@pytest.mark.parametrize("domain", DOMAINS)
def test_injected_errors_on_benchmark_tasks(domain: str) -> None:
    root = benchmarks_dir()
    if not (root / "README.md").exists():
        pytest.skip(f"benchmark data not found at {root} (it lives beside the repo)")
    data = load_domain_data(domain, root / domain, clock=fixed_clock("2025-01-01T12:00:00"))
    tasks = [(split, i) for split in data.splits for i in range(len(data.tasks(split)))]
    if domain == "retail":
        tasks = tasks[::6]  # 106 of 635 tasks, spread over the splits, keeps the test short
    scores, labeller = injection_scores(data, tasks, skip=flawed_tasks(data, tasks))
    kinds_per_type = {EXPECTED[k] for k, s in scores.items() if s["cases"]}
    assert kinds_per_type == {"hallucination", "policy_violation", "wrong_tool_usage"}
    _check(scores, labeller, min_cases=60)
