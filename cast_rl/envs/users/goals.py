"""What a scripted customer knows and wants, for every domain: identity, requests and effects.

The customer's requests are the task's gold *write* actions, in gold order; what the customer
says about them is written in a customer's terms (its own details, the values it wants), and
:func:`gold_effects` works out what each request does to the database by replaying the gold
actions on a private fork at reset: the records a write changes and their values after it.  A
request is *observable* when its write changed something (the customer sees the change, as a real
customer sees a confirmation e-mail); a gold write that fails in the source (retail test task 64,
an exchange of an order that is not delivered) changes nothing and is *vacuous*: the customer asks
for it but cannot wait to see it happen.

Identity comes from the customer's own record (``users``, ``customers`` or ``patients``, keyed by
the task's ``user_id``) and is revealed only as far as the instruction states it: the name always,
and the id, e-mail, phone, zip code or date of birth only when the instruction mentions them.
Retail keeps its own request wording (:mod:`cast_rl.envs.users.scripted`); the other domains use
:func:`generic_request`.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cast_rl.envs.db import _MISSING, Database, to_hashable
from cast_rl.envs.domain import get_domain
from cast_rl.envs.types import RESPOND, Task

PROFILE_TABLES = {"retail": "users", "airline": "users", "telecom": "customers", "telehealth": "patients"}
"""The table holding each domain's customer records."""
_OWN_ID_KEYS = ("user_id", "customer_id", "patient_id")


def domain_of(db: Mapping[str, Any]) -> str:
    """The domain a database belongs to, told apart by its tables."""
    if "orders" in db and "users" in db:
        return "retail"
    if "flights" in db:
        return "airline"
    if "customers" in db:
        return "telecom"
    if "patients" in db:
        return "telehealth"
    raise ValueError(f"no domain has the tables {sorted(db)}; expected retail, airline, telecom or telehealth data")


@dataclass
class Request:
    """One gold write seen from the customer's side."""

    name: str
    kwargs: dict[str, Any]
    ask: str = ""
    """How the customer asks for it."""
    details: str = ""
    """The request restated with every detail (the answer to a wrong proposal)."""
    facts: list[tuple[str, ...]] = field(default_factory=list)
    """Details a proposal must name: each entry is satisfied by any one of its spellings."""
    answers: dict[str, str] = field(default_factory=dict)
    """Keyword of an agent question -> the customer's answer (generic domains)."""
    effect: dict[tuple[str, str], Any] | None = None
    """(table, key) -> the record after the gold write; empty: vacuous."""
    done: bool = False
    """Once seen done it stays done (a later write may touch the same record)."""


def _humanize(key: str) -> str:
    return key.replace("_", " ")


def _leaves(value: Any) -> list[str]:
    """The scalar values inside a tool argument, as text (booleans and None left out)."""
    if isinstance(value, Mapping):
        return [leaf for v in value.values() for leaf in _leaves(v)]
    if isinstance(value, (list, tuple)):
        return [leaf for v in value for leaf in _leaves(v)]
    if isinstance(value, bool) or value is None:
        return []
    if isinstance(value, (int, float)):
        return [json.dumps(value)]
    return [str(value)] if str(value).strip() else []


