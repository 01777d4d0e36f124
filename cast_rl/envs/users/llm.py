"""A language-model customer, prompted like the tau-bench user simulator.

:class:`LLMUser` plays the customer described by the task instruction.  Its history has the roles
flipped: the simulator's own lines are ``assistant`` messages and the agent's messages are
``user`` messages, after a system prompt (our wording of the source benchmark's rules: one line at
a time, reveal information only when needed, never invent facts, end with ``###STOP###`` once
the goal is met) and the agent's opening line "Hi! How can I help you today?".

The model is reached through an injected ``complete(messages) -> str`` coroutine, so any engine
can serve it: :func:`engine_complete` adapts any :class:`~cast_rl.inference.InferenceEngine`
(each rollout worker builds the user model's engine, :func:`cast_rl.envs.users.user_engine`: its
own vLLM engine, or an OpenAI-compatible endpoint through
:class:`~cast_rl.inference.openai_engine.OpenAIEngine`).  A call slower than ``timeout_s`` raises
:class:`UserSimulatorTimeout`.  Replies are stripped of surrounding whitespace.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from cast_rl.envs.types import Task
from cast_rl.envs.users.traits import Trait, persona_line
from cast_rl.inference.base import Sampling

Complete = Callable[[list[dict[str, str]]], Awaitable[str]]
"""An engine call: chat messages in, the next assistant message's text out."""

OPENING = "Hi! How can I help you today?"
"""The agent's first line, as in the source benchmark."""


class UserSimulatorTimeout(TimeoutError):
    """The user model did not answer within ``timeout_s`` seconds."""


def system_prompt(instruction: str, trait: Trait | None = None) -> str:
    """The simulator's system prompt for one task instruction (and a trait's persona line)."""
    persona = persona_line(trait) if trait is not None else ""
    return (
        "You play a customer talking to a customer-service agent.\n\n"
        f"Instruction: {instruction}\n\n"
        "Rules:\n"
        "- Write one line per turn: the customer's next message, nothing else.\n"
        "- Reveal the instruction's details step by step, only when the conversation needs "
        "them; never everything at once.\n"
        "- Never invent facts that the instruction does not give. If the agent asks for "
        "something you were not told (an order id, say), answer that you do not know or have "
        "it.\n"
        "- Once the instruction's goal is met, reply with exactly '###STOP###' and nothing else "
        "to end the conversation.\n"
        "- Use your own words rather than repeating the instruction verbatim.\n"
        "- Keep the conversation natural and stay in the character the instruction describes."
        + (f"\n- {persona}" if persona else "")
    )


class LLMUser:
    """Customer simulated by a chat model reached through ``complete``."""

    def __init__(self, complete: Complete, timeout_s: float = 60.0, trait: Trait | None = None) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s={timeout_s!r} is not allowed; it must be > 0")
        self._complete = complete
        self.timeout_s = timeout_s
        self.trait = trait
        self.messages: list[dict[str, str]] = []
        """The simulator's view of the conversation (roles flipped), system prompt first."""

    async def reset(self, task: Task, db: Mapping[str, Any] | None = None) -> str:
        self.messages = [
            {"role": "system", "content": system_prompt(task.instruction, self.trait)},
            {"role": "user", "content": OPENING},
        ]
        return await self._generate()

    async def step(self, agent_message: str) -> str:
        self.messages.append({"role": "user", "content": agent_message})
        return await self._generate()

    def fork(self) -> LLMUser:
        """A copy with its own history; it samples through the same ``complete``."""
        child = copy.copy(self)
        child.messages = [dict(m) for m in self.messages]
        return child

    async def _generate(self) -> str:
        try:
            # Send a copy: the engine must not see later appends or be able to alter history.
            reply = await asyncio.wait_for(
                self._complete([dict(m) for m in self.messages]), self.timeout_s
            )
        except asyncio.TimeoutError:
            raise UserSimulatorTimeout(
                f"the user model gave no reply within user.timeout_s={self.timeout_s}s"
            ) from None
        reply = reply.strip()
        self.messages.append({"role": "assistant", "content": reply})
        return reply


def engine_complete(engine: Any, cfg: Any) -> Complete:
    """A ``complete`` callable over an :class:`~cast_rl.inference.InferenceEngine`
    (the user model's engine), sampling as ``cfg`` (an ``InferenceConfig``) says."""
    sampling = Sampling(
        max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, top_p=cfg.top_p,
        logprobs=False,
    )

    async def complete(messages: list[dict[str, str]]) -> str:
        return (await engine.chat(messages, sampling)).text

    return complete

