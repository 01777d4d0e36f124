"""The labeller on hand-built conversations: malformed calls, extra calls, unexecuted proposals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cast_rl.critique.gold import ConversationBuilder, gold_trajectory
from cast_rl.critique.labeller import Labeller
from cast_rl.envs.core import load_domain_data
from cast_rl.envs.types import Action
from cast_rl.records import CRITIC_NAME


@pytest.fixture(scope="module")
def data(retail_data_dir: Path):  # noqa: ANN201
    return load_domain_data("retail", retail_data_dir)


def _cancel_task(data) -> tuple[str, int, Action]:  # noqa: ANN001
    for split in data.splits:
        for i, task in enumerate(data.tasks(split)):
            for action in task.actions:
                if action.name == "cancel_pending_order":
                    return split, i, action
    raise AssertionError("no cancel task generated")


def _started(data, split: str, i: int) -> ConversationBuilder:  # noqa: ANN001
    builder = ConversationBuilder(data, split, i)
    builder.user("Hi! " + builder.task.instruction)
    builder.authenticate(list(builder.task.actions))
    return builder


def test_label_lines_have_exactly_the_documented_keys(data) -> None:  # noqa: ANN001
    labels = Labeller(data).label(gold_trajectory(data, "train", 0), 7)
    assert labels and all(
        set(lab.to_json()) == {"trajectory_index", "message_index", "action", "verdict", "error_type",
                             "rationale", "source"} for lab in labels
    )
    assert {lab.to_json()["trajectory_index"] for lab in labels} == {7}
    assert all(lab.verdict == "valid" and lab.error_type == "none" for lab in labels)


def test_malformed_call_is_wrong_tool_usage(data) -> None:  # noqa: ANN001
    builder = _started(data, "train", 0)
    builder.messages.append({"role": "assistant", "content": '<tool_call>{"name": "get_user_det'})
    builder.messages.append({"role": "tool", "tool_call_id": "invalid",
                             "content": "Error: the tool call is not valid JSON"})
    (label,) = [lab for lab in Labeller(data).label(builder.trajectory(0.0)) if lab.message_index == len(builder.messages) - 2]
    assert (label.verdict, label.error_type) == ("invalid", "wrong_tool_usage")


def test_second_call_of_a_message_is_a_policy_violation_and_does_not_run(data) -> None:  # noqa: ANN001
    split, i, cancel = _cancel_task(data)
    builder = _started(data, split, i)
    uid = builder.task.user_id
    builder.call(Action("get_user_details", {"user_id": uid}))
    message = builder.messages[-2]
    message["tool_calls"].append({"id": "extra", "type": "function", "function": {
        "name": "get_order_details", "arguments": json.dumps({"order_id": cancel.kwargs["order_id"]})}})
    labels = Labeller(data).label(builder.trajectory(0.0))
    first, second = [lab for lab in labels if lab.message_index == len(builder.messages) - 2]
    assert first.verdict == "valid"
    assert (second.verdict, second.error_type) == ("invalid", "policy_violation")


def test_rejected_proposal_is_labelled_but_not_replayed(data) -> None:  # noqa: ANN001
    split, i, cancel = _cancel_task(data)
    builder = _started(data, split, i)
    builder.call(Action("get_user_details", {"user_id": builder.task.user_id}))
    builder.call(Action("get_order_details", {"order_id": cancel.kwargs["order_id"]}))
    builder.call(cancel, execute=False)  # proposed without confirmation; the critic stops it
    proposal_index = builder.last_call
    builder.messages.append({"role": "user", "name": CRITIC_NAME,
                             "content": "VERDICT: invalid\nERROR: policy_violation"})
    builder.confirm(cancel)
    builder.call(cancel)
    labels = {lab.message_index: lab for lab in Labeller(data).label(builder.trajectory(0.0))}
    assert (labels[proposal_index].verdict, labels[proposal_index].error_type) == (
        "invalid", "policy_violation")
    final = labels[builder.last_call]
    assert final.verdict == "valid", final.rationale  # the order was still pending when it ran


def test_tool_messages_without_ids_are_matched_in_order(data) -> None:  # noqa: ANN001
    trajectory = gold_trajectory(data, "train", 1)
    for message in trajectory.messages:
        message.pop("tool_call_id", None)
        for call in message.get("tool_calls") or []:
            call.pop("id", None)
    labels = Labeller(data).label(trajectory)
    assert all(lab.verdict == "valid" for lab in labels), [lab.to_json() for lab in labels if lab.verdict != "valid"]


def test_revision_of_a_rejected_write_stands_on_the_confirmation_before_it(data) -> None:  # noqa: ANN001
    """Confirmed with the user's reason, proposed with another, sent back by the critic, revised to
    the confirmed one: the revision is valid for the labeller and for the rule critic.  The
    rejected proposal never ran, so it is no write between the user's yes and the revision (before
    the fix the confirmation rule counted it, and labelled every corrected cancel invalid)."""
    from cast_rl.critique.datasets import request_for
    from cast_rl.critique.verifier import RuleVerifier

    split, i, cancel = _cancel_task(data)
    other = "ordered by mistake" if cancel.kwargs["reason"] == "no longer needed" else "no longer needed"
    builder = _started(data, split, i)
    builder.call(Action("get_order_details", {"order_id": cancel.kwargs["order_id"]}))
    builder.confirm(cancel)
    builder.call(Action(cancel.name, {**cancel.kwargs, "reason": other}), execute=False)
    proposal_index = builder.last_call
    builder.messages.append({"role": "user", "name": CRITIC_NAME,
                             "content": "VERDICT: invalid\nERROR: policy_violation"})
    builder.call(cancel)
    trajectory = builder.trajectory(None)
    assert trajectory.reward == 1.0
    labels = {lab.message_index: lab for lab in Labeller(data).label(trajectory)}
    assert labels[proposal_index].verdict == "invalid"
    revision = labels[builder.last_call]
    assert (revision.verdict, revision.error_type) == ("valid", "none"), revision.rationale
    rule = RuleVerifier({"retail": data.tools}).verify_one(
        request_for(trajectory, builder.last_call, {"name": cancel.name, "kwargs": cancel.kwargs}))
    assert rule.verdict == "valid", rule.text  # a critic with budget 2 lets the revision run
