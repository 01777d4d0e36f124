"""Identification rests on the values the user gives, not on the words around them.

Every task of every benchmark domain, with the customer identifying themselves each way the
domain's policy accepts (email, name + zip code, phone, name + date of birth, a user or customer
id), each said in every phrasing of :data:`identity_phrasings.PHRASINGS`: the labeller's
false-positive rate on the gold actions stays at or below 1% per domain.  A false positive is an
invalid label on an action that the task's default gold trajectory does not already have
invalid (those are the benchmark's own gold faults; ``test_gold_labels`` bounds them).
Unit tests check each phrasing on its own, and that robust does not mean lax: a value the user
did not give, or an id where the policy asks for a lookup, is still flagged.
"""

from __future__ import annotations

import json
import logging
import textwrap
from pathlib import Path

import pytest
from critique_helpers import benchmarks_dir
from identity_phrasings import PHRASINGS, describe, kinds, phrased_gold

from cast_rl.critique.gold import ASK_IDENTITY, ConversationBuilder, gold_trajectory
from cast_rl.critique.gold_domains import identities
from cast_rl.critique.labeller import ActionLabel, Labeller
from cast_rl.envs.core import DomainData, fixed_clock, load_domain_data
from cast_rl.envs.types import Action

logger = logging.getLogger(__name__)
FPR_BOUND = 0.01


def _benchmark(domain: str) -> DomainData:
    root = benchmarks_dir()
    if not (root / "README.md").exists():
        pytest.skip(f"benchmark data not found at {root} (it lives beside the repo)")
    return load_domain_data(domain, root / domain, clock=fixed_clock("2025-01-01T12:00:00"))


def _key(label: ActionLabel) -> str:
    return json.dumps(label.action, sort_keys=True, default=str)


def _invalid(labels: list[ActionLabel]) -> list[ActionLabel]:
    return [lab for lab in labels if lab.verdict == "invalid"]


@pytest.mark.parametrize("domain", [
    pytest.param("retail", marks=pytest.mark.slow),  # 635 tasks x 2 kinds x 8 phrasings
    "airline", "telecom", "telehealth",
])
def test_rephrased_identity_keeps_gold_false_positives_under_one_percent(domain: str) -> None:
    data = _benchmark(domain)
    labeller = Labeller(data)
    actions = false_positives = invalid = variants = 0
    for split in data.splits:
        for i in range(len(data.tasks(split))):
            faults = {_key(lab) for lab in _invalid(labeller.label(gold_trajectory(data, split, i), i))}
            for kind in kinds(data, split, i):
                for phrasing in PHRASINGS:
                    labels = labeller.label(phrased_gold(data, split, i, kind, phrasing), i)
                    variants += 1
                    actions += len(labels)
                    invalid += len(_invalid(labels))
                    false_positives += sum(_key(lab) not in faults for lab in _invalid(labels))
    logger.info("%s: %d phrased gold trajectories, %d actions, %d invalid (%d not gold faults): "
                "FPR %.4f", domain, variants, actions, invalid, false_positives,
                false_positives / actions)
    assert variants >= len(PHRASINGS) * len(data.splits)
    assert false_positives / actions <= FPR_BOUND, (domain, false_positives, actions)
    assert labeller.stats.leakage_drops == 0


def test_rephrased_identity_on_a_sample_of_retail_tasks() -> None:
    """The retail case of the test above on every 10th task (the full one is slow)."""
    data = _benchmark("retail")
    labeller = Labeller(data)
    tasks = [(split, i) for split in data.splits for i in range(len(data.tasks(split)))][::10]
    actions = false_positives = 0
    for split, i in tasks:
        faults = {_key(lab) for lab in _invalid(labeller.label(gold_trajectory(data, split, i), i))}
        for kind in kinds(data, split, i):
            for phrasing in PHRASINGS:
                labels = labeller.label(phrased_gold(data, split, i, kind, phrasing), i)
                actions += len(labels)
                false_positives += sum(_key(lab) not in faults for lab in _invalid(labels))
    assert actions > 1000
    assert false_positives / actions <= FPR_BOUND


# -- each phrasing on its own ------------------------------------------------------------------

_CLEAN: dict[tuple[str, str, str], tuple[str, int]] = {}


def _clean_task(data: DomainData, kind: str) -> tuple[str, int]:
    """The first task whose default gold trajectory is all valid and that has ``kind``."""
    key = (data.domain, str(data.data_dir), kind)
    if key not in _CLEAN:
        _CLEAN[key] = _find_clean_task(data, kind)
    return _CLEAN[key]


