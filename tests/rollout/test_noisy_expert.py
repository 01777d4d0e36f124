"""The noisy expert through the real episode runner, with and without the rule critic.

Checks the whole chain that critique-aware data depends on: the teacher's drawn error runs (and
costs the task) without a critic; with the rule critic in the loop the error is rejected, the
runner records the rejected turn (span, verdict, never executed) and the corrected step, the
task succeeds; and the distilled sample is exactly the conversation without the rejected
proposal and its critique, token for token.
"""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from cast_rl.config import load_config
from cast_rl.critique.verifier import RuleVerifier
from cast_rl.rollout.noisy_expert import ERROR_KINDS, NoisyExpertPolicy, draw_error
from cast_rl.rollout.runner import EpisodeRunner, EpisodeSpec
from cast_rl.samples.builders import build_samples, distill_cut


@pytest.fixture(scope="module")
def setup(compact_cancel):  # noqa: ANN001, ANN201
    return compact_cancel(3, 10)


def _episode(setup, task: int, error: str | None, critic: bool):  # noqa: ANN001, ANN202
    cfg, data, tok = setup
    if critic:
        cfg = dataclasses.replace(cfg, critic=dataclasses.replace(cfg.critic, verification_budget=1))
    engine = NoisyExpertPolicy(tok, data.task("train", task), data.spec.write_tools, error)
    verifier = RuleVerifier({"retail": data.tools}) if critic else None
    return asyncio.run(EpisodeRunner(cfg, data, engine, verifier).run(EpisodeSpec("train", task, 0)))


def test_compact_setting_keeps_only_what_cancel_tasks_need(setup) -> None:  # noqa: ANN001
    _, data, _ = setup
    names = [t["function"]["name"] for t in data.tools]
    assert names == ["cancel_pending_order", "find_user_id_by_email", "find_user_id_by_name_zip", "get_order_details"]
    assert "Cancel:" in data.policy and "Exchange" not in data.policy
    assert all("description" not in t["function"] for t in data.tools)


@pytest.mark.parametrize("task", range(4))
def test_error_free_teacher_solves_every_task(setup, task: int) -> None:  # noqa: ANN001
    traj = _episode(setup, task, None, critic=False)
    assert traj.reward == 1.0 and traj.info["tokens_consistent"]
    assert [t.executed for t in traj.turns] == [True] * len(traj.turns)
    # the recorded spans are exactly the runs of policy tokens
    covered = [0] * len(traj.token_ids)
    for t in traj.turns:
        covered[t.start:t.end] = [1] * (t.end - t.start)
    assert covered == traj.loss_mask


def test_wrong_argument_fails_the_task_unless_the_critic_stops_it(setup) -> None:  # noqa: ANN001
    cfg, data, tok = setup
    unchecked = _episode(setup, 0, "wrong_argument", critic=False)
    assert unchecked.reward == 0.0 and not unchecked.verification_rounds
    checked = _episode(setup, 0, "wrong_argument", critic=True)
    assert checked.reward == 1.0
    (rejected,) = [t for t in checked.turns if not t.executed]
    assert rejected.verdict == "invalid" and rejected.action["name"] == "cancel_pending_order"
    assert checked.loss_mask[rejected.start:rejected.end] == [1] * (rejected.end - rejected.start)
    (round_,) = checked.verification_rounds
    assert round_.message_index == rejected.message_index
    assert round_.revision["kwargs"]["reason"] != rejected.action["kwargs"]["reason"]

    ids, mask = distill_cut(checked)
    gone = {rejected.message_index, rejected.message_index + 1}  # proposal and critique
    kept = [m for i, m in enumerate(checked.messages) if i not in gone]
    rendered = tok.apply_chat_template(kept, tools=data.tools, tokenize=False)
    assert ids == tok(rendered, add_special_tokens=False).input_ids
    (sft,) = build_samples([checked], load_config(None, ["algorithm.samples=[supervised]"]), "r")
    assert sum(sft.loss_mask) == sum(checked.loss_mask) - (rejected.end - rejected.start)
    assert sum(mask) == sum(sft.loss_mask)


@pytest.mark.parametrize("error", ["missing_confirmation", "fabricated_id"])
def test_other_errors_are_caught_by_the_rule_critic(setup, error: str) -> None:  # noqa: ANN001
    checked = _episode(setup, 1, error, critic=True)
    assert checked.reward == 1.0
    (rejected,) = [t for t in checked.turns if not t.executed]
    expected = {"missing_confirmation": "policy_violation", "fabricated_id": "hallucination"}[error]
    assert rejected.error_type == expected


def test_error_draws_are_reproducible_and_at_the_set_rate() -> None:
    draws = [draw_error(seed, 0.4, ERROR_KINDS) for seed in range(2000)]
    assert draws == [draw_error(seed, 0.4, ERROR_KINDS) for seed in range(2000)]
    assert 0.37 < sum(d is not None for d in draws) / 2000 < 0.43
    assert {d for d in draws if d} == set(ERROR_KINDS)
