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
