"""Structured rationales, the leakage check, and the critic's fixed text format.

A rationale is ``{"verdict", "error_type", "evidence": [{"message_index", "quote"}],
"policy_clause", "explanation", "suggested_fix"}``.  The labeller may *decide* with privileged
information (gold actions, a forked environment), but a rationale may only *say* what the agent
could see.  :func:`leakage_problems` proves it:

* every evidence quote occurs verbatim in a message before the action (``message_index`` below the
  action's) or, with ``message_index`` null, in the policy;
* ``policy_clause`` is empty or occurs verbatim in the policy;
* every id-like token or value in ``explanation`` and ``suggested_fix`` (anything with a digit, an
  underscore or an ``@``, and every quoted string) occurs in the visible context: the policy, the
  tool schemas or the messages before the action.  Not the candidate action: a made-up value is
  described ("an order id that appears nowhere"), never repeated.

The text format (what the critic model is trained to write and what the policy is shown)::

    VERDICT: invalid
    ERROR: policy_violation
    CLAUSE: <policy sentence, or none>
    EVIDENCE: 7 "<quote as a JSON string>"      (one line per quote; "policy" for the policy)
    EXPLANATION: <one paragraph>
    FIX: <one paragraph>
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from cast_rl.critique.context import (
    ActionRef,
    Visible,
    canonical,
    message_text,
    numbers_in,
    text_in,
)

ERROR_TYPES = ("none", "hallucination", "policy_violation", "wrong_tool_usage")
"""Error types, ``none`` first, then in reporting priority."""
PRIORITY = {name: i for i, name in enumerate(ERROR_TYPES[1:])}

_VALUE_TOKEN = re.compile(r"[\w#@.\-/:$+]+")
_QUOTED = re.compile(r"(?<!\w)'([^'\n]{2,}?)'(?!\w)|(?<!\w)\"([^\"\n]{2,}?)\"(?!\w)")


@dataclass
class Evidence:
    message_index: int | None
    """Index of the quoted message; None quotes the policy."""
    quote: str

    def to_json(self) -> dict[str, Any]:
        return {"message_index": self.message_index, "quote": self.quote}


@dataclass
class Rationale:
    verdict: str
    error_type: str
    evidence: list[Evidence] = field(default_factory=list)
    policy_clause: str = ""
    explanation: str = ""
    suggested_fix: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "error_type": self.error_type,
            "evidence": [e.to_json() for e in self.evidence],
            "policy_clause": self.policy_clause,
            "explanation": self.explanation,
            "suggested_fix": self.suggested_fix,
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Rationale:
        return cls(
            verdict=str(obj["verdict"]),
            error_type=str(obj["error_type"]),
            evidence=[Evidence(e.get("message_index"), str(e["quote"])) for e in obj.get("evidence", [])],
            policy_clause=str(obj.get("policy_clause") or ""),
            explanation=str(obj.get("explanation") or ""),
            suggested_fix=str(obj.get("suggested_fix") or ""),
        )


def value_tokens(text: str) -> list[str]:
    """The id-like tokens and quoted values a text names (what must have been visible)."""
    out = []
    for match in _VALUE_TOKEN.finditer(text):
        token = match.group().strip(".,;:)(!?'\"")
        if token and any(ch.isdigit() or ch in "_@" for ch in token):
            out.append(token)
    out += [a or b for a, b in _QUOTED.findall(text)]
    return out


def _visible_text(visible: Visible, action: ActionRef) -> tuple[str, set[float]]:
    parts = [visible.policy, visible.schema_text]
    for message in visible.messages:
        parts.append(message_text(message))
        for call in message.get("tool_calls") or []:
            parts.append(json.dumps(call.get("function") or {}, ensure_ascii=False))
    text = "\n".join(parts).lower()
    return text, numbers_in(text)


def leakage_problems(rationale: Rationale, visible: Visible, action: ActionRef) -> list[str]:
    """Why the rationale says more than the agent could see (empty when it passes)."""
    problems = []
    for ev in rationale.evidence:
        if ev.message_index is None:
            if ev.quote not in visible.policy:
                problems.append(f"evidence quote not in the policy: {ev.quote!r}")
            continue
        if not isinstance(ev.message_index, int) or not 0 <= ev.message_index < action.message_index:
            problems.append(f"evidence message_index {ev.message_index} is not before the action")
            continue
        if ev.quote not in message_text(visible.messages[ev.message_index]):
            problems.append(f"evidence quote not in message {ev.message_index}: {ev.quote!r}")
    if rationale.policy_clause and rationale.policy_clause not in visible.policy:
        problems.append(f"policy clause not in the policy: {rationale.policy_clause!r}")
    full: tuple[str, str, set[float]] | None = None
    for field_name in ("explanation", "suggested_fix"):
        for token in value_tokens(getattr(rationale, field_name)):
            low = token.lower()
            if text_in(low, visible.corpus, lambda: visible.canonical_corpus):
                continue  # the common case, without building the full visible text
            if full is None:
                text, numbers = _visible_text(visible, action)
                full = (text, canonical(text), numbers)
            text, canon, numbers = full
            if text_in(low, text, lambda canon=canon: canon):
                continue
            try:
                if float(low.lstrip("$").replace(",", "")) in numbers:
                    continue
            except ValueError:
                pass
            problems.append(f"{field_name} names {token!r}, which was not visible")
    return problems


def format_critique(rationale: Rationale) -> str:
    """The fixed text format (module docstring); begins with the verdict and the error type."""
    lines = [f"VERDICT: {rationale.verdict}", f"ERROR: {rationale.error_type}"]
    lines.append(f"CLAUSE: {_one_line(rationale.policy_clause) or 'none'}")
    for ev in rationale.evidence:
        where = "policy" if ev.message_index is None else str(ev.message_index)
        lines.append(f"EVIDENCE: {where} {json.dumps(ev.quote, ensure_ascii=False)}")
    lines.append(f"EXPLANATION: {_one_line(rationale.explanation)}")
    if rationale.suggested_fix:
        lines.append(f"FIX: {_one_line(rationale.suggested_fix)}")
    return "\n".join(lines)


CRITIQUE_REGEX = (
    r"VERDICT: (valid\nERROR: none|invalid\nERROR: (hallucination|policy_violation|wrong_tool_usage))"
    r"(\nCLAUSE: [^\n]*)?(\nEVIDENCE: (policy|[0-9]+) [^\n]*)*(\nEXPLANATION: [^\n]*)?(\nFIX: [^\n]*)?"
)
"""The fixed format as a regular expression, for structured decoding of a critic model's answer
(``critic.structured``): the verdict and an error type that agrees with it come first, then the
optional fields in order, each on one line, so every answer :func:`parse_critique` reads."""

_VERDICT_LINES = re.compile(r"VERDICT: [^\n]*\nERROR: [^\n]*")


def verdict_length(text: str) -> int:
    """Characters of the VERDICT and ERROR lines a critique in the fixed format begins with: its
    verdict, which critic training may weigh apart from the explanation (``pipeline.critic_loss``)."""
    match = _VERDICT_LINES.match(text)
    if match is None:
        raise ValueError(f"a critique must begin with its VERDICT and ERROR lines, got {text[:60]!r}")
    return match.end()


def _one_line(text: str) -> str:
    return " ".join(text.split())


_LINE = re.compile(r"^\s*(VERDICT|ERROR|CLAUSE|EVIDENCE|EXPLANATION|FIX)\s*:\s*(.*)$", re.IGNORECASE)
_EVIDENCE = re.compile(r"^(policy|\d+)\s+(\".*\")\s*$", re.IGNORECASE)


def parse_critique(text: str) -> Rationale | None:
    """The rationale a critic wrote in the fixed format, or None when it cannot be read.

    Readable means: a VERDICT line of valid/invalid, an ERROR line naming a known type that agrees
    with the verdict (none exactly when valid).  Malformed evidence lines are dropped.
    """
    fields: dict[str, str] = {}
    evidence: list[Evidence] = []
    for line in text.strip().splitlines():
        match = _LINE.match(line)
        if not match:
            continue
        key, value = match.group(1).upper(), match.group(2).strip()
        if key == "EVIDENCE":
            ev = _EVIDENCE.match(value)
            if ev:
                try:
                    quote = json.loads(ev.group(2))
                except ValueError:
                    continue
                where = ev.group(1).lower()
                evidence.append(Evidence(None if where == "policy" else int(where), str(quote)))
        else:
            fields.setdefault(key, value)
    verdict = fields.get("VERDICT", "").lower().strip(". ")
    error_type = fields.get("ERROR", "").lower().strip(". ")
    if verdict not in ("valid", "invalid") or error_type not in ERROR_TYPES:
        return None
    if (verdict == "valid") != (error_type == "none"):
        return None
    clause = fields.get("CLAUSE", "")
    return Rationale(
        verdict=verdict,
        error_type=error_type,
        evidence=evidence,
        policy_clause="" if clause.lower() == "none" else clause,
        explanation=fields.get("EXPLANATION", ""),
        suggested_fix=fields.get("FIX", ""),
    )


def unparsable(text: str) -> dict[str, Any]:
    """The rationale recorded for a critic answer that could not be read."""
    return {
        "verdict": "unparsable",
        "error_type": "unknown",
        "evidence": [],
        "policy_clause": "",
        "explanation": "the critic's answer did not follow the critique format",
        "suggested_fix": "",
        "raw": text,
    }
