"""Teacher rationales: an LLM rewrites a rule-based rationale in natural language.

The teacher sees only what the critic may see (the visible conversation and the proposed action,
rendered by :func:`cast_rl.critique.prompt.critic_messages`) plus the rule-based critique, and
answers in the same fixed format.  Its rewrite is kept only when it parses, keeps the verdict and
the error type, and passes the same leakage check as the rule-based rationale; otherwise it is
discarded (and counted) and the rule-based rationale stays.

Any :class:`~cast_rl.inference.base.InferenceEngine` can teach: ``teacher.inference.backend``
picks it (vllm for a local model, openai for an OpenAI-compatible endpoint, through
:func:`cast_rl.inference.build_engine` like every other model).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from cast_rl.config.schema import TeacherConfig
from cast_rl.critique.context import ActionRef, Visible
from cast_rl.critique.labeller import ActionLabel, teacher_items
from cast_rl.critique.prompt import MAX_PROMPT_CHARS, critic_messages
from cast_rl.critique.rationale import Rationale, format_critique, leakage_problems, parse_critique
from cast_rl.critique.verifier import VerifyRequest
from cast_rl.envs.core import DomainData
from cast_rl.inference import build_engine
from cast_rl.inference.base import Sampling
from cast_rl.models.chat import split_thought
from cast_rl.models.setup import ensure_model
from cast_rl.records import Trajectory

logger = logging.getLogger(__name__)

TEACHER_NOTE = """A rule-based checker wrote the critique below. Rewrite it as a careful human \
reviewer would: clear natural language, the same verdict and error type, evidence quoted \
verbatim from the conversation or the policy, and no id or value that the conversation does not \
show. Answer in the critique format only.

# Rule-based critique
{critique}"""


@dataclass
class TeacherStats:
    rewritten: int = 0
    discarded: int = 0


class Teacher:
    """Rewrites rationales through an engine; see the module docstring."""

    def __init__(self, engine: Any, sampling: Sampling | None = None, max_prompt_chars: int = MAX_PROMPT_CHARS) -> None:
        self.engine = engine
        self.sampling = sampling or Sampling(max_new_tokens=384, temperature=0.0, logprobs=False)
        self.max_prompt_chars = max_prompt_chars
        self.stats = TeacherStats()

    async def rewrite(
        self, rationale: Rationale, visible: Visible, action: ActionRef, domain: str
    ) -> Rationale | None:
        """The teacher's rationale, or None when it is discarded."""
        request = VerifyRequest(domain, visible.policy, visible.messages, action.to_json())
        messages = critic_messages(request, self.max_prompt_chars)
        messages[-1] = {
            "role": "user",
            "content": messages[-1]["content"] + "\n\n" + TEACHER_NOTE.format(critique=format_critique(rationale)),
        }
        try:
            completion = await self.engine.chat(messages, self.sampling)
        except Exception as exc:  # a failed teacher call only loses the rewrite
            logger.warning("teacher call failed: %s", exc)
            self.stats.discarded += 1
            return None
        rewritten = parse_critique(split_thought(completion.text)[1])  # a Qwen3 thought is no critique
        ok = (
            rewritten is not None
            and rewritten.verdict == rationale.verdict
            and rewritten.error_type == rationale.error_type
            and not leakage_problems(rewritten, visible, action)
        )
        if not ok:
            self.stats.discarded += 1
            return None
        self.stats.rewritten += 1
        return rewritten

    async def rewrite_many(
        self, items: list[tuple[Rationale, Visible, ActionRef, str]], concurrency: int = 8
    ) -> list[Rationale | None]:
        gate = asyncio.Semaphore(concurrency)

        async def one(item: tuple[Rationale, Visible, ActionRef, str]) -> Rationale | None:
            async with gate:
                return await self.rewrite(*item)

        return list(await asyncio.gather(*(one(i) for i in items)))


def build_teacher_engine(cfg: TeacherConfig, seed: int = 0) -> Any:
    """The engine of ``teacher.inference.backend``: an OpenAI-compatible endpoint (openai, the
    model named ``teacher.model.path``) or the local model at ``teacher.model.path``, served in
    ``teacher.model.dtype`` (with ``teacher.model.make_tiny_if_missing``, a tiny model of
    ``teacher.model.tiny`` and ``seed`` is built there first when it is missing, as for the
    user and the labeller: a CPU rehearsal's stand-in teacher)."""
    local = cfg.inference.backend == "vllm" and cfg.model.make_tiny_if_missing
    path = str(ensure_model(cfg.model)) if local else cfg.model.path
    return build_engine(path, cfg.inference, seed=seed, dtype=cfg.model.dtype)


async def rewrite_labels(
    cfg: TeacherConfig, data: DomainData, labels: list[ActionLabel], trajectories: list[Trajectory], seed: int = 0,
    engine: Any = None,
) -> dict[str, float]:
    """Let the teacher of ``cfg`` rewrite each label's rationale in place (sampling from
    ``teacher.inference``); rewrites that fail the checks are discarded.  Returns the
    ``label/teacher_rewritten`` and ``label/teacher_discarded`` counts.  ``engine``: a running
    teacher engine (the pipeline's teacher service, ``actors.teacher_service``), left open; without
    one, the engine is built here and closed after."""
    owned = engine is None
    engine = build_teacher_engine(cfg, seed) if owned else engine
    sampling = Sampling(
        max_new_tokens=cfg.inference.max_new_tokens,
        temperature=cfg.inference.temperature,
        top_p=cfg.inference.top_p,
        logprobs=False,
    )
    teacher = Teacher(engine, sampling, max_prompt_chars=cfg.max_prompt_chars)
    try:
        items = teacher_items(data, labels, trajectories)
        results = await teacher.rewrite_many([item for _, item in items])
        for (pos, _), rationale in zip(items, results):
            if rationale is not None:
                labels[pos].rationale = rationale.to_json()
    finally:
        if owned:
            await engine.close()
    return {"label/teacher_rewritten": teacher.stats.rewritten, "label/teacher_discarded": teacher.stats.discarded}
