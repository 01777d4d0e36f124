"""Verified blame on the noisy teacher's injected errors: real environment, scripted user, labeller.

The teacher (:mod:`cast_rl.rollout.noisy_expert`) draws one error per episode; a wrong cancel
reason that no critic stops fails the task.  The labeller marks actions; verified blame replays
each failed episode to every invalid action that ran, substitutes the privileged correction and
continues with the same policy (the teacher with its drawn error, so a correction that is not the
cause of failure is followed by the same mistake and does not flip the outcome).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from cast_rl.critique.blame import blame_metrics, count_failed, privileged_correction, verify_blame
from cast_rl.critique.labeller import Labeller
from cast_rl.envs.types import RESPOND
from cast_rl.rollout.noisy_expert import NoisyExpertPolicy, draw_error, episode_seed
from cast_rl.rollout.runner import EpisodeRunner, EpisodeSpec

TASKS = 8


@pytest.fixture(scope="module")
def setup(compact_cancel):  # noqa: ANN001, ANN201
    cfg, data, tok = compact_cancel(11, TASKS + 2)
    errors = {i: ("wrong_argument" if i % 2 == 0 else None) for i in range(TASKS)}

    def runner_for(traj) -> EpisodeRunner:  # noqa: ANN001
        task = data.task("train", traj.task_index)
        return EpisodeRunner(cfg, data, NoisyExpertPolicy(tok, task, data.spec.write_tools, errors[traj.task_index]))

    trajs = [asyncio.run(runner_for(_Key(i)).run(EpisodeSpec("train", i, 0))) for i in range(TASKS)]
    labeller = Labeller(data)
    labels = [lab.to_json() for i, t in enumerate(trajs) for lab in labeller.label(t, i)]
    return data, trajs, labels, runner_for


class _Key:
    def __init__(self, index: int) -> None:
        self.task_index = index


def test_the_decisive_wrong_cancel_is_confirmed_and_nothing_else(setup) -> None:  # noqa: ANN001
    data, trajs, labels, runner_for = setup
    failed = [i for i, t in enumerate(trajs) if t.reward < 1]
    assert failed == [0, 2, 4, 6]  # exactly the episodes with the wrong cancel reason
    records = asyncio.run(verify_blame(data, trajs, labels, runner_for, k=2))
    confirmed = [r for r in records if r.confirmed]
    # every failure is explained by a confirmed decisive label: the cancel with the wrong reason
    assert sorted(r.trajectory_index for r in confirmed) == failed
    for r in confirmed:
        assert r.decisive and r.action["name"] == "cancel_pending_order"
        gold = next(a for a in data.task("train", r.trajectory_index).actions if a.name == "cancel_pending_order")
        assert r.correction == gold.to_json() and r.action != r.correction and r.flips == r.k == 2
    metrics = blame_metrics(records, count_failed(trajs))
    assert metrics["blame/confirmed_decisive_share"] == 1.0
    assert metrics["blame/precision"] == len(confirmed) / metrics["blame/checked"]
    types = {r.error_type for r in confirmed}
    assert all(metrics[f"blame/precision_type/{t}"] > 0 for t in types), metrics
    print(json.dumps(metrics))


def test_a_label_on_a_harmless_action_is_not_confirmed(setup) -> None:  # noqa: ANN001
    """Blame planted on a valid early action: correcting it does not stop the later mistake."""
    data, trajs, labels, runner_for = setup
    traj = trajs[0]
    first_call = next(t for t in traj.turns if t.action and t.action["name"] != RESPOND)
    planted = {"trajectory_index": 0, "message_index": first_call.message_index, "action": first_call.action,
               "verdict": "invalid", "error_type": "hallucination", "rationale": None, "source": "planted"}
    (record,) = asyncio.run(verify_blame(data, trajs, [planted], runner_for, k=2))
    assert record.correction == first_call.action  # the gold step it already was
    assert record.flips == 0 and not record.confirmed
    assert blame_metrics([record], 1)["blame/precision_rule/planted"] == 0.0


def test_privileged_correction_asks_for_the_missing_confirmation(setup) -> None:  # noqa: ANN001
    data, trajs, _, _ = setup
    traj = trajs[1]  # error-free: the cancel follows the user's yes
    cancel = next(t for t in traj.turns if t.action and t.action["name"] == "cancel_pending_order")
    assert privileged_correction(data, traj, cancel.message_index).name == "cancel_pending_order"
    ask = next(t for t in traj.turns if t.action and "Do you confirm" in t.action["kwargs"].get("content", ""))
    fix = privileged_correction(data, traj, ask.message_index)
    assert fix.name == RESPOND and "cancel_pending_order" in fix.kwargs["content"]
    last = max(t.message_index for t in traj.turns)
    assert privileged_correction(data, traj, last) is None  # every gold call done: nothing to substitute


def test_teacher_errors_are_drawn_as_the_fixture_says() -> None:
    # the fixture sets errors directly; the seeded draw is what the warm-start uses
    assert draw_error(episode_seed(0, ("train", 0, 0)), 1.0, ("wrong_argument",)) == "wrong_argument"


def test_critic_data_leaves_out_what_blame_did_not_confirm(setup, tmp_path: Path) -> None:  # noqa: ANN001
    import pyarrow.parquet as pq

    from cast_rl.critique.blame import confirmed_keys, write_blame
    from cast_rl.critique.datasets import build_critic_data
    from cast_rl.records import write_trajectories

    data, trajs, labels, runner_for = setup
    first_call = next(t for t in trajs[0].turns if t.action and t.action["name"] != RESPOND)
    labels = [dict(lab) for lab in labels]
    planted = next(lab for lab in labels if lab["trajectory_index"] == 0 and lab["message_index"] == first_call.message_index)
    planted.update(verdict="invalid", error_type="hallucination", source="planted")
    records = asyncio.run(verify_blame(data, trajs, labels, runner_for, k=1))
    write_blame(tmp_path / "blame.jsonl", records)
    checked, confirmed = confirmed_keys(tmp_path / "blame.jsonl")
    assert checked - confirmed == {(0, first_call.message_index)}

    write_trajectories(tmp_path / "trajectories.jsonl", trajs)
    (tmp_path / "labels.jsonl").write_text("".join(json.dumps(lab) + "\n" for lab in labels))
    kept = build_critic_data(tmp_path / "labels.jsonl", tmp_path / "trajectories.jsonl", tmp_path / "all",
                             heldout_fraction=0.0)
    filtered = build_critic_data(tmp_path / "labels.jsonl", tmp_path / "trajectories.jsonl", tmp_path / "f",
                                 heldout_fraction=0.0, drop_from_train=checked - confirmed)
    assert filtered["dropped_from_train"] == 1

    def keys(path: Path) -> set[tuple[int, int]]:
        rows = pq.read_table(path).to_pylist()
        return {(r["trajectory_index"], r["message_index"]) for r in rows if r["verdict"] == "invalid"}

    assert (0, first_call.message_index) in keys(tmp_path / "all" / "train.parquet")
    assert (0, first_call.message_index) not in keys(tmp_path / "f" / "train.parquet")
    assert kept["labels"] == filtered["labels"]
