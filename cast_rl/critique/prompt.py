"""The critic's chat prompt: the policy, the visible conversation with message indices, the action.

The same rendering serves the critic datasets (:mod:`cast_rl.critique.datasets`), the model
critic (:class:`~cast_rl.critique.verifier.ModelVerifier`) and the teacher
(:mod:`cast_rl.critique.teacher`), so a trained critic sees at inference exactly what it saw in
training.  Message indices in the transcript are the trajectory's, so evidence the critic cites
points into the real conversation.  Long prompts keep the policy and the newest messages.

A critic model with ``critic.model.entity_aliases`` reads the conversation as an aliased policy
does (:mod:`cast_rl.models.aliases`: ``[order_1]`` for the first order id the conversation
shows): :func:`aliased` gives the request it reads and the table that maps its answer back, so
what it learns is not tied to one database's identifiers.  An identifier the conversation never
showed stays real in the proposal, which is what a hallucinated one looks like.
"""

from __future__ import annotations

import json
from typing import Any

from cast_rl.critique.context import RESPOND, message_text
from cast_rl.critique.records import VerifyRequest
from cast_rl.models.aliases import AliasTable, EntityAliases
from cast_rl.records import CRITIC_NAME

CRITIC_SYSTEM = """You are the critic of a {domain} customer-service agent. You check one proposed \
action of the agent against its policy and against what the agent could see: the policy, the \
user's messages and the tool outputs. Error types, in the order to report them: hallucination \
(an id, name, amount or address that appears nowhere visible), policy_violation (the action \
breaks the policy given what is visible), wrong_tool_usage (grounded and allowed, but the wrong \
tool, record or arguments, or a call the tools reject).

Answer in exactly this format:
VERDICT: valid or invalid
ERROR: none, hallucination, policy_violation or wrong_tool_usage
CLAUSE: the policy sentence it breaks, or none
EVIDENCE: <message index> "<verbatim quote>" (one line per quote; policy for a policy quote)
EXPLANATION: one paragraph
FIX: one paragraph

# Policy
{policy}"""


def render_message(index: int, message: dict[str, Any], max_chars: int = 1500) -> str:
    """One transcript line: ``[index] role: text`` (tool calls as ``name(json arguments)``)."""
    role = message.get("role", "")
    if role == "user" and message.get("name") == CRITIC_NAME:
        role = "critic"
    parts = [message_text(message)]
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        parts.append(f"call {function.get('name')}({function.get('arguments', '')})")
    text = "\n".join(p for p in parts if p)
    if len(text) > max_chars:
        text = text[:max_chars] + " ..."
    name = f" ({message['name']})" if role == "tool" and message.get("name") else ""
    return f"[{index}] {role}{name}: {text}"


def render_proposal(proposal: dict[str, Any]) -> str:
    name = proposal.get("name")
    kwargs = proposal.get("kwargs") or {}
    if name == RESPOND:
        return f"reply to the user: {kwargs.get('content', '')}"
    return f"call {name}({json.dumps(kwargs, ensure_ascii=False)})"


def aliased(request: VerifyRequest, aliases: EntityAliases | None) -> tuple[VerifyRequest, AliasTable | None]:
    """The request as a critic with ``aliases`` reads it, and the table of its conversation
    (``None`` without aliases: the request itself).  The proposal's arguments name the aliases of
    identifiers the conversation showed; any other identifier stays real."""
    if aliases is None:
        return request, None
    messages, table = aliases.apply(request.messages)
    kwargs = request.proposal.get("kwargs") or {}
    shown = json.loads(aliases.to_policy(table, json.dumps(kwargs, ensure_ascii=False)))
    proposal = {**request.proposal, "kwargs": shown}
    return VerifyRequest(request.domain, request.policy, messages, proposal), table


MAX_PROMPT_CHARS = 24_000
"""The transcript a critic is shown when nothing else is configured (``critic.max_prompt_chars``'s
default): its training data, the served critic and the teacher cut to the same length."""


def critic_messages(request: VerifyRequest, max_chars: int = MAX_PROMPT_CHARS,
                    system_prompt: bool = True) -> list[dict[str, str]]:
    """OpenAI-style messages for the critic's chat template.

    System messages of the conversation are left out (the policy is in the critic's system
    prompt); when the transcript exceeds ``max_chars`` the oldest messages are dropped.  With
    ``system_prompt=False`` (``critic.system_prompt``) the critic's own system message, its
    instructions and the policy, is left out too: a trained critic reads the conversation and
    the action alone.
    """
    lines = [
        render_message(i, m) for i, m in enumerate(request.messages) if m.get("role") != "system"
    ]
    action = f"# Proposed action (message {len(request.messages)})\n{render_proposal(request.proposal)}"
    budget = max_chars - len(action)
    kept: list[str] = []
    for line in reversed(lines):
        if budget - len(line) < 0 and kept:
            break
        kept.append(line)
        budget -= len(line) + 1
    transcript = "\n".join(reversed(kept))
    if len(kept) < len(lines):
        transcript = "(earlier messages omitted)\n" + transcript
    user = {"role": "user", "content": f"# Conversation\n{transcript}\n\n{action}"}
    if not system_prompt:
        return [user]
    return [{"role": "system", "content": CRITIC_SYSTEM.format(domain=request.domain, policy=request.policy)}, user]


def served_prompt(critic: Any) -> dict[str, Any]:
    """The prompt options of the critic ``critic`` (a :class:`~cast_rl.config.critic.CriticConfig`)
    describes: ``aliases``, ``max_prompt_chars`` and ``system_prompt``, as
    :class:`~cast_rl.critique.verifier.ModelVerifier` and
    :func:`~cast_rl.critique.datasets.build_critic_data` take them, so that a critic trained on the
    data reads in training what it reads served."""
    patterns = critic.model.entity_aliases
    return {"aliases": EntityAliases(patterns) if patterns else None, "max_prompt_chars": critic.max_prompt_chars,
            "system_prompt": critic.system_prompt}
