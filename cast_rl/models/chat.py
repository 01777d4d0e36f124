"""Chat formatting and parsing of assistant turns in the Hermes/Qwen3 ``<tool_call>`` form.

``render`` goes through the tokenizer's own chat template (``tools=`` included), so real models
and the tiny models format identically.  ``parse_assistant`` turns generated text back into an
OpenAI-style assistant message; anything malformed is reported in ``errors`` (the agent layer
turns those into error observations the policy can learn from), never raised.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_OPEN = "<tool_call>"
_CLOSE = "</tool_call>"
_THOUGHT_RE = re.compile(r"\A\s*<think>(.*?)</think>\s*", re.DOTALL)


def template_kwargs(thinking: str) -> dict[str, Any]:
    """The chat-template options of ``inference.thinking`` (Qwen3's ``enable_thinking``; templates
    that do not read it ignore it), passed wherever a prompt is rendered: rollouts, engines' chat."""
    return {"enable_thinking": thinking != "off"}


def split_thought(text: str) -> tuple[str, str]:
    """``(thought, answer)`` of a generated turn: ``thought`` is the leading ``<think>...</think>``
    block exactly as written (with the whitespace after it), ``""`` when the turn opens with none;
    ``thought + answer == text``."""
    match = _THOUGHT_RE.match(text)
    return (match.group(0), text[match.end():]) if match else ("", text)


def thought_body(thought: str) -> str:
    """The text inside a :func:`split_thought` block (a message's ``reasoning_content``)."""
    match = _THOUGHT_RE.match(thought)
    return match.group(1).strip("\n") if match else ""


@dataclass
class ParsedTurn:
    """An assistant turn: free text, well-formed tool calls, and what could not be parsed."""

    content: str
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    """``{"name": str, "arguments": dict}`` in the order written."""
    errors: list[str] = field(default_factory=list)


def render(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    add_generation_prompt: bool = False,
    thinking: str = "off",
) -> str:
    """The conversation as text through the model's chat template (``inference.thinking``)."""
    return tokenizer.apply_chat_template(
        messages, tools=tools or None, tokenize=False, add_generation_prompt=add_generation_prompt,
        **template_kwargs(thinking),
    )


RETEMPLATE_HINT = "cast-rl model retemplate SRC DST"
"""The command that writes a model directory with cast_rl's chat template (weights linked)."""


def check_appends_only(tokenizer: Any, thinking: str = "off", name: str = "the model") -> None:
    """Raise ``ValueError`` unless the chat template renders a growing conversation by appending.

    Multi-turn rollouts keep exact token ids by appending, turn after turn, the difference between
    two renderings (:mod:`cast_rl.rollout.tokens`), so every rendering must extend the previous one.
    Some checkpoints' own templates rewrite earlier turns: Qwen3's drops the ``<think>`` block of
    every assistant turn before the latest user message (and its empty block with thinking off),
    so the ids a policy was sampled with would no longer be the ids it trains on.  The probe is a
    short tool-calling conversation, with a thought in the assistant turn when thinking is on.
    """
    thought = "<think>\nchecking the order\n</think>\n\n" if thinking != "off" else ""
    call = {"name": "get_order_details", "arguments": {"order_id": "#W1"}}
    turns = [
        {"role": "system", "content": "You are a customer service agent."},
        {"role": "user", "content": "Where is my order #W1?"},
        {"role": "assistant", "content": thought + "<tool_call>\n" + json.dumps(call) + "\n</tool_call>"},
        {"role": "tool", "content": '{"status": "pending"}'},
        {"role": "assistant", "content": thought + "It is pending."},
        {"role": "user", "content": "Thanks."},
    ]
    tools = [{"type": "function", "function": {"name": "get_order_details", "description": "An order.",
                                               "parameters": {"type": "object", "properties": {}}}}]
    before = ""
    for n in range(1, len(turns) + 1):
        text = render(tokenizer, turns[:n], tools, thinking=thinking)
        prompted = render(tokenizer, turns[:n], tools, add_generation_prompt=True, thinking=thinking)
        if not text.startswith(before) or not prompted.startswith(text):
            raise ValueError(
                f"the chat template of {name} re-renders earlier turns once a {turns[n - 1]['role']} turn follows "
                f"(inference.thinking={thinking}), so multi-turn token ids cannot stay exact; write a copy whose "
                f"tokenizer has cast_rl's template ({RETEMPLATE_HINT}) and point the config at it")
        before = text


def parse_assistant(text: str) -> ParsedTurn:
    """Split generated text into content and ``<tool_call>`` JSON blocks.

    Linear in the text's length: each block runs from an opening tag to the first closing tag
    after it (what :data:`TOOL_CALL_RE` matches); a scan by ``str.find`` stops at the first
    unterminated block, where a regex search would retry from every later opening tag
    (quadratic on a long run of opening tags).
    """
    errors: list[str] = []
    calls: list[dict[str, Any]] = []
    kept: list[str] = []  # the text outside the blocks
    pos = 0
    while True:
        start = text.find(_OPEN, pos)
        end = text.find(_CLOSE, start + len(_OPEN)) if start >= 0 else -1
        if end < 0:
            break
        kept.append(text[pos:start])
        _parse_call(text[start + len(_OPEN) : end].strip(), calls, errors)
        pos = end + len(_CLOSE)
    kept.append(text[pos:])
    content = "".join(kept)
    if _OPEN in content:
        errors.append("unterminated <tool_call> block")
        content = content[: content.index(_OPEN)]
    return ParsedTurn(content=content.strip(), tool_calls=calls, errors=errors)


def _parse_call(body: str, calls: list[dict[str, Any]], errors: list[str]) -> None:
    """Append the call a block's JSON body holds to ``calls``, or why it is malformed to ``errors``."""
    try:
        obj = json.loads(body)
    except (json.JSONDecodeError, RecursionError) as exc:
        where = f" ({exc.msg} at char {exc.pos})" if isinstance(exc, json.JSONDecodeError) else " (nested too deeply)"
        errors.append(f"tool call is not valid JSON{where}")
        return
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        errors.append('tool call must be a JSON object with a string "name"')
        return
    arguments = call_arguments(obj.get("arguments"))
    if isinstance(arguments, str):
        errors.append(f"{obj['name']!r}: {arguments}")
        return
    calls.append({"name": obj["name"], "arguments": arguments})


def call_arguments(arguments: Any) -> dict[str, Any] | str:
    """A tool call's arguments as a dict, or why they are not one.

    The one parser of tool-call arguments: the policy's ``<tool_call>`` blocks (here), the
    environments' tool calls (:func:`cast_rl.envs.core.parse_tool_call`) and the labeller's
    messages (:func:`cast_rl.critique.context.parse_arguments`) all read them through it.
    ``arguments`` is a parsed object, its JSON text (some models write the arguments as a
    string; so does the OpenAI message format), or None / empty text for no arguments.
    """
    if arguments is None or (isinstance(arguments, str) and not arguments.strip()):
        return {}
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError) as exc:  # RecursionError: nested too deeply
            return f"the tool arguments are not valid JSON: {exc}"
    if not isinstance(arguments, Mapping):
        return f"the tool arguments must be a JSON object, got {type(arguments).__name__}"
    return dict(arguments)
