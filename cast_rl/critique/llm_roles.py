"""The six roles of the LLM verification framework: prompts, JSON schemas, decoded answers.

Each role is a system prompt, a JSON schema its answer is decoded under (vLLM's structured outputs:
the answer always parses, and choices are enums where the choice must be exact), and a small
dataclass the answer is read into.  :mod:`cast_rl.critique.llm_verifier` runs them.

==================  =================  ========================================================
role                runs               answers
==================  =================  ========================================================
rule_extractor      per trajectory     the policy lines that bear on the request (verbatim: an
                                       enum of the policy's own lines)
tool_extractor      per trajectory     per tool the trajectory calls: read, write or transfer,
                                       and what it requires
hallucination       per action         values of the action that appear nowhere visible
domain_violation    per action         the extracted rule the action breaks, if any
tool_call           per tool call      whether it is the wrong tool, record or arguments
final_verdict       per action         the label (valid or an error type), evidence, the policy
                                       clause, an explanation and a fix for the critic
==================  =================  ========================================================

The checkers read privileged information (the gold actions, the outcome, the final-state
difference, the call's result); the final verdict reads the checkers' answers and the visible
conversation only, and writes what the critic is trained on.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

LABELS = ("valid", "hallucination", "policy_violation", "wrong_tool_usage")
"""What the final verdict answers: valid, or the error type of an invalid action."""

RULE_EXTRACTOR = """You read the policy of a {domain} customer-service agent and the customer's \
first message. Pick the policy lines an agent must follow to handle this request (at most {n}).
Answer in JSON."""

TOOL_EXTRACTOR = """You read the tool definitions of a {domain} customer-service agent. For each \
tool, say whether it reads data, writes (changes the database) or transfers the customer to a \
human, and what it requires before it is called (one short phrase). Answer in JSON."""

HALLUCINATION = """You check one action of a {domain} customer-service agent for hallucination: \
an id, name, amount, date or address in the action that appears nowhere in the conversation \
before it (the user's messages and the tool outputs). List such values; an empty list means \
none. The reference section shows what the task really needed; use it to judge, never quote it. \
Answer in JSON."""

DOMAIN_VIOLATION = """You check one action of a {domain} customer-service agent against the \
policy rules listed. Say which rule the action breaks given what the agent could see, or none. \
The reference section shows what the task really needed; use it to judge, never quote it. \
Answer in JSON."""

TOOL_CALL = """You check one tool call of a {domain} customer-service agent: is it the wrong \
tool, the wrong record or wrong arguments for what the user asked, or a call the tools reject? \
The reference section shows the gold actions and what the call did; a call equal to a gold \
action is right. Answer in JSON."""

FINAL_VERDICT = """You write the final verdict on one action of a {domain} customer-service \
agent, from the checkers' findings. Label it valid, or with the first error that applies in the \
order hallucination, policy_violation, wrong_tool_usage. Then explain it for the agent: cite \
only what the agent could see (a short verbatim quote of an earlier message, by its index), \
never a value the conversation does not show, and suggest a fix. Answer in JSON."""


def _string(max_length: int) -> dict[str, Any]:
    return {"type": "string", "maxLength": max_length}


def _object(properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(properties),
            "additionalProperties": False}


def rule_schema(lines: list[str], n: int) -> dict[str, Any]:
    return _object({"rules": {"type": "array", "items": {"type": "string", "enum": lines}, "maxItems": n}})


def tool_schema(names: list[str]) -> dict[str, Any]:
    note = _object({"name": {"type": "string", "enum": names},
                    "kind": {"type": "string", "enum": ["read", "write", "transfer"]},
                    "requires": _string(80)})
    return _object({"tools": {"type": "array", "items": note, "maxItems": len(names)}})


HALLUCINATION_SCHEMA = _object({
    "ungrounded": {"type": "array", "items": _string(60), "maxItems": 3},
    "hallucination": {"type": "boolean"},
})


def violation_schema(rules: list[str]) -> dict[str, Any]:
    return _object({"rule": {"type": "string", "enum": ["none", *rules]}, "violation": {"type": "boolean"}})


TOOL_CALL_SCHEMA = _object({"problem": _string(120), "wrong_tool_usage": {"type": "boolean"}})


def verdict_schema(labels: tuple[str, ...], clauses: list[str], max_index: int) -> dict[str, Any]:
    """The final verdict's schema; ``labels`` narrows the choice (the hybrid backend's explainer
    is given the rules' label), ``clauses`` are the policy lines it may cite."""
    evidence = _object({"message": {"type": "integer", "minimum": 0, "maximum": max(max_index, 0)},
                        "quote": _string(100)})
    return _object({
        "label": {"type": "string", "enum": list(labels)},
        "evidence": {"type": "array", "items": evidence, "maxItems": 1},
        "clause": {"type": "string", "enum": ["none", *clauses]},
        "explanation": _string(240),
        "fix": _string(160),
    })


@dataclass
class ToolNote:
    name: str
    kind: str
    requires: str


@dataclass
class ToolsAnswer:
    tools: list[ToolNote] = field(default_factory=list)


@dataclass
class RulesAnswer:
    rules: list[str] = field(default_factory=list)


@dataclass
class HallucinationAnswer:
    ungrounded: list[str]
    hallucination: bool

    @property
    def error(self) -> bool:
        return self.hallucination


@dataclass
class ViolationAnswer:
    rule: str
    violation: bool

    @property
    def error(self) -> bool:
        return self.violation


@dataclass
class ToolCallAnswer:
    problem: str
    wrong_tool_usage: bool

    @property
    def error(self) -> bool:
        return self.wrong_tool_usage


@dataclass
class VerdictAnswer:
    label: str
    evidence: list[tuple[int, str]]
    clause: str
    explanation: str
    fix: str


def decode(role: str, text: str) -> Any:
    """The answer of ``role`` read from its JSON text; None when it does not parse or does not
    have the schema's shape (structured outputs make that a bug or a truncated answer)."""
    try:
        obj = json.loads(text)
        return _READERS[role](obj)
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def _strs(value: Any) -> list[str]:
    if not isinstance(value, list):
        raise TypeError("not a list")
    return [str(v) for v in value]


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError("not a boolean")
    return value


def _verdict(obj: dict[str, Any]) -> VerdictAnswer:
    if obj["label"] not in LABELS:
        raise ValueError(f"unknown label {obj['label']!r}")
    evidence = [(int(e["message"]), str(e["quote"])) for e in obj["evidence"]]
    clause = str(obj["clause"])
    return VerdictAnswer(obj["label"], evidence, "" if clause == "none" else clause,
                         str(obj["explanation"]), str(obj["fix"]))


_READERS = {
    "rule_extractor": lambda o: RulesAnswer(_strs(o["rules"])),
    "tool_extractor": lambda o: ToolsAnswer([ToolNote(str(t["name"]), str(t["kind"]), str(t["requires"]))
                                             for t in o["tools"]]),
    "hallucination": lambda o: HallucinationAnswer(_strs(o["ungrounded"]), _bool(o["hallucination"])),
    "domain_violation": lambda o: ViolationAnswer(str(o["rule"]), _bool(o["violation"])),
    "tool_call": lambda o: ToolCallAnswer(str(o["problem"]), _bool(o["wrong_tool_usage"])),
    "final_verdict": _verdict,
}
ROLES = tuple(_READERS)
"""The six roles, in the order they run."""
CHECKERS = ("hallucination", "domain_violation", "tool_call")
"""The per-action checkers, in the order of the error types they look for."""
CHECKER_TYPES = dict(zip(CHECKERS, LABELS[1:]))
"""Checker -> the error type it reports."""
