"""The critic's two-term loss: verdict lines and explanation, each a token mean over the global
batch, weighted (``pipeline.critic_loss=two_term``); the marking of critic samples; config errors.
Expected values are worked out by hand in each test."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from transformers import AutoTokenizer

from cast_rl.config import load_config
from cast_rl.learner.batch import collate
from cast_rl.learner.engine import LearnerEngine
from cast_rl.learner.losses import GlobalBatchInfo, critic_terms, supervised_loss
from cast_rl.learner.sample import Sample
from cast_rl.samples.parquet import supervised_from_parquet

# Two answers in the target frame: row 0 has verdict tokens at 0, 1 and explanation at 2, 3;
# row 1 a verdict token at 0 and an explanation token at 1.
LOGP = torch.tensor([[-0.2, -1.0, -0.4, -2.0, -9.0],
                     [-3.0, -0.6, -9.0, -9.0, -9.0]])
VERDICT = torch.tensor([[1.0, 1, 0, 0, 0], [1, 0, 0, 0, 0]])
EXPLANATION = torch.tensor([[0.0, 0, 1, 1, 0], [0, 1, 0, 0, 0]])


def test_two_terms_are_token_means_of_their_kind_worked_by_hand() -> None:
    info = GlobalBatchInfo(1, 0, 0, supervised_tokens=6, supervised_seqs=2, verdict_tokens=3, explanation_tokens=3)
    verdict, explanation = critic_terms(LOGP, VERDICT, EXPLANATION, info)
    assert float(verdict) == pytest.approx((0.2 + 1.0 + 3.0) / 3)  # 1.4
    assert float(explanation) == pytest.approx((0.4 + 2.0 + 0.6) / 3)  # 1.0
    # weights 2 and 0.5: 2 x 1.4 + 0.5 x 1.0 = 3.3; the single term over all six tokens is 7.2 / 6 = 1.2
    assert float(2.0 * verdict + 0.5 * explanation) == pytest.approx(3.3)
    assert float(supervised_loss(LOGP, VERDICT + EXPLANATION, info)) == pytest.approx(1.2)


def test_two_ranks_with_global_counts_sum_to_the_one_rank_terms() -> None:
    """Each rank divides by the global counts and scales by dp_size (verl): the ranks' mean
    (what FSDP's gradient averaging gives) is the one-rank value."""
    info = GlobalBatchInfo(2, 0, 0, supervised_tokens=6, supervised_seqs=2, verdict_tokens=3, explanation_tokens=3)
    ranks = [critic_terms(LOGP[r:r + 1], VERDICT[r:r + 1], EXPLANATION[r:r + 1], info) for r in (0, 1)]
    assert float(ranks[0][0] + ranks[1][0]) / 2 == pytest.approx(1.4)
    assert float(ranks[0][1] + ranks[1][1]) / 2 == pytest.approx(1.0)
    # rank 0 alone: its verdict tokens 0.2 + 1.0 over the global 3, times dp_size 2
    assert float(ranks[0][0]) == pytest.approx(2 * 1.2 / 3)


def test_a_kind_the_batch_lacks_is_zero_not_nan() -> None:
    info = GlobalBatchInfo(1, 0, 0, supervised_tokens=3, supervised_seqs=2, verdict_tokens=3, explanation_tokens=0)
    verdict, explanation = critic_terms(LOGP, VERDICT, torch.zeros_like(EXPLANATION), info)
    assert float(verdict) == pytest.approx(1.4) and float(explanation) == 0.0


def test_collate_carries_the_marking_into_the_target_frame() -> None:
    critic = Sample("c", "supervised", [5, 6, 7, 8, 9, 10], [0, 0, 1, 1, 1, 1], [0.0] * 6,
                    verdict_mask=[0, 0, 1, 1, 0, 0])
    plain = Sample("p", "supervised", [5, 6, 7, 8], [0, 1, 1, 1], [0.0] * 4)
    mb = collate([critic, plain], pad_id=0)
    # target frame: position t predicts token t + 1
    assert mb.verdict_mask.tolist() == [[0, 1, 1, 0, 0], [0, 0, 0, 0, 0]]
    assert mb.explanation_mask.tolist() == [[0, 0, 0, 1, 1], [0, 0, 0, 0, 0]]
    assert mb.supervised_mask.tolist() == [[0, 1, 1, 1, 1], [1, 1, 1, 0, 0]]


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"verdict_mask": [0, 1]}, "verdict_mask must hold 3 entries"),
    ({"verdict_mask": [1, 0, 0]}, "1 only where loss_mask is 1"),
    ({"verdict_mask": [0, 2, 0]}, "of 0 or 1"),
    ({"verdict_mask": [0, 1, 0], "source": "revision"}, "is for supervised critic examples"),
])
def test_sample_refuses_a_bad_verdict_mask(kwargs: dict, message: str) -> None:
    args = {"key": "k", "source": "supervised", "token_ids": [1, 2, 3], "loss_mask": [0, 1, 1],
            "logprobs": [0.0] * 3, **kwargs}
    with pytest.raises(ValueError, match=message):
        Sample(**args)
    ok = Sample("k", "supervised", [1, 2, 3], [0, 1, 1], [0.0] * 3, verdict_mask=[0, 1, 0])
    assert Sample.from_json(json.loads(json.dumps(ok.to_json()))) == ok


