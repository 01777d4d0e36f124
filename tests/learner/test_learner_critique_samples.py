"""Critique-aware samples: outcome groups with critic shaping, revisions, supervised data."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from transformers import AutoTokenizer

from cast_rl.config import load_config
from cast_rl.learner.critique_samples import (
    build_samples,
    critic_score,
    policy_turn_spans,
    revision_samples,
    shaped_reward,
    supervised_from_parquet,
    verl_advantages,
)
from cast_rl.rollout.trajectory import Trajectory

# A critiqued episode, laid out like the rollout runner writes it:
# 0 system, 1 user, 2 assistant (rejected), 3 critic, 4 assistant (revision, accepted), 5 tool,
# 6 assistant (final answer).  Policy turns are the runs of 1s in loss_mask.
MESSAGES = [
    {"role": "system", "content": "policy"},
    {"role": "user", "content": "cancel my order"},
    {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "cancel"}}]},
    {"role": "user", "name": "critic", "content": "authenticate first"},
    {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "find_user"}}]},
    {"role": "tool", "content": "user found"},
    {"role": "assistant", "content": "done"},
]
TOKENS = list(range(100, 120))
MASK = [0, 0, 0, 0, 1, 1, 1, 0, 0, 0, 1, 1, 0, 0, 0, 1, 1, 1, 1, 0]
LOGPROBS = [-0.5 * m for m in MASK]
ROUND = {"message_index": 2, "proposal": {"name": "cancel", "kwargs": {}},
         "critique": {"verdict": "invalid"}, "revision": {"name": "find_user", "kwargs": {}}}


def _traj(task: int, trial: int, reward: float, rounds: list | None = None, **kw) -> Trajectory:
    return Trajectory(domain="retail", split="test", task_index=task, trial=trial, reward=reward,
                      policy_version=3, messages=MESSAGES, token_ids=TOKENS, loss_mask=MASK,
                      logprobs=LOGPROBS, verification_rounds=rounds or [], **kw)


def test_critic_score_from_rounds_and_from_verdicts() -> None:
    assert critic_score(_traj(0, 0, 1.0)) == 1.0
    assert critic_score(_traj(0, 0, 1.0, [ROUND])) == pytest.approx(1 - 1 / 3)  # 1 of 3 rejected
    t = _traj(0, 0, 1.0, info={"critic_verdicts": ["valid", "invalid", "valid", "valid"]})
    assert critic_score(t) == 0.75
    assert shaped_reward(t, 0.5) == pytest.approx(1.375)
    assert shaped_reward(t, 0.0) == 1.0


def test_outcome_groups_use_verl_advantages_per_task_and_only_policy_tokens() -> None:
    cfg = load_config(None, ["algorithm.critic_reward_weight=0.5"])
    trajs = [_traj(0, 0, 1.0), _traj(0, 1, 0.0, [ROUND]), _traj(1, 0, 1.0), _traj(1, 1, 1.0)]
    samples = build_samples(trajs, cfg, "r7")
    assert [s.source for s in samples] == ["outcome_groups"] * 4
    rewards = [1.5, 0.5 * (1 - 1 / 3), 1.5, 1.5]
    assert [s.reward for s in samples] == pytest.approx(rewards)
    expected = verl_advantages(rewards, [MASK] * 4, ["a", "a", "b", "b"], "grpo")
    assert [s.advantage for s in samples] == pytest.approx(expected)
    assert samples[2].advantage == 0.0  # equal rewards in a group: no signal
    assert samples[0].loss_mask == MASK and samples[1].critique_changed and not samples[0].critique_changed
    assert len({s.key for s in samples}) == 4 and samples[0].group == "r7/retail/test/0"


def test_revision_sample_is_the_prompt_up_to_the_revision_and_its_tokens() -> None:
    assert policy_turn_spans(MASK) == [(4, 7), (10, 12), (15, 19)]
    cfg = load_config(None, ["critic.verification_budget=2", "algorithm.samples=[revision]"])
    accepted = _traj(0, 0, 0.0, [ROUND])
    rejected_again = _traj(0, 1, 0.0, [ROUND, {**ROUND, "message_index": 4, "revision": None}])
    samples = revision_samples([accepted, rejected_again], cfg, "r0")
    assert len(samples) == 2
    first = samples[0]
    assert first.token_ids == TOKENS[:12]
    assert first.loss_mask == [0] * 10 + [1, 1]
    assert first.logprobs[10:] == [-0.5, -0.5] and first.reward == 1.0
    assert samples[1].reward == 0.0 and samples[0].advantage > 0 > samples[1].advantage
    # budget 1: nobody judged the revision, so there is no sample
    assert revision_samples([accepted], load_config(None, ["critic.verification_budget=1"]), "r0") == []


def test_supervised_samples_from_successful_corrected_trajectories() -> None:
    cfg = load_config(None, ["algorithm.samples=[supervised,outcome_groups]"])
    trajs = [_traj(0, 0, 1.0, [ROUND]), _traj(0, 1, 1.0), _traj(0, 2, 0.0, [ROUND])]
    samples = build_samples(trajs, cfg, "r1")
    sup = [s for s in samples if s.source == "supervised"]
    assert len(sup) == 1 and sup[0].loss_mask == MASK and not sup[0].is_policy
    assert len([s for s in samples if s.source == "outcome_groups"]) == 3


def test_supervised_samples_from_parquet(learner_model_dir: Path, tmp_path: Path) -> None:
    tok = AutoTokenizer.from_pretrained(learner_model_dir)
    path = tmp_path / "critic.parquet"
    rows = {"prompt_messages": [json.dumps([{"role": "user", "content": "Is this action valid?"}])],
            "completion": ['{"verdict": "valid"}']}
    pq.write_table(pa.table(rows), path)
    (s,) = supervised_from_parquet(path, tok)
    n_prompt = s.loss_mask.index(1)
    prompt = tok.decode(s.token_ids[:n_prompt])
    assert prompt.endswith("assistant\n") and "Is this action valid?" in prompt
    assert tok.decode(s.token_ids[n_prompt:]) == '{"verdict": "valid"}' + tok.eos_token
    assert all(s.loss_mask[n_prompt:])
