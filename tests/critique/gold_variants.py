"""Gold trajectories of a task with the user's turns said several ways: labeller FPR cases.

:func:`variants` gives, for one task, the gold conversation
(:func:`cast_rl.critique.gold.gold_trajectory`) in these forms:

* ``default``: as built (the user opens with "Hi! " and the instruction; asked, they identify);
* ``own words``: the user's first turn is the task instruction verbatim, nothing added;
* ``first turn/<kind>``: the identity is said in the first turn (the instruction, with the
  identifying values after it where it does not hold them) and the agent does not ask;
* ``on request/<kind>/<phrasing>``: the identity said on request, in one of
  :data:`identity_phrasings.PHRASINGS`.

``<kind>`` is each way the domain's policy identifies the customer: a lookup
(:func:`~cast_rl.critique.gold_domains.identities`: email, name and zip code, phone, name and
date of birth, a user or customer id), or, where the policy takes a stated id with no lookup
(:func:`~cast_rl.critique.gold_domains.stated_identities`: airline user id, telecom customer
id), ``<id>, stated``.  The gold actions and their values stay the same in every form, so each
gold action should be labelled alike in all of them.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterator
from typing import Any

from identity_phrasings import PHRASINGS, Values, _instruction

from cast_rl.critique.gold import Given, gold_trajectory
from cast_rl.critique.gold_domains import identities, stated_identities
from cast_rl.critique.labeller import ActionLabel
from cast_rl.envs.core import DomainData
from cast_rl.records import Trajectory


def identity_kinds(data: DomainData, split: str, index: int) -> dict[str, tuple[Values, bool]]:
    """kind -> (the values the user says, whether the agent looks them up)."""
    uid = data.task(split, index).user_id
    kinds: dict[str, tuple[Values, bool]] = {
        kind: (dict(call.kwargs), True) for kind, call in identities(data.domain, data.db, uid).items()
    }
    for kind, values in stated_identities(data.domain, data.db, uid).items():
        kinds[f"{kind}, stated"] = (values, False)
    return kinds


def _given(data: DomainData, split: str, index: int, kind: str, words: str) -> Given:
    values, lookup = identity_kinds(data, split, index)[kind]
    if not lookup:
        return None, words
    call = identities(data.domain, data.db, data.task(split, index).user_id)[kind.split(",")[0]]
    assert dict(call.kwargs) == values
    return call, words


FORMS = ("default", "own words", "first turn", "on request")


def variants(
    data: DomainData,
    split: str,
    index: int,
    phrasings: list[str] | None = None,
    kinds: list[str] | None = None,
    forms: tuple[str, ...] = FORMS,
) -> Iterator[tuple[str, Trajectory]]:
    """(name, trajectory) of the forms of the task's gold conversation (module docstring);
    ``phrasings`` and ``kinds`` limit the on-request and first-turn forms (default: all)."""
    instruction = textwrap.dedent(data.task(split, index).instruction).strip()
    if "default" in forms:
        yield "default", gold_trajectory(data, split, index)
    if "own words" in forms:
        yield "own words", gold_trajectory(data, split, index, opening=instruction)
    for kind, (values, _) in identity_kinds(data, split, index).items():
        if kinds is not None and kind not in kinds:
            continue
        if "first turn" in forms:
            given = _given(data, split, index, kind, _instruction(values, instruction))
            yield f"first turn/{kind}", gold_trajectory(data, split, index, given, ask=False)
        if "on request" not in forms:
            continue
        for phrasing in phrasings if phrasings is not None else list(PHRASINGS):
            given = _given(data, split, index, kind, PHRASINGS[phrasing](values, instruction))
            yield f"on request/{kind}/{phrasing}", gold_trajectory(data, split, index, given)


def gold_labels(data: DomainData, split: str, index: int, labels: list[ActionLabel]) -> list[ActionLabel]:
    """The labels of the task's gold actions (same tool, same arguments)."""
    gold = {_key(a.name, a.kwargs) for a in data.task(split, index).actions}
    return [lab for lab in labels if _key(lab.action["name"], lab.action["kwargs"]) in gold]


def _key(name: str, kwargs: Any) -> str:
    return json.dumps([name, kwargs], sort_keys=True, default=str)
