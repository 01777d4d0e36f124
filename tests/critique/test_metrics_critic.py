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


def test_contested_false_positive_rate_weighs_each_name_by_its_errors() -> None:
    # a critic that flags every valid cancel and no valid reply: the plain rate (1 of 5 valid)
    # hides what the contested rate shows (cancels hold 3 of the 4 errors: 3/4 x 1.0 + 1/4 x 0.0)
    truth = [("cancel_pending_order", "invalid")] * 3 + [("cancel_pending_order", "valid"), ("respond", "invalid")] + [
        ("respond", "valid")] * 3 + [("get_order_details", "valid")]
    predicted = ["invalid"] * 3 + ["invalid", "invalid"] + ["valid"] * 3 + ["valid"]
    assert contested_false_positive_rate(truth, predicted) == pytest.approx(0.75)
    assert detection_metrics([(v, "none") for _, v in truth],
                             [(p, "none") for p in predicted])["critic/false_positive_rate"] == pytest.approx(1 / 5)
    flags_the_lookup = predicted[:-1] + ["invalid"]  # a name never invalid counts nothing
    assert contested_false_positive_rate(truth, flags_the_lookup) == pytest.approx(0.75)
    assert contested_false_positive_rate(truth, ["invalid"] * 3 + ["valid"] * 6) == 0.0
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
