"""How far pass^k can be trusted: bootstrap intervals over tasks, paired differences, and the
smallest difference a suite can detect.

The suites are small (telecom has 18 tasks, telehealth 20), so one task moves pass^k by about
5 points.  Everything here treats the suite's tasks as a sample from the tasks one cares about
and resamples *tasks* (never single trials: the n trials of a task stay together):

* :func:`passk_interval`: a 95% interval for pass^k.  Each task contributes its own estimate
  ``C(c, k) / C(n, k)``; the interval is the *expanded percentile* bootstrap of their mean
  (Hesterberg, "What teachers should know about the bootstrap", 2015): the plain percentile
  interval is too narrow with few tasks (about 92-93% coverage at 20 tasks), so the tail
  probability is narrowed to ``Phi(-sqrt(T / (T - 1)) * t_{T-1, 0.975})`` before the
  percentiles are read off.  numpy draws the resamples (scipy is not a dependency of this
  project); the Student-t quantile uses the Cornish-Fisher expansion (Abramowitz and Stegun
  26.7.5), within 0.01 of the exact value for T >= 5 and 0.002 for T >= 7.
* :func:`paired_difference`: configuration A minus configuration B on the tasks both ran, with
  the tasks resampled together (the per-task differences are bootstrapped), so what the two
  share (task difficulty) cancels out.  ``includes_zero`` says the data cannot tell the two
  apart at the 95% level.
* :func:`minimum_detectable_difference`: the smallest true difference a two-sided test at the
  5% level finds with 80% power, ``(z_0.975 + z_0.8) * SE`` with the standard error from the
  per-task spread and the number of tasks.

Coverage, measured by ``tests/eval/test_uncertainty.py`` (tasks drawn from a pool of known
success probabilities, n = 4 trials, thousands of replicates): within 2.5 points of 95% for
pass^1 and pass^2 with 18-40 tasks.  It falls when almost every task has the same value (e.g.
pass^4 of a policy that nearly always fails: most resamples are all zeros); an interval of zero
width means every task gave the same value and says nothing about uncertainty.

Resampling uses a fixed seed, so a report is the same every time it is built.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from statistics import NormalDist
from typing import Any

import numpy as np

CONFIDENCE = 0.95
"""Coverage the intervals aim for."""
RESAMPLES = 10_000
"""Bootstrap resamples per interval."""
SEED = 0
"""Seed of the resampling (reports are reproducible)."""
POWER = 0.8
"""Power at which :func:`minimum_detectable_difference` is stated."""


def task_passk(successes: Sequence[int], n: int, k: int) -> np.ndarray:
    """Each task's pass^k estimate ``C(c, k) / C(n, k)`` (c: its successes out of n)."""
    if not 1 <= k <= n:
        raise ValueError(f"k={k} must lie in [1, n={n}]")
    table = np.array([math.comb(c, k) / math.comb(n, k) for c in range(n + 1)])
    counts = np.asarray(successes, dtype=int)
    if counts.size and (counts.min() < 0 or counts.max() > n):
        raise ValueError(f"success counts must lie in [0, n={n}], got {sorted(set(counts.tolist()))}")
    return table[counts]


def t_quantile(p: float, dof: int) -> float:
    """Student-t quantile by the Cornish-Fisher expansion (A&S 26.7.5; error < 0.01 for dof >= 4)."""
    z = NormalDist().inv_cdf(p)
    return (
        z
        + (z**3 + z) / (4 * dof)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * dof**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * dof**3)
    )


