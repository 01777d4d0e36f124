"""Critic metrics, worked out by hand."""

from __future__ import annotations

import pytest

from cast_rl.critique.metrics import (
    contested_false_positive_rate,
    detection_metrics,
    verification_metrics,
)
from cast_rl.records import Trajectory


def test_detection_metrics_by_hand() -> None:
    truth = [("invalid", "hallucination"), ("invalid", "policy_violation"),
             ("invalid", "wrong_tool_usage"), ("invalid", "hallucination"),
             ("valid", "none"), ("valid", "none"), ("valid", "none"), ("valid", "none")]
    predicted = [("invalid", "hallucination"),        # tp, right type
                 ("invalid", "wrong_tool_usage"),     # tp, wrong type
                 ("unparsable", "unknown"),           # a miss, never "valid"
                 ("valid", "none"),                   # fn
                 ("invalid", "policy_violation"),     # fp
                 ("valid", "none"), ("valid", "none"),
                 ("unparsable", "unknown")]           # neither fp nor tn
    m = detection_metrics(truth, predicted)
    assert m["critic/recall"] == pytest.approx(2 / 4)
    assert m["critic/precision"] == pytest.approx(2 / 3)
    assert m["critic/false_positive_rate"] == pytest.approx(1 / 4)
    assert m["critic/type_accuracy"] == pytest.approx(1 / 4)
    assert m["critic/type_accuracy_detected"] == pytest.approx(1 / 2)
    assert m["critic/unparsable_rate"] == pytest.approx(2 / 8)
    with pytest.raises(ValueError):
        detection_metrics(truth, predicted[:-1])


def test_contested_false_positive_rate_counts_valid_actions_of_names_seen_invalid() -> None:
    # a critic that flags every cancel: the plain rate (1 of 4 valid) hides what the contested
    # rate (1 of 1 valid cancel) shows
    truth = [("cancel_pending_order", "invalid"), ("cancel_pending_order", "valid"),
             ("get_order_details", "valid"), ("respond", "valid"), ("find_user_id_by_email", "valid")]
    predicted = ["invalid", "invalid", "valid", "valid", "valid"]
    assert contested_false_positive_rate(truth, predicted) == 1.0
    assert detection_metrics([(v, "none") for _, v in truth],
                             [(p, "none") for p in predicted])["critic/false_positive_rate"] == pytest.approx(1 / 4)
    assert contested_false_positive_rate(truth, ["invalid", "valid", "invalid", "valid", "valid"]) == 0.0
    assert contested_false_positive_rate([("respond", "valid")], ["invalid"]) == 0.0  # no contested name


def _traj(rounds: list[dict]) -> Trajectory:
    return Trajectory("retail", "test", 0, 0, 0.0, 0, [], verification_rounds=rounds)


def test_correction_rate_and_resistance_from_verification_rounds() -> None:
    bad = {"verdict": "invalid", "error_type": "policy_violation"}
    a = {"name": "cancel_pending_order", "kwargs": {"order_id": "#W1", "reason": "no longer needed"}}
    b = {"name": "respond", "kwargs": {"content": "Shall I cancel #W1?"}}
    c = {"name": "get_order_details", "kwargs": {"order_id": "#W1"}}
    trajectories = [
        # criticised, repeated unchanged, criticised again; then the second revision passes
        _traj([{"message_index": 3, "proposal": a, "critique": bad, "revision": a},
               {"message_index": 5, "proposal": a, "critique": bad, "revision": b}]),
        # criticised, revised to something the critic let pass
        _traj([{"message_index": 3, "proposal": a, "critique": bad, "revision": c}]),
        # criticised, the budget ran out without a revision
        _traj([{"message_index": 3, "proposal": a, "critique": bad, "revision": None}]),
    ]
    m = verification_metrics(trajectories)
    assert m["critic/criticised_proposals"] == 4
    # revisions judged: a (criticised again: not corrected), b (passed), c (passed)
    assert m["critic/correction_rate"] == pytest.approx(2 / 3)
    assert m["critic/resistance"] == pytest.approx(1 / 4)
    strict = verification_metrics(trajectories, judge=lambda t, r, rev: "invalid")
    assert strict["critic/correction_rate"] == 0.0
