"""``critic.min_invalid_prob``: an "invalid" the critic gave its verdict token little probability
to is judged valid, with that probability kept in the rationale.

The probability is read from the completion's per-token logprobs at the first token of the word
after ``VERDICT:``, located by decoding with the critic's own tokenizer (the tiny model's BPE here).
The engine is a stand-in that returns a fixed completion: what is tested is the reading and the
decision, not generation.
"""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
from transformers import AutoTokenizer

from cast_rl.config import load_config
from cast_rl.critique.records import VerifyRequest
from cast_rl.critique.service import critic_sampling
from cast_rl.critique.verifier import ModelVerifier, verdict_probability
from cast_rl.inference.base import Completion, Sampling

INVALID = ("VERDICT: invalid\nERROR: policy_violation\nCLAUSE: none\n"
           "EXPLANATION: cancel pending order changes the database without an explicit yes.")
VALID = "VERDICT: valid\nERROR: none\nCLAUSE: none\nEXPLANATION: The call is grounded."


def completion(tok, text: str, verdict_prob: float) -> Completion:  # noqa: ANN001
    """``text`` tokenized, every token certain except the verdict word's first one."""
    ids = tok(text, add_special_tokens=False).input_ids
    start = text.index("VERDICT:") + len("VERDICT: ")
    logprobs, seen = [], ""
    for token in ids:
        before = len(seen)
        seen += tok.decode([token], skip_special_tokens=False)
        logprobs.append(math.log(verdict_prob) if before <= start < len(seen) else 0.0)
    return Completion(text=text, token_ids=ids, logprobs=logprobs)


class FixedEngine:
    def __init__(self, tokenizer, answer: Completion) -> None:  # noqa: ANN001
        self.tokenizer, self.answer, self.model_path = tokenizer, answer, "fixed-critic"

    async def chat(self, messages, sampling, tools=None) -> Completion:  # noqa: ANN001
        assert sampling.logprobs  # the threshold needs them
        return self.answer


def _request() -> VerifyRequest:
    return VerifyRequest(domain="retail", policy="Be careful.", messages=[{"role": "user", "content": "Cancel it."}],
                         proposal={"name": "cancel_pending_order", "kwargs": {"order_id": "#W1"}})


@pytest.fixture(scope="module")
def tok(tiny_model_dir: Path):  # noqa: ANN201
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def test_the_verdict_tokens_probability_is_read(tok) -> None:  # noqa: ANN001
    assert verdict_probability(tok, completion(tok, INVALID, 0.3)) == pytest.approx(0.3)
    assert verdict_probability(tok, completion(tok, VALID, 0.8)) == pytest.approx(0.8)
    assert verdict_probability(tok, Completion(text="no verdict here", token_ids=[1], logprobs=[0.0])) is None


@pytest.mark.parametrize(("threshold", "prob", "verdict"), [(0.5, 0.3, "valid"), (0.2, 0.3, "invalid"),
                                                            (0.5, 0.9, "invalid")])
def test_an_unsure_invalid_is_judged_valid(tok, threshold: float, prob: float, verdict: str) -> None:  # noqa: ANN001
    critic = ModelVerifier(FixedEngine(tok, completion(tok, INVALID, prob)), Sampling(logprobs=True),
                           min_invalid_prob=threshold)
    (critique,) = asyncio.run(critic.verify([_request()]))
    assert critique.verdict == verdict and critique.critic == "fixed-critic"
    if verdict == "valid":
        assert critique.error_type == "none" and critique.rationale["invalid_prob"] == pytest.approx(prob)
        assert "critic.min_invalid_prob" in critique.rationale["explanation"]
    else:
        assert critique.error_type == "policy_violation" and "invalid_prob" not in critique.rationale


def test_a_valid_verdict_is_never_touched(tok) -> None:  # noqa: ANN001
    critic = ModelVerifier(FixedEngine(tok, completion(tok, VALID, 0.01)), Sampling(logprobs=True),
                           min_invalid_prob=0.9)
    (critique,) = asyncio.run(critic.verify([_request()]))
    assert critique.verdict == "valid" and "invalid_prob" not in critique.rationale


def test_the_key_asks_for_logprobs_and_is_checked(tok) -> None:  # noqa: ANN001
    assert not critic_sampling(load_config(None, []).critic).logprobs
    assert critic_sampling(load_config(None, ["critic.min_invalid_prob=0.6"]).critic).logprobs
    with pytest.raises(ValueError, match=r"critic.min_invalid_prob=1.0 is not allowed"):
        load_config(None, ["critic.min_invalid_prob=1.0"])
    with pytest.raises(ValueError, match="needs the critic's token logprobs"):
        ModelVerifier(SimpleNamespace(tokenizer=None), Sampling(logprobs=True), min_invalid_prob=0.5)
    with pytest.raises(ValueError, match="needs the critic's token logprobs"):
        ModelVerifier(FixedEngine(tok, completion(tok, VALID, 1.0)), Sampling(logprobs=False), min_invalid_prob=0.5)