def _render(value: Any) -> str:
    if isinstance(value, Mapping):
        return ", ".join(f"{_humanize(k)} {_render(v)}" for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return "; ".join(_render(v) for v in value)
    return str(value)


def generic_request(name: str, kwargs: dict[str, Any], own_id: str) -> Request:
    """A non-retail write in the customer's words: the action and every value it wants."""
    wanted = {k: v for k, v in kwargs.items() if not (k in _OWN_ID_KEYS and v == own_id)}
    listed = "; ".join(f"{_humanize(k)}: {_render(v)}" for k, v in wanted.items())
    ask = f"I'd like to {_humanize(name)}" + (f" with {listed}." if listed else ".")
    answers = {_humanize(k): f"The {_humanize(k)} is {_render(v)}." for k, v in wanted.items()}
    facts = [(leaf,) for leaf in _leaves(wanted)]
    return Request(name, dict(kwargs), ask=ask, details=ask, facts=facts, answers=answers)


def _invoke(tool: Any, db: Database, kwargs: Mapping[str, Any]) -> None:
    with contextlib.suppress(Exception):  # a failing gold action fails the same way in the source
        tool.invoke(data=db, **kwargs)


def _diff(before: Database, after: Database) -> dict[tuple[str, str], Any]:
    """(table, key) -> value in ``after`` for every record that differs (lists: key ``""``)."""
    changed: dict[tuple[str, str], Any] = {}
    for name in after:
        old_table, new_table = before[name], after[name]
        if hasattr(new_table, "touched_keys"):
            for key in new_table.touched_keys() | old_table.touched_keys():
                old, new = old_table.get(key, _MISSING), new_table.get(key, _MISSING)
                if old is not new and (
                    old is _MISSING or new is _MISSING or str(to_hashable(old)) != str(to_hashable(new))
                ):
                    changed[(name, key)] = new
        elif old_table is not new_table and str(to_hashable(old_table)) != str(to_hashable(new_table)):
            changed[(name, "")] = new_table
    return changed


def gold_effects(domain: str, db: Database, task: Task) -> list[dict[tuple[str, str], Any]]:
    """For each gold write (in order): the records it changes and their values after it.

    The gold actions (terminate tools and ``respond`` skipped, as in the reward's gold replay)
    run on a private fork of ``db``; reads run too, since a few tools' effects depend on order.
    """
    spec = get_domain(domain)
    tools = spec.tool_map
    state = db.fork()
    effects = []
    for action in task.actions:
        if action.name == RESPOND or action.name in spec.terminate_tools or action.name not in tools:
            continue
        if action.name not in spec.write_tools:
            _invoke(tools[action.name], state, action.kwargs)
            continue
        before = state.fork()
        _invoke(tools[action.name], state, action.kwargs)
        effects.append(_diff(before, state))
    return effects


def effect_seen(db: Mapping[str, Any], effect: Mapping[tuple[str, str], Any]) -> bool:
    """Whether every record of ``effect`` holds its expected value in ``db``."""
    for (table, key), expected in effect.items():
        current = db[table] if key == "" else db[table].get(key, _MISSING)
        if current is _MISSING or str(to_hashable(current)) != str(to_hashable(expected)):
            return False
    return True


def identity_line(domain: str, db: Mapping[str, Any], task: Task) -> tuple[str, str, str]:
    """(full name, the customer's identity answer, its e-mail answer or '') from its record."""
    record = db[PROFILE_TABLES[domain]].get(task.user_id) or {}
    name = record.get("name", {})
    full = f"{name.get('first_name', '')} {name.get('last_name', '')}".strip()
    demo = {**record, **record.get("demographics", {})}
    text = task.instruction
    parts = [f"My name is {full}"] if full else []
    if task.user_id in text:
        parts.append(f"my {'user' if domain in ('retail', 'airline') else 'customer' if domain == 'telecom' else 'patient'} id is {task.user_id}")
    email = str(demo.get("email", ""))
    if email and email.lower() in text.lower():
        parts.append(f"my email is {email}")
    phone = str(demo.get("phone", ""))
    if phone and re.sub(r"\D", "", phone)[-4:] in re.sub(r"\D", "", text):
        parts.append(f"my phone number is {phone}")
    dob = str(demo.get("date_of_birth", demo.get("dob", "")))
    if dob and (dob in text or "born" in text.lower()):
        parts.append(f"my date of birth is {dob}")
    zip_code = str(record.get("address", {}).get("zip", ""))
    if zip_code and zip_code in text:
        parts.append(f"my zip code is {zip_code}")
    if not parts:
        parts = [f"My id is {task.user_id}"]
    answer = ", ".join(parts[:-1]) + (" and " if len(parts) > 1 else "") + parts[-1] + "."
    return full, answer, f"My email is {email}." if email and email.lower() in text.lower() else ""


_QUESTION_CUES = ("know", "find out", "ask", "check", "how much", "how many", "what ", "which ", "whether", "verify")


def information_request(instruction: str) -> str:
    """The customer's question for the task's required outputs, in the first person."""
    sentences = re.split(r"(?<=[.!?])\s+", " ".join(instruction.split()))
    for sentence in sentences:
        lower = sentence.lower()
        if any(cue in lower for cue in _QUESTION_CUES) and not lower.startswith("you are "):
            return _first_person(sentence)
    return "Could you tell me the details I asked about?"


def _first_person(sentence: str) -> str:
    swaps = [(r"\byou are\b", "I am"), (r"\byou were\b", "I was"), (r"\byourself\b", "myself"),
             (r"\byour\b", "my"), (r"\byou\b", "I")]
    out = sentence
    for pattern, repl in swaps:
        out = re.sub(pattern, repl, out, flags=re.IGNORECASE)
    return out[0].upper() + out[1:] if out else out
