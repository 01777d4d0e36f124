"""Critic metrics: detection quality on labelled actions, and what critiques did in rollouts.

Detection (:func:`detection_metrics`), with *invalid* as the positive class, over pairs of true
and predicted ``(verdict, error_type)``:

* ``critic/recall``: invalid actions the critic called invalid;
* ``critic/precision``: of the actions it called invalid, those that are;
* ``critic/false_positive_rate``: valid actions it called invalid;
* ``critic/type_accuracy``: invalid actions it called invalid *with the right error type*
  (a missed one counts as wrong); ``critic/type_accuracy_detected`` only over the detected;
* ``critic/unparsable_rate``: answers it could not give (never counted as valid: an unparsable
  answer on an invalid action is a miss, on a valid one neither a false nor a true positive);
* ``critic/contested_false_positive_rate``: the false-positive rate where the errors are: each
  action name's rate on its valid examples, weighted by how many of its examples are invalid (a
  cancel's rate counts as often as invalid cancels occur; a name never invalid counts nothing).
  A critic that learned "cancel is invalid" instead of the error shows it here: valid examples
  drawn at random are mostly lookups and replies, and the plain rate hides it.

:func:`evaluate_verifier` adds, over the critiques it could read, ``critic/leakage_rate``: those
whose rationale cites or names what the agent could not see at that step (the partial-observability
check of :func:`cast_rl.critique.rationale.leakage_problems` the labeller applies to its own).

Verification rounds (:func:`verification_metrics`), from the ``verification_rounds`` of rollout
trajectories (a round is recorded only for an invalid critique): ``critic/correction_rate`` is the
share of criticised proposals with a revision whose revision became valid: a revision the next
round criticised did not; any other one did, or, with a ``judge``, whatever the judge says (use
one when the verification budget may have ended the rounds before the revision was checked).
``critic/resistance`` is the share of criticised proposals the policy repeated unchanged.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from cast_rl.critique.context import ActionRef, Visible
from cast_rl.critique.rationale import Rationale, leakage_problems
from cast_rl.critique.verifier import Verifier, VerifyRequest
from cast_rl.records import Trajectory, VerificationRound


def detection_metrics(
    truth: list[tuple[str, str]], predicted: list[tuple[str, str]]
) -> dict[str, float]:
    if len(truth) != len(predicted):
        raise ValueError(f"{len(truth)} true labels but {len(predicted)} predictions")
    tp = fp = fn = tn = typed = unparsable = 0
    for (t_verdict, t_type), (p_verdict, p_type) in zip(truth, predicted):
        unparsable += p_verdict == "unparsable"
        if t_verdict == "invalid":
            if p_verdict == "invalid":
                tp += 1
                typed += p_type == t_type
            else:
                fn += 1
        elif p_verdict == "invalid":
            fp += 1
        elif p_verdict == "valid":
            tn += 1
    positives, negatives = tp + fn, sum(1 for t, _ in truth if t != "invalid")
    return {
        "critic/examples": float(len(truth)),
        "critic/recall": tp / positives if positives else 0.0,
        "critic/precision": tp / (tp + fp) if tp + fp else 0.0,
        "critic/false_positive_rate": fp / negatives if negatives else 0.0,
        "critic/type_accuracy": typed / positives if positives else 0.0,
        "critic/type_accuracy_detected": typed / tp if tp else 0.0,
        "critic/unparsable_rate": unparsable / len(truth) if truth else 0.0,
    }


async def evaluate_verifier(
    verifier: Verifier,
    rows: list[tuple[VerifyRequest, str, str]],
    batch_size: int = 32,
    tools: dict[str, list[dict[str, Any]]] | None = None,
) -> dict[str, float]:
    """Detection metrics and the leakage rate of a verifier on (request, true verdict, true type)
    rows (``tools``: domain -> tool schemas, part of what the agent sees)."""
    predicted: list[tuple[str, str]] = []
    parsed = leaky = 0
    for start in range(0, len(rows), batch_size):
        batch = rows[start : start + batch_size]
        critiques = await verifier.verify([r for r, _, _ in batch])
        if len(critiques) != len(batch):
            raise RuntimeError(f"the verifier answered {len(critiques)} of {len(batch)} requests")
        predicted += [(c.verdict, c.error_type) for c in critiques]
        for (request, _, _), critique in zip(batch, critiques):
            if critique.verdict in ("valid", "invalid") and not critique.unparsable:
                parsed += 1
                leaky += bool(rationale_leakage(critique.rationale, request, (tools or {}).get(request.domain, [])))
    out = detection_metrics([(v, t) for _, v, t in rows], predicted)
    out["critic/leakage_rate"] = leaky / parsed if parsed else 0.0
    out["critic/contested_false_positive_rate"] = contested_false_positive_rate(
        [(str(r.proposal.get("name", "")), v) for r, v, _ in rows], [v for v, _ in predicted])
    return out


def contested_false_positive_rate(truth: list[tuple[str, str]], predicted: list[str]) -> float:
    """Per action name (``truth``: (action name, true verdict)), the rate at which its valid
    examples were called invalid, averaged with the name's invalid count as weight; 0.0 when no
    name has both valid and invalid examples."""
    invalid: Counter[str] = Counter(name for name, verdict in truth if verdict == "invalid")
    valid: Counter[str] = Counter()
    flagged: Counter[str] = Counter()
    for (name, verdict), p in zip(truth, predicted):
        if verdict == "valid" and invalid[name]:
            valid[name] += 1
            flagged[name] += p == "invalid"
    weight = sum(invalid[name] for name in valid)
    return sum(invalid[name] * flagged[name] / valid[name] for name in valid) / weight if weight else 0.0


def rationale_leakage(
    rationale: dict[str, Any], request: VerifyRequest, tools: list[dict[str, Any]] | None = None
) -> list[str]:
    """Why a critique's rationale says more than the agent could see when it proposed the action."""
    proposal = request.proposal
    action = ActionRef(len(request.messages), 0, str(proposal.get("name", "")), dict(proposal.get("kwargs") or {}))
    return leakage_problems(Rationale.from_json(rationale), Visible(request.policy, request.messages, tools or []), action)



def _same(a: Any, b: Any) -> bool:
    return json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True, default=str)


def verification_metrics(
    trajectories: Iterable[Trajectory],
    judge: Callable[[Trajectory, VerificationRound, dict[str, Any]], str] | None = None,
) -> dict[str, float]:
    """Correction rate and resistance (see the module docstring).

    ``judge(trajectory, round, revision)`` returns a verdict for a revision that no later round
    judged (e.g. the rule verifier's); without it such revisions are left out of the rate.
    """
    criticised = repeated = judged = corrected = 0
    for trajectory in trajectories:
        rounds = list(trajectory.verification_rounds)
        for i, rnd in enumerate(rounds):
            if rnd.critique.get("verdict") != "invalid":
                continue
            criticised += 1
            revision = rnd.revision
            if revision is None:
                continue
            if _same(revision, rnd.proposal):
                repeated += 1
            following = rounds[i + 1] if i + 1 < len(rounds) else None
            if following is not None and _same(following.proposal, revision):
                verdict = following.critique.get("verdict")
            elif judge is not None:
                verdict = judge(trajectory, rnd, revision)
            else:
                verdict = "valid"  # the critic let it pass (or the budget ended the rounds)
            judged += 1
            corrected += verdict == "valid"
    return {
        "critic/criticised_proposals": float(criticised),
        "critic/correction_rate": corrected / judged if judged else 0.0,
        "critic/resistance": repeated / criticised if criticised else 0.0,
    }
