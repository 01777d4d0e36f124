"""The verification hook between rollout workers and a critic.

A rollout worker that runs with ``critic.verification_budget > 0`` hands each proposed action to
a :class:`Verifier` before it runs; the critique's ``text`` is shown to the policy as a ``user``
message named ``critic`` and the round is recorded in the trajectory.

Implementations: :class:`cast_rl.critique.verifier.RuleVerifier` (visible-information rules,
no gold actions), :class:`cast_rl.critique.verifier.ModelVerifier` (a critic LLM behind an
:class:`~cast_rl.inference.base.InferenceEngine`), and the retrying client of the Ray critic
service (:class:`actors.critic_service.CriticServiceClient`).  The records a critic is asked and
answers live in :mod:`cast_rl.critique.records` (imported here too).
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
from collections import Counter
from dataclasses import replace
from typing import Any

from cast_rl.critique.context import ActionRef, Visible
from cast_rl.critique.prompt import MAX_PROMPT_CHARS, aliased, critic_messages
from cast_rl.critique.rationale import (
    Rationale,
    format_critique,
    leakage_problems,
    parse_critique,
    unparsable,
)
from cast_rl.critique.records import VERDICTS, Critique, Verifier, VerifyRequest
from cast_rl.critique.rules import choose, get_rules, to_rationale, visible_findings
from cast_rl.inference.base import ContextOverflow, Sampling
from cast_rl.models.aliases import EntityAliases

__all__ = ["VERDICTS", "Critique", "GuardedVerifier", "ModelVerifier", "RuleVerifier", "Verifier",
           "VerifyRequest"]

logger = logging.getLogger(__name__)


class RuleVerifier:
    """Critiques from the visible-information rules of each domain (no gold actions, no env).

    ``tools`` (domain -> tool schemas) enables the argument-name checks; without it they are
    skipped.  Used as the embedded default critic and in tests.
    """

    def __init__(self, tools: dict[str, list[dict[str, Any]]] | None = None) -> None:
        self.tools = dict(tools or {})

    async def verify(self, requests: list[VerifyRequest]) -> list[Critique]:
        return [self.verify_one(r) for r in requests]

    def verify_one(self, request: VerifyRequest) -> Critique:
        rules = get_rules(request.domain)
        proposal = request.proposal
        action = ActionRef(
            len(request.messages), 0, str(proposal.get("name", "")), dict(proposal.get("kwargs") or {})
        )
        visible = Visible(request.policy, request.messages, self.tools.get(request.domain, []))
        rationale = to_rationale(choose(visible_findings(action, visible, rules)), visible, action)
        if leakage_problems(rationale, visible, action):  # never expected from the rules
            rationale.evidence = []
            rationale.explanation = f"The action is judged {rationale.error_type}."
            rationale.suggested_fix = ""
        return Critique(
            rationale.verdict, rationale.error_type, rationale.to_json(), format_critique(rationale),
            critic="rule",
        )


class ModelVerifier:
    """Critiques written by a critic model behind an :class:`InferenceEngine`.

    The answer is parsed into the rationale schema; an answer that does not follow the format
    (or a failed generation) is reported with verdict ``unparsable``, never as valid.  Every
    critique names the critic that wrote it (``name``: default the engine's model directory).
    With ``aliases`` (``critic.model.entity_aliases``) the critic reads the conversation aliased
    and the aliases in its answer are mapped back to the conversation's identifiers before the
    answer is parsed (:func:`cast_rl.critique.prompt.aliased`).
    """

    def __init__(
        self, engine: Any, sampling: Any = None, max_prompt_chars: int = MAX_PROMPT_CHARS, name: str = "",
        owns_engine: bool = True, min_invalid_prob: float = 0.0, aliases: EntityAliases | None = None,
        system_prompt: bool = True,
    ) -> None:
        self.engine = engine
        self.owns_engine = owns_engine
        """:meth:`close` shuts the engine down (False: the engine is another's, e.g. the policy's
        engine serving this critic as an adapter)."""
        self.sampling = sampling or Sampling(max_new_tokens=256, temperature=0.0, logprobs=False)
        self.max_prompt_chars = max_prompt_chars
        self.name = name or str(getattr(engine, "model_path", "model"))
        self.aliases = aliases
        self.system_prompt = system_prompt
        """``critic.system_prompt``: False shows the critic the conversation and the action alone."""
        self.min_invalid_prob = min_invalid_prob
        """``critic.min_invalid_prob``: an "invalid" below it is judged valid (:meth:`confident`)."""
        if min_invalid_prob > 0 and not (self.sampling.logprobs and getattr(engine, "tokenizer", None) is not None):
            raise ValueError("critic.min_invalid_prob > 0 needs the critic's token logprobs and its engine's "
                             "tokenizer (a vLLM engine; sampling with logprobs=True)")

    async def verify(self, requests: list[VerifyRequest]) -> list[Critique]:
        views = [aliased(r, self.aliases) for r in requests]
        results = await asyncio.gather(*(self._answer(view) for view, _ in views), return_exceptions=True)
        critiques = [self.parse(self.real(r, table)) for r, (_, table) in zip(results, views)]
        if self.min_invalid_prob > 0:
            critiques = [self.confident(c, r) for c, r in zip(critiques, results)]
        return [replace(c, critic=self.name) for c in critiques]

    async def _answer(self, request: VerifyRequest) -> Any:
        """The critic's completion for ``request``.  A prompt that leaves no room for the answer
        in the critic's context (``ContextOverflow``: the policy in the system prompt plus a
        transcript of up to ``max_prompt_chars``) is shortened the way ``max_prompt_chars`` does
        it, the oldest messages first, a fifth of the shown transcript at a time, until it fits;
        only a prompt that cannot shrink further (its last message alone) fails."""
        max_chars = self.max_prompt_chars
        shown = None
        while True:
            messages = critic_messages(request, max_chars, self.system_prompt)
            if messages == shown:
                raise ContextOverflow(f"the critic's prompt does not fit its context even with only the last "
                                      f"message of the conversation ({self.name})")
            try:
                return await self.engine.chat(messages, self.sampling)
            except ContextOverflow:
                shown = messages
                max_chars = int(len(messages[-1]["content"]) * 0.8)

    def real(self, result: Any, table: Any) -> Any:
        """The completion with the aliases it names mapped back (the result itself without aliases)."""
        if table is None or self.aliases is None or isinstance(result, BaseException):
            return result
        return replace(result, text=self.aliases.to_real(table, result.text))

    def confident(self, critique: Critique, completion: Any) -> Critique:
        """``critique``, or a valid one when it says invalid with a verdict token less probable
        than ``min_invalid_prob`` (the probability is kept in the rationale as ``invalid_prob``)."""
        if critique.verdict != "invalid":
            return critique
        prob = verdict_probability(self.engine.tokenizer, completion)
        if prob is None or prob >= self.min_invalid_prob:
            return critique
        rationale = Rationale("valid", "none", explanation=(
            f"The critic's invalid verdict had probability {prob:.3f}, under critic.min_invalid_prob="
            f"{self.min_invalid_prob}: the action is judged valid."))
        return Critique("valid", "none", {**rationale.to_json(), "invalid_prob": prob}, format_critique(rationale))

    async def close(self) -> None:
        """Shut the critic's engine down (its processes and memory), if it is the critic's own."""
        if self.owns_engine:
            await self.engine.close()

    @staticmethod
    def parse(result: Any) -> Critique:
        """The critique a completion holds, or an ``unparsable`` one."""
        if isinstance(result, BaseException):
            logger.warning("critic generation failed: %s", result)
            text = f"generation failed: {result}"
            return Critique("unparsable", "unknown", unparsable(text), "")
        rationale = parse_critique(result.text)
        if rationale is None:
            return Critique("unparsable", "unknown", unparsable(result.text), "")
        return Critique(
            rationale.verdict, rationale.error_type, rationale.to_json(), format_critique(rationale)
        )


UNPARSABLE_TEXT = (
    "The critic could not judge this action (its answer was unreadable). Check the action against "
    "the policy and what you were told, then propose it again or a corrected one."
)
"""What the policy is shown for an unparsable answer under ``critic.on_unparsable=reject``."""


def verdict_probability(tokenizer: Any, completion: Any) -> float | None:
    """The probability the critic gave the first token of its verdict word (``VERDICT: <word>``),
    from the completion's per-token logprobs; None when the answer has no verdict line."""
    match = _VERDICT_WORD.search(completion.text)
    if match is None or not completion.logprobs:
        return None
    start, text = match.start(1), ""
    for i, token in enumerate(completion.token_ids):
        text += tokenizer.decode([token], skip_special_tokens=False)
        if len(text) > start:
            return math.exp(completion.logprobs[i])
    return None


