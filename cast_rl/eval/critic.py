"""Critic metrics of one evaluated configuration, from its trajectories' verification rounds.

The rollout runner critiques every well-formed proposal while fewer than B rounds were spent on
the current action, and records a round only when the verdict is ``invalid`` (a *flag*; an
``unparsable`` answer lets the action through like ``valid``).  From that:

- ``critiques``: verifier calls, flagged or not, from the rollout workers' counters when the
  caller has them (None otherwise); ``flags``: flagged proposals; ``flags_per_episode``;
  ``flag_rate`` = flags / critiques;
- ``correction_rate`` and ``resistance``: :func:`cast_rl.critique.metrics.verification_metrics`
  (revisions that became valid; proposals repeated unchanged after a critique).  With a judge,
  a revision no later round checked (the budget ran out, or the critic let it pass) is judged
  by it, and a malformed revision counts as not corrected;
- ``unparsable``: critic answers that could not be read (from the rollout workers' counters,
  None when the caller has none); ``unparsable_rate`` = unparsable / critiques.  Under
  ``critic.on_unparsable=allow`` such an action runs as if unchecked; under ``reject`` it is sent
  back like a flag (its round's critique has ``unparsable: true``);
- ``false_positive_rate``: valid actions the critic called invalid, over the valid actions it
  checked (:func:`cast_rl.critique.metrics.detection_metrics`), where a judge with privileged
  information (the action labeller: gold actions and the environment) says what is valid.
  Needs a judge; None without one.

Rates over nothing (no flags, no checked valid action) are None.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cast_rl.critique.context import MALFORMED
from cast_rl.critique.labeller import Labeller
from cast_rl.critique.metrics import detection_metrics, verification_metrics
from cast_rl.records import Trajectory, VerificationRound

Judge = Callable[[Trajectory], dict[int, tuple[str, str]]]
"""Trajectory -> {message index of a well-formed action: its true (verdict, error_type)}."""


def critic_metrics(
    trajectories: list[Trajectory],
    budget: int,
    critiques: int | None = None,
    judge: Judge | None = None,
    unparsable: int | None = None,
) -> dict[str, float | int | None]:
    """The metrics of the module docstring for trajectories run at verification budget ``budget``."""
    flags = sum(len(t.verification_rounds) for t in trajectories)
    truth = {id(t): judge(t) for t in trajectories} if judge is not None and budget > 0 else {}

    def revision_verdict(traj: Trajectory, round_: VerificationRound, revision: dict[str, Any]) -> str:
        # the revision is the assistant message after the proposal and the critic's message
        return truth[id(traj)].get(round_.message_index + 2, ("invalid", ""))[0]

    rounds = verification_metrics(trajectories, revision_verdict if truth else None)
    false_positive_rate = None
    if truth:
        pairs = [pair for t in trajectories for pair in _checked(t, budget, truth[id(t)])]
        if any(true[0] != "invalid" for true, _ in pairs):
            detected = detection_metrics([true for true, _ in pairs], [pred for _, pred in pairs])
            false_positive_rate = detected["critic/false_positive_rate"]
    return {
        "critiques": critiques,
        "flags": flags,
        "flags_per_episode": flags / len(trajectories) if trajectories else 0.0,
        "flag_rate": flags / critiques if critiques else None,
        "correction_rate": rounds["critic/correction_rate"] if flags else None,
        "resistance": rounds["critic/resistance"] if flags else None,
        "false_positive_rate": false_positive_rate,
        "unparsable": unparsable,
        "unparsable_rate": unparsable / critiques if unparsable is not None and critiques else None,
    }


def _checked(
    traj: Trajectory, budget: int, truth: dict[int, tuple[str, str]]
) -> list[tuple[tuple[str, str], tuple[str, str]]]:
    """(true, predicted) (verdict, error_type) of every action the critic checked.

    A flagged proposal's revision is the assistant message two after it; the proposal at depth d
    of such a chain (0: the action's first proposal) was checked when d < budget.  With turn
    records, only turns with a verdict were checked (``critic.checks`` leaves some out).
    """
    flagged = {r.message_index: r.critique for r in traj.verification_rounds}
    if traj.turns:
        verdicts = {t.message_index for t in traj.turns if t.verdict is not None}
        truth = {i: v for i, v in truth.items() if i in verdicts}
    depth: dict[int, int] = {}
    pairs = []
    for index in sorted(truth):
        depth[index] = depth.get(index - 2, -1) + 1 if index - 2 in flagged else 0
        if depth[index] >= budget:
            continue
        critique = flagged.get(index)
        predicted = ("invalid", critique.get("error_type", "")) if critique else ("valid", "none")
        pairs.append((truth[index], predicted))
    return pairs


def labeller_judge(data_by_domain: dict[str, Any]) -> Judge:
    """A judge backed by :class:`cast_rl.critique.labeller.Labeller` (one per domain's data)."""
    labellers = {domain: Labeller(data) for domain, data in data_by_domain.items()}

    def judge(traj: Trajectory) -> dict[int, tuple[str, str]]:
        truth: dict[int, tuple[str, str]] = {}
        for label in labellers[traj.domain].label(traj):
            if label.action["name"] != MALFORMED:  # the runner never critiques malformed turns
                truth.setdefault(label.message_index, (label.verdict, label.error_type))  # first call runs
        return truth

    return judge
