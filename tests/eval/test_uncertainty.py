"""Intervals for pass^k: coverage by simulation, paired differences, hand-checked edge cases.

The coverage tests draw suites from a pool of tasks whose success probabilities are known, run
n = 4 trials of each task, and count how often the 95% interval contains the pool's true pass^k
(the mean over the pool of p^k).  With R replicates the Monte-Carlo standard error of a
coverage near 0.95 is sqrt(0.95 * 0.05 / R) (0.0049 at R = 2000); the stated tolerance,
``COVERAGE_TOLERANCE`` = 0.025, is five of those, and holds the method's own small-sample bias.
Seeds are fixed, so the counts are the same on every run.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from cast_rl.eval.uncertainty import (
    mean_interval,
    minimum_detectable_difference,
    paired_difference,
    passk_interval,
    t_quantile,
    task_passk,
)

N_TRIALS = 4
REPLICATES = 2000
RESAMPLES = 1000
COVERAGE_TOLERANCE = 0.025


def _pool(seed: int, size: int = 400) -> np.ndarray:
    """Known success probabilities: a U-shaped spread (many easy and many hard tasks), as in
    real suites, from Beta(0.7, 0.7)."""
    return np.random.default_rng(seed).beta(0.7, 0.7, size)


@pytest.mark.parametrize(("tasks", "k"), [(18, 1), (20, 1), (20, 2), (40, 2)])
def test_passk_interval_covers_95_percent(tasks: int, k: int) -> None:
    pool = _pool(seed=1)
    truth = float(np.mean(pool**k))
    rng = np.random.default_rng(2)
    covered = 0
    for r in range(REPLICATES):
        p = rng.choice(pool, size=tasks)
        successes = rng.binomial(N_TRIALS, p)
        low, high = mean_interval(task_passk(successes, N_TRIALS, k), resamples=RESAMPLES, seed=r)
        covered += low <= truth <= high
    coverage = covered / REPLICATES
    assert abs(coverage - 0.95) <= COVERAGE_TOLERANCE, f"coverage {coverage:.3f} at {tasks} tasks, k={k}"


def test_paired_difference_covers_95_percent() -> None:
    """B is A with every task made easier by a task-specific amount: the two are correlated,
    and pairing is what keeps the interval honest and narrow."""
    pool_a = _pool(seed=3)
    pool_b = np.clip(pool_a + np.random.default_rng(4).uniform(0.0, 0.2, pool_a.size), 0.0, 1.0)
    truth = float(np.mean(pool_b - pool_a))
    rng = np.random.default_rng(5)
    covered, widths, unpaired = 0, [], []
    for r in range(REPLICATES):
        idx = rng.integers(0, pool_a.size, 20)
        a = dict(enumerate(rng.binomial(N_TRIALS, pool_a[idx]).tolist()))
        b = dict(enumerate(rng.binomial(N_TRIALS, pool_b[idx]).tolist()))
        out = paired_difference(b, a, N_TRIALS, N_TRIALS, [1])["pass^k"]["pass^1"]
        low, high = out["ci"]
        covered += low <= truth <= high
        widths.append(high - low)
        if r < 200:  # what ignoring the pairing would give: the two intervals' widths combined
            wa, wb = (np.diff(mean_interval(task_passk(list(x.values()), N_TRIALS, 1), resamples=RESAMPLES, seed=r))
                      for x in (a, b))
            unpaired.append(float(np.hypot(wa, wb)[0]))
    coverage = covered / REPLICATES
    assert abs(coverage - 0.95) <= COVERAGE_TOLERANCE, f"paired coverage {coverage:.3f}"
    assert np.median(widths) < 0.75 * np.median(unpaired)


def test_t_quantile_matches_tables() -> None:
    # Student-t 0.975 quantiles from printed tables
    for dof, exact in ((5, 2.5706), (10, 2.2281), (17, 2.1098), (19, 2.0930), (39, 2.0227)):
        assert t_quantile(0.975, dof) == pytest.approx(exact, abs=3e-3)


def test_degenerate_and_hand_checked_values() -> None:
    # every task gave the same value: a zero-width interval at that value
    assert mean_interval([0.0] * 18) == (0.0, 0.0)
    assert passk_interval([4] * 5, 4, [1, 4]) == {"pass^1": [1.0, 1.0], "pass^4": [1.0, 1.0]}
    # the per-task estimate C(c, k) / C(n, k): c = 3 of 4, k = 2 -> 3 / 6
    assert task_passk([3, 0, 4], 4, 2).tolist() == [0.5, 0.0, 1.0]
    with pytest.raises(ValueError, match="success counts"):
        task_passk([5], 4, 1)
    # the interval stays inside what any resample can give and contains the estimate
    values = [0.0, 0.25, 1.0, 1.0, 0.5, 0.0, 0.75, 1.0, 0.0, 0.25]
    low, high = mean_interval(values)
    assert 0.0 <= low < float(np.mean(values)) < high <= 1.0
    assert mean_interval(values) == (low, high)  # the fixed seed: the same every time
    # MDD = (1.95996 + 0.84162) * se
    assert minimum_detectable_difference(0.1) == pytest.approx(0.280158, abs=1e-5)
    assert minimum_detectable_difference(0.0) is None


def test_paired_difference_uses_common_tasks_only() -> None:
    a = {"0": 4, "1": 0, "2": 4, "3": 2}
    b = {"0": 4, "1": 0, "2": 0, "9": 4}
    out = paired_difference(a, b, 4, 4, [1, 2])
    assert out["tasks"] == 3
    d1 = out["pass^k"]["pass^1"]
    assert d1["difference"] == pytest.approx(1 / 3)  # per task: 0, 0, 1
    assert d1["ci"][0] == pytest.approx(0.0) and d1["ci"][1] == pytest.approx(1.0)
    assert d1["includes_zero"] is True
    se = math.sqrt(np.var([0, 0, 1], ddof=1) / 3)
    assert d1["mdd"] == pytest.approx(minimum_detectable_difference(se))
    with pytest.raises(ValueError, match="share none"):
        paired_difference({"0": 1}, {"1": 1}, 4, 4, [1])