_VERDICT_WORD = re.compile(r"VERDICT:\s*(valid|invalid)", re.IGNORECASE)


class GuardedVerifier:
    """The verifier rollout workers consult: counts every answer and applies ``on_unparsable``.

    ``counts`` (shared with the worker's metrics) gets ``answers`` and ``unparsable``.  With
    ``on_unparsable="allow"`` an unparsable critique passes through (the runner lets the action
    run); with ``"reject"`` it becomes an ``invalid`` critique marked ``unparsable=True`` with
    :data:`UNPARSABLE_TEXT`, so the proposal goes back for revision and the round is recorded.
    """

    def __init__(self, inner: Verifier, on_unparsable: str = "allow", counts: Counter[str] | None = None) -> None:
        if on_unparsable not in ("allow", "reject"):
            raise ValueError(f"critic.on_unparsable={on_unparsable!r} is not allowed; choose allow or reject")
        self.inner = inner
        self.on_unparsable = on_unparsable
        self.counts: Counter[str] = counts if counts is not None else Counter()

    async def verify(self, requests: list[VerifyRequest]) -> list[Critique]:
        critiques = await self.inner.verify(requests)
        self.counts["answers"] += len(critiques)
        out = []
        for c in critiques:
            if c.verdict == "unparsable":
                self.counts["unparsable"] += 1
                logger.debug("unparsable critique from %s (critic.on_unparsable=%s)", c.critic, self.on_unparsable)
                if self.on_unparsable == "reject":
                    c = replace(c, verdict="invalid", text=UNPARSABLE_TEXT, unparsable=True)
            out.append(c)
        return out

    async def close(self) -> None:
        close = getattr(self.inner, "close", None)
        if close is not None:
            await close()
