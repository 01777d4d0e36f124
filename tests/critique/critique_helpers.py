"""Shared helpers of the critique tests: benchmark data, gold and injected trajectories."""

from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path

from cast_rl.config.schema import DOMAIN_NAMES
from cast_rl.critique.gold import gold_trajectory
from cast_rl.critique.inject import INJECTORS, inject
from cast_rl.critique.labeller import Labeller
from cast_rl.envs.core import DomainData

REPO_ROOT = Path(__file__).resolve().parents[2]
DOMAINS = DOMAIN_NAMES


def benchmarks_dir() -> Path:
    return REPO_ROOT.parent / "shared" / "benchmarks"


def flawed_tasks(data: DomainData, tasks: list[tuple[str, int]]) -> set[tuple[str, int]]:
    """Tasks whose own gold trajectory already has an invalid action (benchmark quirks)."""
    labeller = Labeller(data)
    return {
        (split, i) for split, i in tasks
        if any(lab.verdict == "invalid" for lab in labeller.label(gold_trajectory(data, split, i), i))
    }


def injection_scores(data: DomainData, tasks: list[tuple[str, int]], skip: set[tuple[str, int]]):
    """Per kind: (cases, detected, right type); plus the labeller (for its leakage count)."""
    labeller = Labeller(data)
    scores: dict[str, Counter[str]] = defaultdict(Counter)
    for kind in INJECTORS:
        for split, i in tasks:
            if (split, i) in skip:
                continue
            injected = inject(kind, data, split, i)
            if injected is None:
                continue
            labels = labeller.label(injected.trajectory, i)
            (target,) = [lab for lab in labels if lab.message_index == injected.message_index]
            scores[kind]["cases"] += 1
            scores[kind]["detected"] += target.verdict == "invalid"
            scores[kind]["typed"] += target.error_type == injected.expected
    return scores, labeller