def mean_interval(
    values: Sequence[float] | np.ndarray, confidence: float = CONFIDENCE, resamples: int = RESAMPLES,
    seed: int = SEED,
) -> tuple[float, float]:
    """Expanded-percentile bootstrap interval of the mean of ``values`` (see the module docstring)."""
    v = np.asarray(values, dtype=float)
    t = v.size
    if t == 0:
        raise ValueError("an interval needs at least one task")
    if t == 1 or np.all(v == v[0]):
        return float(v[0]) if t == 1 else float(v.mean()), float(v.mean())
    tail = NormalDist().cdf(-math.sqrt(t / (t - 1)) * t_quantile(0.5 + confidence / 2, t - 1))
    rng = np.random.default_rng(seed)
    means = np.empty(resamples)
    chunk = max(1, 2_000_000 // t)  # bound the index matrix's memory
    for start in range(0, resamples, chunk):
        stop = min(resamples, start + chunk)
        means[start:stop] = v[rng.integers(0, t, size=(stop - start, t))].mean(axis=1)
    low, high = np.quantile(means, [tail, 1 - tail])
    return float(low), float(high)


def standard_error(values: Sequence[float] | np.ndarray) -> float:
    """Standard error of the mean over tasks (sample standard deviation / sqrt(T))."""
    v = np.asarray(values, dtype=float)
    return float(v.std(ddof=1) / math.sqrt(v.size)) if v.size > 1 else 0.0


def minimum_detectable_difference(se: float, confidence: float = CONFIDENCE, power: float = POWER) -> float | None:
    """``(z_{1-alpha/2} + z_power) * se``; None when ``se`` is 0 (every task gave the same value)."""
    if se <= 0:
        return None
    normal = NormalDist()
    return (normal.inv_cdf(0.5 + confidence / 2) + normal.inv_cdf(power)) * se


def passk_interval(successes: Sequence[int], n: int, ks: Sequence[int]) -> dict[str, list[float]]:
    """``{"pass^k": [low, high]}`` for every k of ``ks`` (``successes``: one count per task)."""
    return {f"pass^{k}": list(mean_interval(task_passk(successes, n, k))) for k in ks}


def passk_mdd(successes: Sequence[int], n: int, ks: Sequence[int]) -> dict[str, float | None]:
    """The difference from a second configuration this suite detects (80% power, 5% level),
    if the second had this one's per-task spread and the two were uncorrelated; pairing makes
    the real one smaller when the configurations agree on which tasks are hard."""
    return {
        f"pass^{k}": minimum_detectable_difference(math.sqrt(2) * standard_error(task_passk(successes, n, k)))
        for k in ks
    }


def paired_difference(
    a: Mapping[str, int], b: Mapping[str, int], n_a: int, n_b: int, ks: Sequence[int]
) -> dict[str, Any]:
    """A minus B over the tasks both ran (task id -> successes), resampling tasks together.

    Returns ``{"tasks": T, "pass^k": {"pass^1": {"difference", "ci", "includes_zero", "mdd"}}}``.
    """
    common = sorted(set(a) & set(b))
    if not common:
        raise ValueError("a paired difference needs tasks both configurations ran; they share none")
    out: dict[str, Any] = {"tasks": len(common), "pass^k": {}}
    for k in ks:
        if k > min(n_a, n_b):
            continue
        d = task_passk([a[t] for t in common], n_a, k) - task_passk([b[t] for t in common], n_b, k)
        low, high = mean_interval(d)
        out["pass^k"][f"pass^{k}"] = {
            "difference": float(d.mean()),
            "ci": [low, high],
            "includes_zero": bool(low <= 0.0 <= high),
            "mdd": minimum_detectable_difference(standard_error(d)),
        }
    return out


def compare_configurations(a: dict[str, Any], b: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    """Paired differences A - B for every domain/split both report configurations hold.

    ``a`` and ``b`` are configurations of a report (:mod:`cast_rl.eval.report`); a group
    without ``task_successes`` (a report written before they were recorded) is skipped.
    """
    out = []
    for key, ga in a["groups"].items():
        gb = b["groups"].get(key)
        if gb is None or "task_successes" not in ga or "task_successes" not in gb:
            continue
        ks = [int(name.split("^", 1)[1]) for name in ga["pass^k"] if name in gb["pass^k"]]
        diff = paired_difference(ga["task_successes"], gb["task_successes"], ga["n"], gb["n"], ks)
        out.append({"kind": kind, "a": a["name"], "b": b["name"], "label": f"{a['label']} - {b['label']}",
                    "group": key, **diff})
    return out


def critic_comparisons(configurations: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every configuration with the critic minus the one without it (same ``stage``, if any)."""
    out = []
    for base in configurations:
        if base["verification_budget"] != 0:
            continue
        for other in configurations:
            if other["verification_budget"] > 0 and other.get("stage") == base.get("stage"):
                out += compare_configurations(other, base, "with - without critic")
    return out


def interval_metadata() -> dict[str, Any]:
    """What the report's intervals are, for its ``uncertainty`` entry."""
    return {
        "method": "expanded-percentile bootstrap over tasks (a task's n trials stay together)",
        "confidence": CONFIDENCE,
        "resamples": RESAMPLES,
        "seed": SEED,
        "mdd": f"minimum detectable difference: two-sided test at the {1 - CONFIDENCE:.0%} level "
               f"with {POWER:.0%} power",
    }


def stage_comparisons(configurations: list[dict[str, Any]], later: str = "after", earlier: str = "before",
                      kind: str | None = None) -> list[dict[str, Any]]:
    """Each ``later`` configuration minus the ``earlier`` one of the same name (``after_no_critic``
    minus ``before_no_critic``, ...), as the pipeline report names them; ``kind`` (default
    ``"<later> - <earlier>"``) names the comparison, e.g. ``CAST - RFT``."""
    by_name = {c["name"]: c for c in configurations}
    out = []
    for c in configurations:
        if c.get("stage") == later:
            base = by_name.get(earlier + c["name"].removeprefix(later))
            if base is not None:
                out += compare_configurations(c, base, kind or f"{later} - {earlier}")
    return out
