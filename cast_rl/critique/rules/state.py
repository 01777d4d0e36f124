"""Reading the visible state out of earlier tool outputs (JSON records and text reports)."""

from __future__ import annotations

import json
import re
from typing import Any

from cast_rl.critique.context import ToolRecord, Visible
from cast_rl.critique.rationale import Evidence


def parse_json(output: str | None) -> Any:
    if not output:
        return None
    try:
        return json.loads(output)
    except ValueError:
        return None


def latest_record(
    visible: Visible, key: str, value: Any, tools: tuple[str, ...] = ()
) -> tuple[dict[str, Any], ToolRecord] | None:
    """The latest JSON object output (of the named tools) whose ``key`` equals ``value``.

    Also finds the object one level down (``{"billing": {...}}``) and in a JSON list.
    """
    for record in reversed(visible.calls(*tools, ok=True)):
        for obj in _objects(parse_json(record.output)):
            if obj.get(key) == value:
                return obj, record
    return None


def _objects(parsed: Any) -> list[dict[str, Any]]:
    if isinstance(parsed, dict):
        return [parsed] + [v for v in parsed.values() if isinstance(v, dict)]
    if isinstance(parsed, list):
        return [v for v in parsed if isinstance(v, dict)]
    return []


def field_evidence(record: ToolRecord, key: str, value: Any) -> list[Evidence]:
    """A verbatim quote of ``"key": value`` (or just the value) from a tool output."""
    output = record.output or ""
    for quote in (f'"{key}": {json.dumps(value)}', str(value)):
        if quote and quote in output:
            return [Evidence(record.output_index, quote)]
    return []


def line_evidence(record: ToolRecord, needle: str) -> list[Evidence]:
    """The whole line of a tool output that contains ``needle``."""
    for line in (record.output or "").splitlines():
        if needle.lower() in line.lower():
            return [Evidence(record.output_index, line.strip())]
    return []


def latest_text(visible: Visible, tools: tuple[str, ...], needle: str) -> ToolRecord | None:
    """The latest successful output of the named tools that mentions ``needle``."""
    for record in reversed(visible.calls(*tools, ok=True)):
        if needle in (record.output or ""):
            return record
    return None


def text_field(output: str, label: str) -> str | None:
    """``value`` of a ``label: value`` line of a text report."""
    match = re.search(rf"^\W*{re.escape(label)}:\s*(.+)$", output, re.M | re.I)
    return match.group(1).strip() if match else None


def user_said(visible: Visible, pattern: str) -> tuple[int, str] | None:
    """(message index, matched text) of the latest user message matching ``pattern``."""
    rx = re.compile(pattern, re.I)
    for index, text in reversed(visible.user_texts):
        match = rx.search(text)
        if match:
            return index, match.group()
    return None
