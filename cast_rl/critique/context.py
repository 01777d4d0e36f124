"""What the agent could see before an action: the grounding corpus every critique rests on.

A trajectory is OpenAI-style messages.  Its *actions* are the assistant's tool calls (one action
per call) and its replies to the user (an assistant message with text and no tool calls).  The
*visible context* of an action is the policy, the tool schemas and every system, user and tool
message before it.  The agent's own earlier words are not grounding (a value it made up once does
not become a fact by being repeated), and neither are critic messages (``"name": "critic"``).

:class:`Visible` answers the questions the rules ask: does a value occur anywhere visible, where
(a verbatim quote and its message index, for evidence), which tool calls ran before with which
outputs.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from datetime import date, timedelta
from functools import cached_property
from typing import Any

from cast_rl.models.chat import call_arguments
from cast_rl.records import CRITIC_NAME

RESPOND = "respond"
MALFORMED = "malformed_tool_call"
"""Action name of an assistant turn whose tool call could not be parsed."""
POLICY_INDEX = None
"""``message_index`` of evidence quoted from the policy rather than from a message."""

_NUMBER = re.compile(r"(?<![\w.])-?\d[\d,]*(?:\.\d+)?(?![\w])")
_ISO_DATE = re.compile(r"\b(\d{4})-(\d{2})-(\d{2})\b")
_MONTHS = {
    m: i + 1
    for i, m in enumerate(
        ("january", "february", "march", "april", "may", "june", "july", "august",
         "september", "october", "november", "december")
    )
}
_MONTH_DAY = re.compile(
    r"\b(" + "|".join(list(_MONTHS) + [m[:3] for m in _MONTHS]) + r")\.?\s+(\d{1,2})(?:st|nd|rd|th)?\b"
    r"|\b(\d{1,2})(?:st|nd|rd|th)?\s+(?:of\s+)?(" + "|".join(_MONTHS) + r")\b",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class ActionRef:
    """One assistant action of a trajectory."""

    message_index: int
    call_index: int
    """Position among the message's tool calls; -1 for a reply to the user."""
    name: str
    kwargs: dict[str, Any]
    """Parsed arguments; ``{"content": text}`` for a reply; ``{}`` when they did not parse."""
    call_id: str = ""
    arguments_ok: bool = True
    """False when the raw arguments were not a JSON object."""

    @property
    def is_reply(self) -> bool:
        return self.name == RESPOND

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "kwargs": self.kwargs}


@dataclass(frozen=True)
class ToolRecord:
    """A tool call that happened before the action, with its output (None if none recorded)."""

    message_index: int
    name: str
    kwargs: dict[str, Any]
    output: str | None
    output_index: int | None

    @property
    def ok(self) -> bool:
        """Whether the tool answered without an error."""
        return self.output is not None and not is_error(self.output)


_ERROR = re.compile(
    r"^\s*(Error\b|Unknown action\b|Cannot |Invalid |Please provide)"
    r"|^[^\n]{0,80}\bnot found\.?\s*$"
    r"|^Provider \S+ (does not work on|is not available at|already has an appointment)"
    r"|^Appointment \S+ is already cancelled",
)


def is_error(output: str) -> bool:
    """Whether a tool output reports a failure (the domains word failures differently)."""
    return bool(_ERROR.search(output))


def parse_arguments(raw: Any) -> tuple[dict[str, Any], bool]:
    """Tool-call arguments as a dict and whether they parsed (:func:`~cast_rl.models.chat.call_arguments`)."""
    kwargs = call_arguments(raw)
    return ({}, False) if isinstance(kwargs, str) else (kwargs, True)


def iter_actions(messages: list[dict[str, Any]], malformed: Collection[int] | None = None) -> Iterator[ActionRef]:
    """Every assistant action in order: each tool call, and each text-only message.

    A text-only message the policy meant as a tool call that could not be parsed is the action
    :data:`MALFORMED`.  ``malformed`` gives their message indices where the runner recorded
    them (its turns' parse errors); without it (conversations from elsewhere: gold plans,
    demonstrations, files without turns) a text-only message answered by a tool message is
    taken for one (the rollout records the parse error as the tool output).
    """
    for i, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        calls = message.get("tool_calls") or []
        if not calls:
            if malformed is not None:
                answered = i in malformed
            else:
                answered = i + 1 < len(messages) and messages[i + 1].get("role") == "tool"
            if answered:
                following = messages[i + 1] if i + 1 < len(messages) else {}
                call_id = str(following.get("tool_call_id", ""))
                yield ActionRef(i, 0, MALFORMED, {}, call_id, arguments_ok=False)
            else:
                yield ActionRef(i, -1, RESPOND, {"content": message_text(message)})
            continue
        for j, call in enumerate(calls):
            function = call.get("function") or {}
            kwargs, ok = parse_arguments(function.get("arguments"))
            yield ActionRef(i, j, str(function.get("name", "")), kwargs, str(call.get("id", "")), ok)


