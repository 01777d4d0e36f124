"""Argument twins (``pipeline.critic_twins``): a labelled write with one enum argument changed,
labelled by the labeller, added to the critic's training split only."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from cast_rl.critique.datasets import build_critic_data
from cast_rl.critique.gold import gold_trajectory
from cast_rl.critique.labeller import Labeller, write_labels
from cast_rl.critique.twins import enum_arguments, twin_actions, twin_labels
from cast_rl.records import write_trajectories


@pytest.fixture(scope="module")
def data(compact_cancel):  # noqa: ANN001, ANN201
    return compact_cancel(5, 12)[1]  # generated retail cancel tasks


def test_enum_arguments_and_their_twins(data) -> None:  # noqa: ANN001
    enums = enum_arguments(data.tools)
    assert enums["cancel_pending_order"] == {"reason": ["no longer needed", "ordered by mistake"]}
    cancel = {"name": "cancel_pending_order", "kwargs": {"order_id": "#W1", "reason": "no longer needed"}}
    assert list(twin_actions(cancel, enums)) == [
        {"name": "cancel_pending_order", "kwargs": {"order_id": "#W1", "reason": "ordered by mistake"}}]
    assert list(twin_actions({"name": "get_order_details", "kwargs": {"order_id": "#W1"}}, enums)) == []


def _cancel_gold(data):  # noqa: ANN001, ANN202
    for split in data.splits:
        for i, task in enumerate(data.tasks(split)):
            if [a.name for a in task.actions if a.name in data.spec.write_tools] == ["cancel_pending_order"]:
                return gold_trajectory(data, split, i)
    raise AssertionError("no task with one write, a cancel")


def test_the_twin_of_a_confirmed_cancel_is_invalid_and_its_twin_valid_again(data) -> None:  # noqa: ANN001
    gold = _cancel_gold(data)
    labels = [lab.to_json() for lab in Labeller(data).label(gold)]
    (cancel,) = [lab for lab in labels if lab["action"]["name"] == "cancel_pending_order"]
    assert cancel["verdict"] == "valid"
    [(position, twin, label)] = twin_labels(data, [gold], labels)
    assert labels[position] is cancel and twin.messages[:-1] == gold.messages[: cancel["message_index"]]
    assert label["action"]["kwargs"]["reason"] != cancel["action"]["kwargs"]["reason"]
    assert (label["verdict"], label["error_type"]) == ("invalid", "policy_violation")  # not the reason confirmed
    [(_, _, back)] = twin_labels(data, [twin], [{**label, "trajectory_index": 0}])
    assert back["verdict"] == "valid" and back["action"] == cancel["action"]


def test_twins_go_to_the_training_split_only(data, tmp_path: Path) -> None:  # noqa: ANN001
    golds = [gold_trajectory(data, "train", i) for i in range(len(data.tasks("train")))]
    write_trajectories(tmp_path / "t.jsonl", golds)
    labeller = Labeller(data)
    write_labels(tmp_path / "l.jsonl", [lab for i, g in enumerate(golds) for lab in labeller.label(g, i)])
    plain = build_critic_data(tmp_path / "l.jsonl", tmp_path / "t.jsonl", tmp_path / "plain", heldout_fraction=0.3)
    twins = build_critic_data(tmp_path / "l.jsonl", tmp_path / "t.jsonl", tmp_path / "twins", heldout_fraction=0.3,
                              twins_of=data)
    assert twins["train"]["twins"] > 0 and "twins" not in plain["train"]
    assert twins["train"]["examples"] == plain["train"]["examples"] + twins["train"]["twins"]
    assert twins["heldout"] == plain["heldout"]
    rows = pq.read_table(tmp_path / "twins" / "train.parquet").to_pylist()
    requests = [json.loads(r["request"]) for r in rows]
    pairs = {}
    for r, request in zip(rows, requests):
        if request["proposal"]["name"] == "cancel_pending_order":
            pairs.setdefault((r["trajectory_index"], r["message_index"]), set()).add(
                (request["proposal"]["kwargs"]["reason"], r["verdict"]))
    # each kept cancel sits beside its twin: the same request, the other reason, the other verdict
    assert pairs and all(len(p) == 2 and {v for _, v in p} == {"valid", "invalid"} for p in pairs.values())
