"""The labeller reads the outcome: unexplained failures are counted, the decisive action marked.

Hand-built conversations on generated retail data: a failed trajectory with no invalid action
(unexplained), one with an invalid read before an invalid write (the write is decisive), one with
invalid reads only (the first is decisive), a rejected proposal (never decisive), and the same
conversations as successes (labels unchanged, nothing counted).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cast_rl.critique.gold import ConversationBuilder, gold_trajectory
from cast_rl.critique.labeller import Labeller, label_file
from cast_rl.envs.core import DomainData, load_domain_data
from cast_rl.envs.types import Action
from cast_rl.records import CRITIC_NAME, Trajectory


@pytest.fixture(scope="module")
def data(retail_data_dir: Path) -> DomainData:
    return load_domain_data("retail", retail_data_dir)


def _cancel_task(data: DomainData) -> tuple[str, int, Action]:
    for split in data.splits:
        for i, task in enumerate(data.tasks(split)):
            for action in task.actions:
                if action.name == "cancel_pending_order":
                    return split, i, action
    raise AssertionError("no cancel task generated")


def _invalid_read_then_write(data: DomainData, reward: float) -> tuple[Trajectory, int, int]:
    """(trajectory, index of the invalid read, index of the unconfirmed cancellation)."""
    split, i, cancel = _cancel_task(data)
    builder = ConversationBuilder(data, split, i)
    builder.user("Hi! " + builder.task.instruction)
    builder.authenticate(list(builder.task.actions))
    builder.call(Action("get_order_details", {"order_id": "#W0000000"}))  # an id nobody gave
    bad_read = builder.last_call
    builder.call(Action("get_user_details", {"user_id": builder.task.user_id}))
    builder.call(Action("get_order_details", {"order_id": cancel.kwargs["order_id"]}))
    builder.call(cancel)  # no confirmation asked: invalid, and it changes the order
    write = builder.last_call
    builder.finish()
    return builder.trajectory(reward), bad_read, write


def test_failure_without_invalid_action_is_unexplained(data: DomainData) -> None:
    trajectory = gold_trajectory(data, "train", 0)
    trajectory.reward = 0.0
    labeller = Labeller(data)
    labels = labeller.label(trajectory, 5)
    assert labels and all(lab.verdict == "valid" and not lab.decisive for lab in labels)
    assert labeller.stats.unexplained == [{
        "trajectory_index": 5, "domain": "retail", "split": "train", "task_index": 0,
        "trial": 0, "reward": 0.0,
    }]
    metrics = labeller.stats.metrics()
    assert metrics["label/failed_trajectories"] == 1
    assert metrics["label/unexplained_failures"] == 1
    assert metrics["label/unexplained_failure_rate"] == 1.0


def test_first_invalid_write_is_decisive_even_after_an_invalid_read(data: DomainData) -> None:
    trajectory, bad_read, write = _invalid_read_then_write(data, reward=0.0)
    labeller = Labeller(data)
    labels = {lab.message_index: lab for lab in labeller.label(trajectory)}
    assert labels[bad_read].verdict == "invalid" and not labels[bad_read].decisive
    assert labels[write].verdict == "invalid" and labels[write].decisive
    assert labels[write].to_json()["decisive"] is True
    assert [lab.message_index for lab in labels.values() if lab.decisive] == [write]
    assert labeller.stats.unexplained == []
    metrics = labeller.stats.metrics()
    assert metrics["label/unexplained_failures"] == 0
    assert metrics["label/unexplained_failure_rate"] == 0.0
    assert metrics[f"label/decisive_{labels[write].error_type}"] == 1


def test_without_an_invalid_write_the_first_invalid_action_is_decisive(data: DomainData) -> None:
    split, i, cancel = _cancel_task(data)
    builder = ConversationBuilder(data, split, i)
    builder.user("Hi! " + builder.task.instruction)
    builder.authenticate(list(builder.task.actions))
    builder.call(Action("get_order_details", {"order_id": "#W0000000"}))
    first = builder.last_call
    builder.call(Action("get_order_details", {"order_id": "#W0000001"}))
    builder.finish()
    labels = Labeller(data).label(builder.trajectory(0.0))
    invalid = [lab.message_index for lab in labels if lab.verdict == "invalid"]
    assert len(invalid) == 2
    assert [lab.message_index for lab in labels if lab.decisive] == [first]


def test_a_rejected_proposal_is_never_decisive(data: DomainData) -> None:
    split, i, cancel = _cancel_task(data)
    builder = ConversationBuilder(data, split, i)
    builder.user("Hi! " + builder.task.instruction)
    builder.authenticate(list(builder.task.actions))
    builder.call(Action("get_user_details", {"user_id": builder.task.user_id}))
    builder.call(Action("get_order_details", {"order_id": cancel.kwargs["order_id"]}))
    builder.call(cancel, execute=False)  # proposed without confirmation; the critic stops it
    proposal = builder.last_call
    builder.messages.append({"role": "user", "name": CRITIC_NAME,
                             "content": "VERDICT: invalid\nERROR: policy_violation"})
    builder.finish()
    labeller = Labeller(data)
    labels = {lab.message_index: lab for lab in labeller.label(builder.trajectory(0.0))}
    assert labels[proposal].verdict == "invalid" and not labels[proposal].ran
    assert not any(lab.decisive for lab in labels.values())
    assert len(labeller.stats.unexplained) == 1  # nothing that ran explains the failure


def test_labels_of_a_success_are_unchanged(data: DomainData) -> None:
    failed, _, _ = _invalid_read_then_write(data, reward=0.0)
    succeeded, _, _ = _invalid_read_then_write(data, reward=1.0)
    labeller = Labeller(data)
    lines_failed = [lab.to_json() for lab in labeller.label(failed)]
    lines_succeeded = [lab.to_json() for lab in labeller.label(succeeded)]
    assert [line.pop("decisive", None) for line in lines_failed].count(True) == 1
    assert lines_succeeded == lines_failed  # the same apart from the decisive mark
    assert all("decisive" not in line for line in lines_succeeded)
    assert labeller.stats.failed == 1


def test_label_file_counts_the_outcomes_of_a_file(data: DomainData, tmp_path: Path) -> None:
    good = gold_trajectory(data, "train", 0)
    unexplained = gold_trajectory(data, "train", 1)
    unexplained.reward = 0.0
    explained, _, write = _invalid_read_then_write(data, reward=0.0)
    source = tmp_path / "t.jsonl"
    source.write_text("".join(json.dumps(t.to_json()) + "\n" for t in (good, unexplained, explained)))
    labels, _, labeller = label_file(data, source, tmp_path / "labels.jsonl")
    metrics = labeller.stats.metrics()
    assert (metrics["label/trajectories"], metrics["label/failed_trajectories"]) == (3, 2)
    assert metrics["label/unexplained_failures"] == 1
    assert metrics["label/unexplained_failure_rate"] == 0.5
    assert [r["trajectory_index"] for r in labeller.stats.unexplained] == [1]
    written = [json.loads(line) for line in (tmp_path / "labels.jsonl").read_text().splitlines()]
    assert [(x["trajectory_index"], x["message_index"]) for x in written if x.get("decisive")] == [(2, write)]
