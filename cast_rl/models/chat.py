"""Chat formatting and parsing of assistant turns in the Hermes/Qwen3 ``<tool_call>`` form.

``render`` goes through the tokenizer's own chat template (``tools=`` included), so real models
and the tiny models format identically.  ``parse_assistant`` turns generated text back into an
OpenAI-style assistant message; anything malformed is reported in ``errors`` (the agent layer
turns those into error observations the policy can learn from), never raised.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_OPEN = "<tool_call>"


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
) -> str:
    """The conversation as text through the model's chat template."""
    return tokenizer.apply_chat_template(
        messages, tools=tools or None, tokenize=False, add_generation_prompt=add_generation_prompt
    )


def parse_assistant(text: str) -> ParsedTurn:
    """Split generated text into content and ``<tool_call>`` JSON blocks."""
    errors: list[str] = []
    calls: list[dict[str, Any]] = []
    for match in TOOL_CALL_RE.finditer(text):
        body = match.group(1).strip()
        try:
            obj = json.loads(body)
        except json.JSONDecodeError as exc:
            errors.append(f"tool call is not valid JSON ({exc.msg} at char {exc.pos})")
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            errors.append('tool call must be a JSON object with a string "name"')
            continue
        arguments = obj.get("arguments", {})
        if isinstance(arguments, str):  # some models emit the arguments JSON as a string
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                errors.append(f"arguments of {obj['name']!r} are not a JSON object")
                continue
        if not isinstance(arguments, dict):
            errors.append(f"arguments of {obj['name']!r} must be a JSON object")
            continue
        calls.append({"name": obj["name"], "arguments": arguments})
    content = TOOL_CALL_RE.sub("", text)
    if _OPEN in content:
        errors.append("unterminated <tool_call> block")
        content = content[: content.index(_OPEN)]
    return ParsedTurn(content=content.strip(), tool_calls=calls, errors=errors)
