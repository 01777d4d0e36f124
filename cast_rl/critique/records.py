"""What a critic is asked and what it answers: :class:`VerifyRequest`, :class:`Critique`, and the
:class:`Verifier` protocol every critic implements.

The records sit apart from the critics (:mod:`cast_rl.critique.verifier`) so that the critic
prompt (:mod:`cast_rl.critique.prompt`), which the model critic uses, can name them without an
import cycle.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

VERDICTS = ("valid", "invalid", "unparsable")


@dataclass
class VerifyRequest:
    """One proposed action and everything the agent could see when it proposed it."""

    domain: str
    """Domain name (retail, airline, telecom, telehealth)."""
    policy: str
    """The domain policy text (the agent's system prompt)."""
    messages: list[dict[str, Any]]
    """Visible conversation so far, OpenAI-style, not including the proposal."""
    proposal: dict[str, Any]
    """``{"name": tool, "kwargs": {...}}``; ``{"name": "respond", "kwargs": {"content": ...}}``
    for a message to the user."""


@dataclass
class Critique:
    """A critic's answer to one :class:`VerifyRequest`."""

    verdict: str
    """valid, invalid or unparsable (the critic's output could not be read)."""
    error_type: str
    """none, hallucination, policy_violation or wrong_tool_usage ("unknown" when unparsable)."""
    rationale: dict[str, Any] = field(default_factory=dict)
    """The structured rationale (verdict, error_type, evidence, policy_clause, explanation,
    suggested_fix)."""
    text: str = ""
    """What the policy is shown."""
    critic: str = ""
    """Which critic answered: ``rule``, or the model directory of a model critic."""
    unparsable: bool = False
    """The critic's answer could not be read and ``critic.on_unparsable=reject`` turned it into
    this ``invalid`` critique (see :class:`GuardedVerifier`)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "error_type": self.error_type,
            "rationale": self.rationale,
            "text": self.text,
            "critic": self.critic,
            "unparsable": self.unparsable,
        }


@runtime_checkable
class Verifier(Protocol):
    """Critiques a batch of proposals; one :class:`Critique` per request, in order."""

    async def verify(self, requests: list[VerifyRequest]) -> list[Critique]: ...