def _find_clean_task(data: DomainData, kind: str) -> tuple[str, int]:
    labeller = Labeller(data)
    for split in data.splits:
        for i in range(len(data.tasks(split))):
            if kind in kinds(data, split, i) and not _invalid(labeller.label(gold_trajectory(data, split, i))):
                return split, i
    raise AssertionError(f"no clean {data.domain} task identifies by {kind}")


@pytest.mark.parametrize("phrasing", list(PHRASINGS))
@pytest.mark.parametrize("kind", ["email", "name_zip"])
def test_each_phrasing_identifies_on_generated_retail(retail_data_dir: Path, kind: str, phrasing: str) -> None:
    data = load_domain_data("retail", retail_data_dir)
    split, i = _clean_task(data, kind)
    labels = Labeller(data).label(phrased_gold(data, split, i, kind, phrasing), i)
    assert labels and _invalid(labels) == [], [lab.to_json() for lab in _invalid(labels)]


@pytest.mark.parametrize("phrasing", list(PHRASINGS))
@pytest.mark.parametrize(("domain", "kind"), [
    ("airline", "user_id"), ("telecom", "customer_id"), ("telecom", "phone"),
    ("telehealth", "name_dob"), ("telehealth", "email"),
])
def test_each_phrasing_identifies_on_benchmark_domains(domain: str, kind: str, phrasing: str) -> None:
    data = _benchmark(domain)
    split, i = _clean_task(data, kind)
    trajectory = phrased_gold(data, split, i, kind, phrasing)
    instruction = textwrap.dedent(data.task(split, i).instruction).strip()
    said = PHRASINGS[phrasing](_identity_call(data, split, i, kind).kwargs, instruction)
    assert said in [m.get("content") for m in trajectory.messages if m.get("role") == "user"]
    labels = Labeller(data).label(trajectory, i)
    assert labels and _invalid(labels) == [], [lab.to_json() for lab in _invalid(labels)]


def _identity_call(data: DomainData, split: str, i: int, kind: str) -> Action:
    return identities(data.domain, data.db, data.task(split, i).user_id)[kind]


# -- robust, not lax ---------------------------------------------------------------------------

def _identified_by(data: DomainData, split: str, i: int, text: str) -> ConversationBuilder:
    builder = ConversationBuilder(data, split, i)
    builder.user("Hi! I need some help with my account.")
    builder.say(ASK_IDENTITY)
    builder.user(text)
    return builder


@pytest.mark.parametrize("phrasing", list(PHRASINGS))
def test_a_user_id_alone_does_not_authenticate_in_retail(retail_data_dir: Path, phrasing: str) -> None:
    """Retail's policy asks for the email or name + zip lookup even when the user gives the id."""
    data = load_domain_data("retail", retail_data_dir)
    uid = data.task("train", 0).user_id
    builder = _identified_by(data, "train", 0, PHRASINGS[phrasing]({"user_id": uid}, ""))
    builder.call(Action("get_user_details", {"user_id": uid}))
    (label,) = Labeller(data).label(builder.trajectory(0.0))[-1:]
    assert (label.verdict, label.error_type, label.source) == (
        "invalid", "policy_violation", "authentication")


def test_telecom_another_customer_stated_after_the_first_is_a_second_customer() -> None:
    data = _benchmark("telecom")
    split, i = _clean_task(data, "customer_id")
    uid = data.task(split, i).user_id
    other = next(c for c in data.db["customers"] if c != uid)
    builder = _identified_by(data, split, i, f"{describe({'customer_id': uid}, 'colon')}, and my "
                             f"neighbour's is {other}.")
    builder.call(Action("get_customer_details", {"customer_id": uid}))
    builder.call(Action("get_customer_details", {"customer_id": other}))
    labels = Labeller(data).label(builder.trajectory(0.0))
    first, second = [lab for lab in labels if lab.action["name"] == "get_customer_details"]
    assert first.verdict == "valid"
    assert (second.verdict, second.source) == ("invalid", "one_user")


def test_telecom_an_id_seen_in_a_tool_output_but_never_given_does_not_identify() -> None:
    data = _benchmark("telecom")
    ticket, record = sorted(data.db["support_tickets"].items())[0]
    split, i = _clean_task(data, "customer_id")
    builder = _identified_by(data, split, i, f"I'd rather not say. It is about ticket {ticket}.")
    builder.call(Action("get_support_ticket_details", {"ticket_id": ticket}))
    builder.call(Action("get_customer_details", {"customer_id": record["customer_id"]}))
    labels = Labeller(data).label(builder.trajectory(0.0))
    assert [(lab.verdict, lab.source) for lab in labels if lab.action["name"] != "respond"] == [
        ("invalid", "authentication"), ("invalid", "authentication")]
