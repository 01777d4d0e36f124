"""Critique-aware samples: GRPO with turn credit, revisions, critique-enriched SFT, distillation, RFT."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from transformers import AutoTokenizer

from cast_rl.config import load_config
from cast_rl.learner.batch import collate
from cast_rl.records import PolicyTurn, Trajectory
from cast_rl.samples.builders import (
    build_samples,
    distill_cut,
    revision_samples,
    verl_advantages,
    zero_variance_groups,
)
from cast_rl.samples.parquet import supervised_from_parquet

# A critiqued episode, laid out like the rollout runner writes it:
# 0 system, 1 user, 2 assistant (rejected), 3 critic, 4 assistant (revision, accepted), 5 tool,
# 6 assistant (final answer).  The runner records each assistant message's span in ``turns``.
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
CANCEL, FIND = {"name": "cancel", "kwargs": {}}, {"name": "find_user", "kwargs": {}}
REJECTED = PolicyTurn(2, 4, 7, CANCEL, verdict="invalid", error_type="policy_violation", executed=False)
ACCEPTED = PolicyTurn(4, 10, 12, FIND, verdict="valid", error_type="none")
FINAL = PolicyTurn(6, 15, 19, {"name": "respond", "kwargs": {"content": "done"}})
TURNS = [asdict(t) for t in (REJECTED, ACCEPTED, FINAL)]
PLAIN_TURNS = [asdict(PolicyTurn(2, 4, 7, CANCEL)), asdict(PolicyTurn(4, 10, 12, FIND)), asdict(FINAL)]


def _traj(task: int, trial: int, reward: float, rounds: list | None = None, **kw) -> Trajectory:
    kw.setdefault("turns", TURNS if rounds else PLAIN_TURNS)
    return Trajectory(domain="retail", split="test", task_index=task, trial=trial, reward=reward,
                      policy_version=3, messages=MESSAGES, token_ids=TOKENS, loss_mask=MASK,
                      logprobs=LOGPROBS, verification_rounds=rounds or [], **kw)


def _advantages(sample) -> list[float]:  # noqa: ANN001
    """The per-token advantages the learner trains with (target frame shifted back by one)."""
    batch = collate([sample], pad_id=0)
    return [0.0] + batch.advantages[0].tolist()


def test_outcome_groups_use_verl_advantages_on_raw_outcomes_and_only_executed_tokens() -> None:
    cfg = load_config(None, ["algorithm.filter_zero_variance_groups=false"])
    trajs = [_traj(0, 0, 1.0), _traj(0, 1, 0.0, [ROUND]), _traj(1, 0, 1.0), _traj(1, 1, 1.0)]
    samples = build_samples(trajs, cfg, "r7")
    assert [s.source for s in samples] == ["outcome_groups"] * 4
    assert [s.reward for s in samples] == [1.0, 0.0, 1.0, 1.0]
    executed = [0] * 10 + [1, 1, 0, 0, 0, 1, 1, 1, 1, 0]
    expected = verl_advantages([1.0, 0.0, 1.0, 1.0], [MASK, executed, MASK, MASK], ["a", "a", "b", "b"], "grpo")
    assert [s.advantage for s in samples] == pytest.approx(expected)
    assert samples[2].advantage == 0.0  # equal outcomes in a group: no signal
    # critic_reward_weight 0: the rejected proposal (tokens 4-6) carries no loss at all
    assert samples[1].loss_mask == executed and samples[0].loss_mask == MASK
    assert samples[1].critique_changed and not samples[0].critique_changed
    assert len({s.key for s in samples}) == 4 and samples[0].group == "r7/retail/test/0"


def test_rejected_proposal_gets_its_own_negative_credit_never_the_outcome() -> None:
    cfg = load_config(None, ["algorithm.critic_reward_weight=0.5"])
    trajs = [_traj(0, 0, 0.0), _traj(0, 1, 1.0, [ROUND])]  # the corrected trial succeeded
    _, corrected = build_samples(trajs, cfg, "r0")
    assert corrected.advantage > 0
    adv = _advantages(corrected)
    assert corrected.loss_mask == MASK  # the judged proposal now carries loss ...
    assert adv[4:7] == pytest.approx([-0.5] * 3)  # ... with the critic's -1 only, though the task succeeded
    assert adv[10:12] == pytest.approx([corrected.advantage + 0.5] * 2)  # accepted revision: outcome + valid
    assert adv[15:19] == pytest.approx([corrected.advantage] * 4)  # unjudged turn: the outcome
    assert max(adv[4:7]) < 0


def test_zero_variance_groups_are_dropped_unless_the_critic_gives_credit() -> None:
    trajs = [_traj(0, 0, 1.0), _traj(0, 1, 1.0), _traj(1, 0, 1.0), _traj(1, 1, 0.0)]
    assert zero_variance_groups(trajs) == (1, 2)
    samples = build_samples(trajs, load_config(None, []), "r0")
    assert [s.key.split("/")[3] for s in samples] == ["1", "1"]
    with_credit = [_traj(0, 0, 1.0, [ROUND]), _traj(0, 1, 1.0)]
    cfg = load_config(None, ["algorithm.critic_reward_weight=0.2"])
    kept = build_samples(with_credit, cfg, "r0")
    assert len(kept) == 1 and kept[0].critique_changed


def test_revision_sample_is_the_prompt_up_to_the_revision_and_its_tokens() -> None:
    cfg = load_config(None, ["critic.verification_budget=2", "algorithm.samples=[revision]"])
    accepted = _traj(0, 0, 0.0, [ROUND])
    again = [asdict(REJECTED), {**asdict(ACCEPTED), "verdict": "invalid", "executed": False}, asdict(FINAL)]
    rejected_again = _traj(0, 1, 0.0, [ROUND, {**ROUND, "message_index": 4, "revision": None}], turns=again)
    unjudged = _traj(0, 2, 0.0, [ROUND], turns=[asdict(REJECTED), asdict(PolicyTurn(4, 10, 12, FIND)), asdict(FINAL)])
    samples = revision_samples([accepted, rejected_again, unjudged], cfg, "r0")
    assert len(samples) == 2  # the budget ran out before anyone judged the third revision
    first = samples[0]
    assert first.token_ids == TOKENS[:12]
    assert first.loss_mask == [0] * 10 + [1, 1]
    assert first.logprobs[10:] == [-0.5, -0.5] and first.reward == 1.0
    assert samples[1].reward == 0.0 and samples[0].advantage > 0 > samples[1].advantage


def test_sft_kinds_mask_rejected_proposals_distill_cuts_them_rft_takes_uncritiqued() -> None:
    trajs = [_traj(0, 0, 1.0, [ROUND]), _traj(0, 1, 1.0), _traj(0, 2, 0.0, [ROUND])]
    for kind, expected_keys in (("supervised", ["0"]), ("distill", ["0"]), ("rft", ["1"])):
        cfg = load_config(None, [f"algorithm.samples=[{kind}]"])
        samples = build_samples(trajs, cfg, "r1")
        assert [s.key.split("/")[4] for s in samples] == expected_keys, kind
        assert all(s.source == "supervised" and not s.is_policy for s in samples)
    (sft,) = build_samples(trajs, load_config(None, ["algorithm.samples=[supervised]"]), "r1")
    assert sft.token_ids == TOKENS and sft.loss_mask[4:7] == [0, 0, 0]  # the rejected proposal
    assert sft.loss_mask[10:12] == [1, 1] and sft.loss_mask[15:19] == [1] * 4  # its revision and after
    (distilled,) = build_samples(trajs, load_config(None, ["algorithm.samples=[distill]"]), "r1")
    # tokens 4..9 (proposal, critique, next generation prompt) are gone: the revision follows 0..3
    assert distilled.token_ids == TOKENS[:4] + TOKENS[10:]
    assert distilled.loss_mask == [0] * 4 + [1, 1, 0, 0, 0, 1, 1, 1, 1, 0]
    (rft,) = build_samples(trajs, load_config(None, ["algorithm.samples=[rft]"]), "r1")
    assert rft.loss_mask == MASK


def test_distill_cut_without_rounds_is_the_identity() -> None:
    t = _traj(0, 0, 1.0)
    assert distill_cut(t) == (TOKENS, MASK)


def test_critiqued_trajectory_without_turn_records_is_refused() -> None:
    with pytest.raises(ValueError, match="no turn records"):
        build_samples([_traj(0, 0, 1.0, [ROUND], turns=[])], load_config(None, ["algorithm.samples=[supervised]"]), "r")


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


def test_replay_log_refers_to_trajectories_instead_of_repeating_their_tokens(tmp_path: Path) -> None:
    """Samples cut from trajectories are logged as refs into one trajectory file; a buffer on the
    same log rebuilds them exactly; a sample no trajectory gives is logged whole."""
    from cast_rl.config.schema import ReplayBufferConfig
    from cast_rl.learner.sample import Sample
    from cast_rl.replay import ReplayBuffer

    cfg = load_config(None, ["algorithm.samples=[outcome_groups,revision,supervised]"])
    trajs = [_traj(0, t, float(t % 2), [ROUND]) for t in range(4)] + [_traj(1, t, float(t < 2)) for t in range(4)]
    samples = build_samples(trajs, cfg, "r0")
    assert {s.source for s in samples} == {"outcome_groups", "revision", "supervised"}
    other = Sample("parquet/x/0", "supervised", [7, 8, 9], [0, 1, 1], [0.0, 0.0, 0.0])

    log = tmp_path / "replay" / "log.jsonl"
    buf = ReplayBuffer(ReplayBufferConfig(capacity=1000), log)
    assert buf.add(samples, trajs).accepted == len(samples)
    buf.add([other])
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    adds = [x for x in lines if x["op"] == "add"]
    assert all("ref" in x and "token_ids" not in x["sample"] for x in adds[:-1])
    assert "ref" not in adds[-1] and adds[-1]["sample"]["token_ids"] == [7, 8, 9]
    assert buf.trajectory_path.read_text().count("\n") == len(trajs)
    whole = sum(len(json.dumps({"op": "add", "sample": s.to_json()}, separators=(",", ":"))) + 1 for s in samples)
    assert log.stat().st_size < whole  # the tokens are not written again (tiny toy sequences here)

    again = ReplayBuffer(ReplayBufferConfig(capacity=1000), log)
    drawn = again.sample(len(samples) + 1, 0)
    assert [s.to_json() for s in drawn] == [s.to_json() for s in [*samples, other]]


def _trajectory_offsets(path: Path) -> list[int]:
    offsets, position = [], 0
    for line in path.read_bytes().splitlines(keepends=True):
        offsets.append(position)
        position += len(line)
    return offsets


def test_builders_name_each_samples_trajectory_and_the_log_refers_to_it_without_searching(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every sample cut from a trajectory carries its origin (position, logprob mode); the buffer
    checks that one trajectory once per sample and writes its offset.  All toy trajectories have
    the same tokens, so a prefix search would have referred every sample to the first one."""
    from cast_rl.config.schema import ReplayBufferConfig
    from cast_rl.replay import ReplayBuffer
    from cast_rl.replay import buffer as replay_buffer

    cfg = load_config(None, ["algorithm.samples=[outcome_groups,revision,supervised,distill,rft]",
                             "algorithm.filter_zero_variance_groups=false"])
    trajs = [_traj(0, t, float(t % 2), [ROUND]) for t in range(4)] + [_traj(1, t, 1.0) for t in range(4)]
    samples = build_samples(trajs, cfg, "r0")
    modes = {}
    for s in samples:
        kind = s.key.split("/")[5]
        if kind == "distill":  # a rejected proposal cut out of the middle: no prefix, no origin
            assert s.origin is None
            continue
        assert s.origin is not None
        source = trajs[s.origin.trajectory]
        assert s.key.startswith(f"r0/retail/test/{source.task_index}/{source.trial}/")
        modes[kind] = s.origin.logprobs
    assert modes == {"outcome": "trajectory", "revision": "masked", "supervised": "zero", "rft": "zero"}

    checked: list[str] = []
    real = replay_buffer._rebuilds

    def counting(traj: Trajectory, sample, origin) -> bool:  # noqa: ANN001
        checked.append(sample.key)
        return real(traj, sample, origin)

    monkeypatch.setattr(replay_buffer, "_rebuilds", counting)
    log = tmp_path / "replay" / "log.jsonl"
    buf = ReplayBuffer(ReplayBufferConfig(capacity=1000), log)
    assert buf.add(samples, trajs).accepted == len(samples)
    assert sorted(checked) == sorted(s.key for s in samples if s.origin)  # one check each, no search
    offsets = _trajectory_offsets(buf.trajectory_path)
    adds = [x for x in map(json.loads, log.read_text().splitlines()) if x["op"] == "add"]
    for rec, s in zip(adds, samples, strict=True):
        if s.origin is None:
            assert "ref" not in rec and rec["sample"]["token_ids"] == s.token_ids
        else:
            assert rec["ref"]["offset"] == offsets[s.origin.trajectory]
            assert rec["ref"]["logprobs"] == s.origin.logprobs and "origin_mismatch" not in rec
    assert buf.snapshot()["origin_mismatches"] == 0

    again = ReplayBuffer(ReplayBufferConfig(capacity=1000), log)
    drawn = again.sample(len(samples), 0)
    assert [s.to_json() for s in drawn] == [s.to_json() for s in samples]


