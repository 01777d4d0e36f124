"""pass^k over repeated trials, as tau-bench reports it.

Every task runs n times.  A trial succeeds when its reward lies within 1e-6 of 1, bounds
included (``1 - 1e-6 <= reward <= 1 + 1e-6``, tau-bench's ``is_successful``).  With c successes
out of n trials, a task's pass^k is ``C(c, k) / C(n, k)``: the chance that k trials drawn
without replacement from its n all succeed.  pass^k of a task set is the mean over its tasks,
for k = 1..n; it is computed separately for each (domain, split).

Unequal trial counts: the source assumes every task ran exactly n times (it takes n as the
number of distinct trial indices across all results).  Here n is each task's own count of
trials, and a table whose tasks have different counts is an error that names them, because
mixing counts would bias pass^k (a task with missing trials would be divided by the wrong
``C(n, k)``).  Rerun the missing trials, or drop the incomplete tasks, before computing.

Results files for ``cast-rl metrics passk --results R.jsonl`` hold one trial per line::

    {"task_id": 3, "trial": 0, "reward": 1.0}

(other keys are ignored; ``task_id`` may be an integer or a string).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# the success rule lives with the rewards (cast_rl.envs.types); pass^k reads it from there
from cast_rl.envs.types import SUCCESS_TOLERANCE as SUCCESS_TOLERANCE
from cast_rl.envs.types import is_success as is_success
from cast_rl.jsonl import iter_jsonl


class ResultsFormatError(ValueError):
    """A results line that cannot be used; the message names the file and the line."""


@dataclass(frozen=True)
class TrialResult:
    """The outcome of one trial of one task."""

    task_id: Hashable
    trial: int
    reward: float
    domain: str = ""
    split: str = ""


def pass_hat_k(successes: int, n: int, k: int) -> float:
    """``C(c, k) / C(n, k)`` for one task with ``successes`` = c of n trials."""
    if not 0 <= successes <= n:
        raise ValueError(f"successes={successes} must lie in [0, n={n}]")
    if not 1 <= k <= n:
        raise ValueError(f"k={k} must lie in [1, n={n}]")
    return math.comb(successes, k) / math.comb(n, k)


def passk(rewards_by_task: Mapping[Hashable, Sequence[float]], ks: Iterable[int] | None = None) -> dict[int, float]:
    """k -> mean over tasks of pass^k; ``ks`` defaults to 1..n.

    Every task must have the same number n of trials (see the module docstring); a k outside
    1..n is an error.
    """
    if not rewards_by_task:
        raise ValueError("pass^k needs at least one task")
    n = trial_count(rewards_by_task)
    ks = list(range(1, n + 1)) if ks is None else sorted(set(ks))
    for k in ks:
        if not 1 <= k <= n:
            raise ValueError(f"k={k} is not allowed; with n={n} trials per task k must lie in 1..{n}")
    counts = [sum(is_success(r) for r in rewards) for rewards in rewards_by_task.values()]
    return {k: sum(pass_hat_k(c, n, k) for c in counts) / len(counts) for k in ks}


def trial_count(rewards_by_task: Mapping[Hashable, Sequence[float]]) -> int:
    """The common number of trials per task; raises ``ValueError`` naming tasks that differ."""
    sizes: dict[int, list[Hashable]] = {}
    for task, rewards in rewards_by_task.items():
        sizes.setdefault(len(rewards), []).append(task)
    if len(sizes) != 1:
        n = max(sizes, key=lambda size: len(sizes[size]))
        odd = ", ".join(
            f"task {task!r} has {size}" for size, tasks in sorted(sizes.items()) if size != n for task in tasks[:5]
        )
        raise ValueError(
            f"pass^k needs the same number of trials for every task; most tasks have n={n} but {odd}. "
            "Rerun the missing trials or drop the incomplete tasks."
        )
    (n,) = sizes
    if n == 0:
        raise ValueError("pass^k needs at least one trial per task")
    return n


def group_rewards(results: Iterable[TrialResult]) -> dict[tuple[str, str], dict[Hashable, list[float]]]:
    """(domain, split) -> task -> rewards in trial order; a repeated trial is an error."""
    seen: set[tuple[str, str, Hashable, int]] = set()
    trials: dict[tuple[str, str], dict[Hashable, list[tuple[int, float]]]] = {}
    for r in results:
        key = (r.domain, r.split, r.task_id, r.trial)
        if key in seen:
            raise ValueError(f"trial {r.trial} of task {r.task_id!r} ({r.domain or '-'}/{r.split or '-'}) appears twice")
        seen.add(key)
        trials.setdefault((r.domain, r.split), {}).setdefault(r.task_id, []).append((r.trial, r.reward))
    return {
        group: {task: [reward for _, reward in sorted(rows)] for task, rows in tasks.items()}
        for group, tasks in trials.items()
    }


def passk_by_group(results: Iterable[TrialResult], ks: Iterable[int] | None = None) -> dict[tuple[str, str], dict[int, float]]:
    """(domain, split) -> k -> pass^k."""
    ks = None if ks is None else list(ks)
    return {group: passk(tasks, ks) for group, tasks in group_rewards(results).items()}


def as_keys(table: Mapping[int, float]) -> dict[str, float]:
    """``{1: 0.5}`` -> ``{"pass^1": 0.5}`` (the keys reports and the CLI print)."""
    return {f"pass^{k}": value for k, value in sorted(table.items())}


def read_results(path: str | Path) -> list[TrialResult]:
    """Read a results JSON Lines file (see the module docstring).

    A malformed line or a repeated (task_id, trial) raises :class:`ResultsFormatError` naming
    the file and the line.
    """
    path = Path(path)
    out: list[TrialResult] = []
    first_line: dict[tuple[Hashable, int], int] = {}
    for lineno, result in iter_jsonl(path, _parse_result, what="a trial result", error=ResultsFormatError):
        key = (result.task_id, result.trial)
        if key in first_line:
            raise ResultsFormatError(
                f"{path}:{lineno}: task_id={result.task_id!r} trial={result.trial} repeats line {first_line[key]}"
            )
        first_line[key] = lineno
        out.append(result)
    if not out:
        raise ResultsFormatError(f"{path}: no trial results")
    return out


def _parse_result(obj: Any) -> TrialResult:
    if not isinstance(obj, dict):
        raise ValueError('expected a JSON object {"task_id", "trial", "reward"}')
    missing = [k for k in ("task_id", "trial", "reward") if k not in obj]
    if missing:
        raise ValueError(f"missing keys: {', '.join(missing)}")
    task_id, trial, reward = obj["task_id"], obj["trial"], obj["reward"]
    if isinstance(task_id, bool) or not isinstance(task_id, (int, str)):
        raise ValueError(f"task_id must be an integer or a string, got {task_id!r}")
    if isinstance(trial, bool) or not isinstance(trial, int) or trial < 0:
        raise ValueError(f"trial must be an integer >= 0, got {trial!r}")
    if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
        raise ValueError(f"reward must be a finite number, got {reward!r}")
    return TrialResult(task_id=task_id, trial=trial, reward=float(reward))