def test_critic_samples_mark_the_verdict_and_error_lines(learner_model_dir: Path, tmp_path: Path) -> None:
    tok = AutoTokenizer.from_pretrained(learner_model_dir)
    answers = ["VERDICT: invalid\nERROR: hallucination\nEXPLANATION: that order id appears nowhere",
               "VERDICT: valid\nERROR: none"]
    path = tmp_path / "train.parquet"
    prompt = json.dumps([{"role": "user", "content": "Is this action valid?"}])
    pq.write_table(pa.table({"prompt_messages": [prompt] * 2, "completion": answers}), path)
    for sample, answer in zip(supervised_from_parquet(path, tok, mark_verdict=True), answers):
        start = sample.loss_mask.index(1)
        verdict = [t for t, v in zip(sample.token_ids, sample.verdict_mask) if v]
        rest = [t for t, v, m in zip(sample.token_ids, sample.verdict_mask, sample.loss_mask) if m and not v]
        assert sample.token_ids[start:] == verdict + rest  # the verdict first, then the rest
        lines = "\n".join(answer.split("\n")[:2])
        assert tok.decode(verdict).rstrip("\n") == lines
        assert tok.decode(verdict) + tok.decode(rest) == answer + tok.eos_token
    unmarked = supervised_from_parquet(path, tok)  # the default: no marking, tokens unchanged
    assert [s.token_ids for s in unmarked] == [s.token_ids for s in supervised_from_parquet(path, tok, mark_verdict=True)]
    assert all(s.verdict_mask == [] for s in unmarked)
    pq.write_table(pa.table({"prompt_messages": [prompt], "completion": ['{"verdict": "valid"}']}), path)
    with pytest.raises(ValueError, match=r"train.parquet: row 0: a critique must begin with its VERDICT and ERROR"):
        supervised_from_parquet(path, tok, mark_verdict=True)


def _critic_batch() -> list[Sample]:
    """Four answers of 6 loss tokens after a 4-token prompt: 2 verdict tokens, then 4 others;
    in the target frame the first loss token (position 4) is predicted at 3."""
    return [Sample(f"c{i}", "supervised", list(range(10 + i, 20 + i)), [0] * 4 + [1] * 6, [0.0] * 10,
                   verdict_mask=[0] * 4 + [1, 1] + [0] * 4) for i in range(4)]


def test_engine_weighs_the_terms_and_reports_them(make_cfg) -> None:
    batch = _critic_batch()  # 8 verdict tokens, 16 explanation tokens
    single = LearnerEngine(make_cfg()).train_step(batch)
    # one token mean over all 24 = (8 x verdict mean + 16 x explanation mean) / 24
    assert single["supervised_loss"] == pytest.approx(
        (8 * single["verdict_loss"] + 16 * single["explanation_loss"]) / 24, rel=1e-5)
    two = LearnerEngine(make_cfg("pipeline.critic_loss=two_term", "pipeline.critic_verdict_weight=2.0",
                                 "pipeline.critic_explanation_weight=0.5")).train_step(batch)
    # the same weights, the same first forward pass: equal terms, weighted 2 and 0.5
    assert two["verdict_loss"] == pytest.approx(single["verdict_loss"], rel=1e-6)
    assert two["explanation_loss"] == pytest.approx(single["explanation_loss"], rel=1e-6)
    assert two["supervised_loss"] == pytest.approx(2.0 * two["verdict_loss"] + 0.5 * two["explanation_loss"], rel=1e-6)
    plain = Sample("p", "supervised", list(range(30, 40)), [0] * 4 + [1] * 6, [0.0] * 10)
    assert "verdict_loss" not in LearnerEngine(make_cfg("pipeline.critic_loss=two_term")).train_step([plain])


def test_engine_refuses_critic_and_other_supervised_samples_in_one_two_term_batch(make_cfg) -> None:
    plain = Sample("p", "supervised", list(range(30, 40)), [0] * 4 + [1] * 6, [0.0] * 10)
    engine = LearnerEngine(make_cfg("pipeline.critic_loss=two_term"))
    with pytest.raises(ValueError, match="6 supervised tokens of samples that mark no critic verdict beside 24"):
        engine.train_step([*_critic_batch(), plain])


@pytest.mark.parametrize(("overrides", "message"), [
    (["pipeline.critic_verdict_weight=2.0"],
     r"pipeline.critic_verdict_weight=2.0 is not allowed with pipeline.critic_loss='single'"),
    (["pipeline.critic_loss=two_term", "pipeline.critic_explanation_weight=-1"],
     r"pipeline.critic_explanation_weight=-1.0 is not allowed; it must be >= 0"),
    (["pipeline.critic_loss=two_term", "pipeline.critic_verdict_weight=0", "pipeline.critic_explanation_weight=0"],
     r"are not allowed together"),
    (["pipeline.critic_loss=both"], r"pipeline.critic_loss='both' is not allowed; choose one of single, two_term"),
])
def test_critic_loss_config_errors_name_the_keys(overrides: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_config(None, overrides)