def test_a_wrong_origin_is_logged_whole_and_counted(tmp_path: Path) -> None:
    """An origin that does not rebuild its sample (a builder bug) never reaches the log as a ref."""
    import dataclasses

    from cast_rl.config.schema import ReplayBufferConfig
    from cast_rl.replay import ReplayBuffer
    from cast_rl.samples import Origin

    cfg = load_config(None, ["algorithm.samples=[outcome_groups]", "algorithm.filter_zero_variance_groups=false"])
    trajs = [_traj(0, 0, 1.0), _traj(0, 1, 0.0)]
    trajs[1] = dataclasses.replace(trajs[1], token_ids=[t + 1 for t in TOKENS])
    good, other = build_samples(trajs, cfg, "r0")
    assert good.origin == Origin(0, "trajectory") and other.origin == Origin(1, "trajectory")
    wrong = [
        dataclasses.replace(good, key="other-tokens", origin=Origin(1, "trajectory")),
        dataclasses.replace(good, key="wrong-mode", origin=Origin(0, "zero")),
        dataclasses.replace(good, key="no-such-trajectory", origin=Origin(2, "trajectory")),
    ]
    log = tmp_path / "log.jsonl"
    buf = ReplayBuffer(ReplayBufferConfig(capacity=1000), log)
    buf.add([good, *wrong], trajs)
    adds = [x for x in map(json.loads, log.read_text().splitlines()) if x["op"] == "add"]
    assert "ref" in adds[0] and all("ref" not in x and x["origin_mismatch"] for x in adds[1:])
    assert buf.snapshot()["origin_mismatches"] == 3

    again = ReplayBuffer(ReplayBufferConfig(capacity=1000), log)
    assert again.snapshot()["origin_mismatches"] == 3  # recovered with the log
    assert [s.to_json() for s in again.sample(4, 0)] == [s.to_json() for s in [good, *wrong]]
