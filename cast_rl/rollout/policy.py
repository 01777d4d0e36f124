"""The policies the episode runner plays with (:class:`~cast_rl.rollout.episode.Policy`).

:class:`ModelPolicy` is a model behind an inference engine: the conversation's token ids (the
chat template's rendering, kept by :class:`~cast_rl.rollout.tokens.ConversationTokens`) are its
prompt, and its sampled ids and logprobs are the turn.  :class:`ScriptedPolicy` is the base of the
policies that decide from the episode's messages (the gold-plan expert, the noisy teacher, a
fixed script): they write a turn's text with real identifiers, and the one path
:meth:`~cast_rl.rollout.tokens.ConversationTokens.encode_turn` writes it as the policy would
(aliases, canonical ids, end-of-turn token, zero logprobs).
"""

from __future__ import annotations

import copy
import json
from typing import Any

from cast_rl.envs.types import RESPOND, Action
from cast_rl.inference.base import Completion, InferenceEngine, Sampling
from cast_rl.rollout.episode import EpisodeState, Policy


def tool_call_text(name: str, arguments: dict[str, Any]) -> str:
    """A tool call exactly as the chat template renders it."""
    payload = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"<tool_call>\n{payload}\n</tool_call>"


def action_text(action: Action) -> str:
    """``action`` written as a policy turn (real identifiers): the reply, or the tool call."""
    return str(action.kwargs.get("content", "")) if action.name == RESPOND else tool_call_text(action.name, action.kwargs)


class ModelPolicy(Policy):
    """A model served by an inference engine: it generates from the conversation's token ids."""

    def __init__(self, engine: InferenceEngine) -> None:
        self.engine = engine
        self.tokenizer = getattr(engine, "tokenizer", None)

    async def act(self, state: EpisodeState, sampling: Sampling) -> Completion:
        return await self.engine.generate(state.conv.token_ids, sampling)


class ScriptedPolicy(Policy):
    """A policy that decides from the episode's messages (real identifiers) and writes text.

    Subclasses implement :meth:`decide`; the turn's tokens come from
    :meth:`~cast_rl.rollout.tokens.ConversationTokens.encode_turn`.  A scripted policy plays the
    episode it was made for (:meth:`for_episode` is itself), keeps its progress per branch
    (:meth:`fork` copies it) and is bound by the run's limits.
    """

    tokenizer: Any

    def decide(self, messages: list[dict[str, Any]]) -> str:
        """The next turn's text, given the episode's messages so far."""
        raise NotImplementedError

    async def act(self, state: EpisodeState, sampling: Sampling) -> Completion:
        return state.conv.encode_turn(self.decide(state.messages))

    def fork(self) -> Policy:
        return copy.copy(self)

    async def close(self) -> None:
        return None


def assistant_text(message: dict[str, Any]) -> str:
    """An assistant message's text as the chat template writes it between the turn's header and
    its end: the thought, the content, then each tool call."""
    text = f"<think>\n{message['reasoning_content']}\n</think>\n\n" if message.get("reasoning_content") else ""
    content = message.get("content") or ""
    text += content
    for i, call in enumerate(message.get("tool_calls") or []):
        fn = call.get("function", call)
        arguments = fn["arguments"] if isinstance(fn["arguments"], str) else json.dumps(fn["arguments"], ensure_ascii=False)
        text += ("\n" if (i == 0 and content) or i else "") + f'<tool_call>\n{{"name": "{fn["name"]}", "arguments": {arguments}}}\n</tool_call>'
    return text


def chat_turns(messages: list[dict[str, Any]]) -> list[tuple[str, str, list[str]]]:
    """``(role, text, tool results)`` of each turn the chat template writes for ``messages``:
    tool messages in a row are one ``user`` turn of ``<tool_response>`` blocks (their results
    listed), an assistant turn's text is :func:`assistant_text`."""
    turns: list[tuple[str, str, list[str]]] = []
    for i, m in enumerate(messages):
        role = m["role"]
        if role == "tool":
            if i and messages[i - 1]["role"] == "tool":
                continue  # written in the turn of the first tool message of the run
            results = []
            for later in messages[i:]:
                if later["role"] != "tool":
                    break
                results.append(str(later.get("content") or ""))
            turns.append(("user", "\n".join(f"<tool_response>\n{r}\n</tool_response>" for r in results), results))
        elif role == "assistant":
            turns.append((role, assistant_text(m), []))
        else:
            turns.append((role, str(m.get("content") or ""), []))
    return turns
