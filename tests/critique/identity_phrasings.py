"""User turns that identify the customer, phrased many ways: the same values in other words.

A gold trajectory (:func:`cast_rl.critique.gold.gold_trajectory`) has one turn in which the user
identifies themselves, answering the agent's request, and then the call that identifies them.
:func:`phrased_gold` builds it for each way the domain's policy accepts (email, name and zip
code, phone, name and date of birth, a user or customer id:
:func:`~cast_rl.critique.gold_domains.identities`) with the turn said in one of
:data:`PHRASINGS`.  The values the call uses stay exactly the same, so a labeller whose
judgement rests on the values, not on the words around them, labels every variant alike.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Callable
from datetime import date

from cast_rl.critique.gold import gold_trajectory
from cast_rl.critique.gold_domains import identities
from cast_rl.envs.core import DomainData
from cast_rl.records import Trajectory

Values = dict[str, str]
"""The identifying call's arguments (``email``, ``user_id``, ``first_name`` + ``zip``, ...)."""


def _name(v: Values) -> str:
    return f"{v['first_name']} {v['last_name']}"


def _dob_words(iso: str) -> str:
    d = date.fromisoformat(iso)
    return f"{d.strftime('%B')} {d.day}, {d.year}"


def _dob_day_first(iso: str) -> str:
    d = date.fromisoformat(iso)
    return f"{d.day} {d.strftime('%B')} {d.year}"


def _phone_dots(phone: str) -> str:
    digits = re.sub(r"\D", "", phone)
    return f"{digits[:3]}.{digits[3:6]}.{digits[6:]}" if len(digits) == 10 else phone


def describe(v: Values, style: str) -> str:
    """The identifying values as a phrase; ``style`` varies the labels and the formats."""
    if "email" in v:
        return {"is": f"email is {v['email']}", "with": f"with email: {v['email']}",
                "colon": f"email: {v['email']}"}.get(style, v["email"])
    if "user_id" in v or "customer_id" in v:
        ident = v.get("user_id") or v["customer_id"]
        return {"is": f"user id is {ident}", "with": f"with ID: {ident}",
                "colon": f"my id: {ident}"}.get(style, ident)
    if "phone" in v:
        dots = _phone_dots(v["phone"])
        return {"is": f"phone number is {v['phone']}", "with": f"with phone: {dots}",
                "colon": f"phone: {dots}"}.get(style, v["phone"])
    if "zip" in v:
        return {"is": f"name is {_name(v)} and my zip code is {v['zip']}",
                "with": f"with name: {_name(v)}, zip: {v['zip']}",
                "colon": f"name: {v['first_name']} {v['last_name']}; zip: {v['zip']}",
                "im": f"{_name(v)} from {v['zip']}"}.get(style, f"{_name(v)} {v['zip']}")
    if "date_of_birth" in v:
        dob = v["date_of_birth"]
        return {"is": f"name is {_name(v)} and my date of birth is {dob}",
                "with": f"with name: {_name(v)}, DOB: {dob}",
                "colon": f"name: {_name(v)}; born: {_dob_day_first(dob)}",
                "im": f"{_name(v)}, born {_dob_words(dob)}"}.get(style, f"{_name(v)} {dob}")
    raise ValueError(f"no phrasing for identifying values {sorted(v)}")


def _instruction(v: Values, instruction: str) -> str:
    """The task instruction verbatim; the values after it when it does not hold them all."""
    if all(value.lower() in instruction.lower() for value in v.values()):
        return instruction
    return f"{instruction} {describe(v, 'bare')}"


PHRASINGS: dict[str, Callable[[Values, str], str]] = {
    "instruction": _instruction,
    "user id is X": lambda v, _: f"OK, {describe(v, 'is')}.",
    "with ID: X": lambda v, _: f"I'm calling about the account {describe(v, 'with')}.",
    "my id: X": lambda v, _: describe(v, "colon"),
    "I'm X": lambda v, _: f"I'm {describe(v, 'im')}.",
    "paraphrase": lambda v, _: (
        f"You should find me in your records under {describe(v, 'bare')} - that is what I "
        "signed up with, as far as I remember."
    ),
    "inside a sentence, upper case": lambda v, _: (
        "HI AGAIN!! SORRY, I WAS AWAY FOR A MINUTE... ANYWAY, THE DETAILS YOU WANTED: "
        f"{describe(v, 'bare').upper()} -- CAN WE GET THIS DONE QUICKLY?"
    ),
    "bare, lower case": lambda v, _: describe(v, "bare").lower(),
}
"""Deterministic ways of saying the identifying turn: name -> text from (values, instruction)."""


def phrased_gold(data: DomainData, split: str, index: int, kind: str, phrasing: str) -> Trajectory:
    """The gold trajectory in which the user identifies by ``kind``, said the ``phrasing`` way."""
    task = data.task(split, index)
    call = identities(data.domain, data.db, task.user_id)[kind]
    instruction = textwrap.dedent(task.instruction).strip()
    return gold_trajectory(data, split, index, (call, PHRASINGS[phrasing](call.kwargs, instruction)))


def kinds(data: DomainData, split: str, index: int) -> list[str]:
    """The identity kinds the task's customer has (none when the customer is not in the db)."""
    return list(identities(data.domain, data.db, data.task(split, index).user_id))