def rejected_by_critic(messages: list[dict[str, Any]], index: int) -> bool:
    """Whether the critic answered the assistant message at ``index``: a proposal it sent back,
    which never ran (its revision follows the critic's message)."""
    following = messages[index + 1] if index + 1 < len(messages) else {}
    return following.get("role") == "user" and following.get("name") == CRITIC_NAME


def message_text(message: dict[str, Any]) -> str:
    """A message's text (string content, or the text parts of a list content)."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def is_grounding(message: dict[str, Any]) -> bool:
    """System, user and tool messages ground values; assistant and critic messages do not."""
    role = message.get("role")
    if role == "user":
        return message.get("name") != CRITIC_NAME
    return role in ("system", "tool")


def tool_history(messages: list[dict[str, Any]], end: int) -> list[ToolRecord]:
    """Tool calls in ``messages[:end]`` with the outputs that answered them (matched by id)."""
    actions = [a for a in iter_actions(messages[:end]) if not a.is_reply]
    by_message: dict[int, list[ActionRef]] = {}
    for action in actions:
        by_message.setdefault(action.message_index, []).append(action)
    outputs: dict[tuple[int, int], tuple[int, str]] = {}
    pending: list[ActionRef] = []
    for i, message in enumerate(messages[:end]):
        if message.get("role") == "assistant":
            pending = list(by_message.get(i, []))
        elif message.get("role") == "tool" and pending:
            # match by id, else the calls in order (ids may be missing or reused)
            call_id = str(message.get("tool_call_id", ""))
            match = next((a for a in pending if call_id and a.call_id == call_id), pending[0])
            pending.remove(match)
            outputs[(match.message_index, match.call_index)] = (i, message_text(message))
    records = []
    for action in actions:
        index, output = outputs.get((action.message_index, action.call_index), (None, None))
        records.append(ToolRecord(action.message_index, action.name, action.kwargs, output, index))
    return records


def text_in(text: str, corpus: str, canonical_corpus: Callable[[], str]) -> bool:
    """Whether ``text`` occurs in a lowercased corpus as a whole token sequence.

    ``1234`` does not occur in ``#W51234567`` nor ``ny`` in ``any``; a phone number matches whatever its separators
    (``(555) 234-5678`` and ``555-234-5678``); other values with punctuation or spacing may
    match letters-and-digits only (``W123`` in ``#W123``).
    """
    low = text.lower().strip()
    if not low:
        return True
    if _bounded_find(low, corpus):
        return True
    digits = re.sub(r"\D", "", low)
    if len(digits) >= 7 and re.fullmatch(r"[\d\s()+.\-]+", low):
        pattern = r"\D{0,2}".join(digits)
        return re.search(rf"(?<!\d){pattern}(?!\d)", corpus) is not None
    canon = canonical(low)
    return len(canon) >= 6 and any(c.isalpha() for c in canon) and canon in canonical_corpus()


def _bounded_find(low: str, corpus: str) -> bool:
    """``low`` in ``corpus`` not glued to a letter or digit on the left, nor to a digit on the
    right when it ends in one (a word may go on: "india" in "indian")."""
    check_left, check_right = low[0].isalnum(), low[-1].isdigit()
    start = corpus.find(low)
    while start >= 0:
        end = start + len(low)
        left_ok = not check_left or start == 0 or not corpus[start - 1].isalnum()
        right_ok = not check_right or end == len(corpus) or not corpus[end].isdigit()
        if left_ok and right_ok:
            return True
        start = corpus.find(low, start + 1)
    return False


def canonical(text: str) -> str:
    """Lowercase letters and digits only: ``(555) 234-5678`` and ``555-234-5678`` agree."""
    return re.sub(r"[^0-9a-z]", "", text.lower())


def numbers_in(text: str) -> set[float]:
    out = set()
    for match in _NUMBER.finditer(text):
        try:
            out.add(float(match.group().replace(",", "")))
        except ValueError:
            continue
    return out


def month_days_in(text: str) -> set[tuple[int, int]]:
    """(month, day) of every date written in the text, ISO or in words."""
    out = {(int(m), int(d)) for _, m, d in _ISO_DATE.findall(text)}
    for match in _MONTH_DAY.finditer(text):
        month_word, day, day2, month_word2 = match.groups()
        word = (month_word or month_word2).lower()
        month = _MONTHS.get(word) or next(v for k, v in _MONTHS.items() if k.startswith(word))
        out.add((month, int(day or day2)))
    return out


_SCHEMA_TEXT: dict[int, tuple[list[dict[str, Any]], str]] = {}
"""Serialised tool schemas by list identity (every action of a domain shares one list)."""


@dataclass
class Visible:
    """The visible context of one action (see the module docstring)."""

    policy: str
    messages: list[dict[str, Any]]
    """The trajectory's messages before the action."""
    tools: list[dict[str, Any]] = field(default_factory=list)

    @cached_property
    def sources(self) -> list[tuple[int | None, str]]:
        """(message index or None for the policy, text) of everything that grounds values."""
        out: list[tuple[int | None, str]] = [(POLICY_INDEX, self.policy)]
        out += [(i, message_text(m)) for i, m in enumerate(self.messages) if is_grounding(m)]
        return out

    @cached_property
    def schema_text(self) -> str:
        key = id(self.tools)
        cached = _SCHEMA_TEXT.get(key)
        if cached is None or cached[0] is not self.tools:
            cached = (self.tools, json.dumps(self.tools, ensure_ascii=False))
            _SCHEMA_TEXT[key] = cached
        return cached[1]

    @cached_property
    def corpus(self) -> str:
        return "\n".join([text for _, text in self.sources] + [self.schema_text]).lower()

    @cached_property
    def canonical_corpus(self) -> str:
        return canonical(self.corpus)

    @cached_property
    def numbers(self) -> set[float]:
        return numbers_in(self.corpus)

    @cached_property
    def month_days(self) -> set[tuple[int, int]]:
        return month_days_in(self.corpus)

    @cached_property
    def history(self) -> list[ToolRecord]:
        return tool_history(self.messages, len(self.messages))

    @cached_property
    def user_texts(self) -> list[tuple[int, str]]:
        return [
            (i, message_text(m))
            for i, m in enumerate(self.messages)
            if m.get("role") == "user" and m.get("name") != CRITIC_NAME
        ]

    def contains(self, value: Any) -> bool:
        """Whether a string or number occurs in the visible context (forgiving of format)."""
        if isinstance(value, bool) or value is None:
            return True
        if isinstance(value, (int, float)):
            return float(value) in self.numbers or self.contains_text(_number_text(value))
        text = str(value).strip()
        if not text:
            return True
        if self.contains_text(text):
            return True
        if text.startswith("#") and len(text) > 1 and self.contains_text(text[1:]):
            return True  # an order number the user gave without the "#" the tools write
        iso = _ISO_DATE.fullmatch(text)
        if iso:
            try:
                return self.date_visible(date(*map(int, iso.groups())))
            except ValueError:  # not a real date
                return False
        try:
            return float(text) in self.numbers
        except ValueError:
            return False

    def contains_text(self, text: str) -> bool:
        return text_in(text, self.corpus, lambda: self.canonical_corpus)

    def user_stated(self, value: str) -> int | None:
        """Index of the first user message that gives ``value``, in whatever words around it.

        The value itself is matched as :func:`text_in` matches it (any case, not glued to other
        letters or digits, phone numbers whatever their separators), so "user id is X",
        "with ID: X", "my id: X", "I'm X" and the task instruction verbatim all count.
        """
        for index, text in self.user_texts:
            low = text.lower()
            if text_in(value, low, lambda low=low: canonical(low)):
                return index
        return None

    def date_visible(self, day: date) -> bool:
        """A date is grounded by itself, or by the day before or after (a "next day" request)."""
        for delta in (0, -1, 1):
            d = day + timedelta(days=delta)
            if (d.month, d.day) in self.month_days:
                return True
        return False

    def find(self, value: Any, latest: bool = True) -> tuple[int | None, str] | None:
        """(message index, verbatim quote) of an occurrence of ``value``, latest first."""
        text = _number_text(value) if isinstance(value, (int, float)) else str(value)
        if not text.strip():
            return None
        pattern = re.compile(re.escape(text), re.IGNORECASE)
        order = reversed(self.sources) if latest else iter(self.sources)
        for index, source in order:
            match = pattern.search(source)
            if match:
                return index, match.group()
        return None

    def quote_line(self, index: int | None, needle: str) -> str | None:
        """The whole line of message ``index`` (or the policy) that contains ``needle``."""
        for i, text in self.sources:
            if i != index:
                continue
            for line in text.splitlines():
                if needle.lower() in line.lower():
                    return line.strip()
        return None

    def calls(self, *names: str, ok: bool | None = None) -> list[ToolRecord]:
        """Earlier tool calls with one of the names (all when none given)."""
        return [
            r
            for r in self.history
            if (not names or r.name in names) and (ok is None or r.ok == ok)
        ]

    def outputs_mentioning(self, value: str, *names: str) -> list[ToolRecord]:
        """Successful earlier calls (of the named tools) whose output contains ``value``."""
        return [r for r in self.calls(*names, ok=True) if value in (r.output or "")]


def _number_text(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def leaves(value: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted path, leaf) pairs of a JSON value; list positions are dropped from the path."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from leaves(item, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list):
        for item in value:
            yield from leaves(item, path)
    else:
        yield path, value
