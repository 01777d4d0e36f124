"""The labeller's false positives on gold actions: at most 1% per domain, on every benchmark task,
with the user's turns said several ways (:mod:`gold_variants`).

A false positive is an invalid label on one of the task's gold actions (same tool, same
arguments), in any form of its gold conversation: the user's first turn in the task's own
words, the identity said in that first turn or on request in each phrasing of
:data:`identity_phrasings.PHRASINGS`, by each way the domain's policy identifies a customer (a
lookup, or, in airline and telecom, an id the user states).  Identification is judged per domain
by what each policy asks: airline "must first obtain the user id" (a stated id is enough),
retail and telehealth demand the lookup even when the id is given.

The only gold actions that may stay invalid are :data:`KNOWN_FAULTS`: the benchmark's own gold
actions that break its policy or use values nothing shows (most are listed in the benchmark
README's quirks).  Each must still be flagged in some form, so the list hides nothing the
labeller has stopped catching.  Recall and type accuracy on injected errors are
``test_injections``'.

The fast test covers every task with a rotating choice of phrasings and identity kinds (every
phrasing and kind is used); the slow one uses them all on every task.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from gold_variants import FORMS, gold_labels, identity_kinds, variants
from identity_phrasings import PHRASINGS

from cast_rl.critique.context import Visible
from cast_rl.critique.gold import ASK_IDENTITY, ConversationBuilder, action_ref
from cast_rl.critique.labeller import ActionLabel, Labeller
from cast_rl.critique.rules import get_rules, visible_findings
from cast_rl.critique.rules.base import ungrounded
from cast_rl.envs.core import DomainData, fixed_clock, load_domain_data
from cast_rl.envs.types import Action

logger = logging.getLogger(__name__)
FPR_BOUND = 0.01
ANY = "*"
"""Every gold action of the task."""

KNOWN_FAULTS: dict[tuple[str, str, int, str], str] = {
    ("airline", "test", 10, "cancel_reservation"):
        "H9ZU1C is economy without insurance, booked more than 24 hours before: not cancellable",
    ("airline", "test", 34, "cancel_reservation"):
        "XEHM4B (basic economy, then economy) has no insurance and was booked 2024-05-01",
    ("airline", "test", 26, "cancel_reservation"): "NQNU5R's flights (May 13-14) are already flown",
    ("airline", "test", 27, "cancel_reservation"): "NQNU5R's flights (May 13-14) are already flown",
    ("airline", "test", 25, "book_reservation"):
        "the passenger's date of birth 1985-04-04 appears nowhere (the profile says 1981-05-26)",
    ("retail", "test", 12, "return_delivered_order_items"): "refund to a non-original method (README)",
    ("retail", "test", 13, "return_delivered_order_items"): "refund to a non-original method (README)",
    ("retail", "test", 64, ANY):
        "the task's user_id (harper_moore_6183) is not the instruction's customer (James Sanchez), "
        "and the exchange is on an order that is not delivered (README)",
    **{("retail", "train", i, "modify_pending_order_payment"): "gift card balance too low (README)"
       for i in (24, 27, 148, 253, 351, 369, 427, 431, 469)},
    ("telecom", "dev", 0, "troubleshoot_device"):
        "device_id 'router_wifi6' is shown nowhere (the tool takes device_name; README)",
    ("telecom", "train", 0, "troubleshoot_device"):
        "device_id 'router_wifi6' is shown nowhere (the tool takes device_name; README)",
    ("telecom", "train", 0, "check_network_status"): "a retired tool, region 'denver_co' shown nowhere",
    ("telehealth", "test", 3, "schedule_appointment"): "voucher THV-224 is in no record (README)",
    ("telehealth", "test", 8, "schedule_appointment"): "voucher THV-224 is in no record (README)",
    ("telehealth", "test", 4, "get_patient_details"): "the children's patient ids are never shown",
    ("telehealth", "test", 10, "get_appointment_details"): "APPT032 does not exist (README)",
    ("telehealth", "test", 13, "reschedule_appointment"):
        "08:00 on a Thursday is not in the provider's schedule (README)",
}
"""(domain, split, task, gold tool or :data:`ANY`) -> why that gold action breaks the policy."""


@dataclass
class GoldScore:
    """Labels of gold actions over every form of every task of one domain."""

    trajectories: int = 0
    gold_actions: int = 0
    invalid: int = 0
    false_positives: list[tuple[str, str, int, ActionLabel]] = field(default_factory=list)
    known_seen: set[tuple[str, str, int, str]] = field(default_factory=set)
    forms: Counter[str] = field(default_factory=Counter)
    """Conversations per form, ``kind:<kind>`` and ``phrasing:<phrasing>``."""
    kinds: set[str] = field(default_factory=set)
    """Every identity kind the domain's tasks have."""

    @property
    def fpr(self) -> float:
        return len(self.false_positives) / self.gold_actions

    def reasons(self) -> Counter[tuple[str, str]]:
        return Counter((lab.source, lab.action["name"]) for _, _, _, lab in self.false_positives)


def _known(domain: str, split: str, index: int, name: str) -> tuple[str, str, int, str] | None:
    for key in ((domain, split, index, name), (domain, split, index, ANY)):
        if key in KNOWN_FAULTS:
            return key
    return None


def score(data: DomainData, full: bool) -> GoldScore:
    """Label every form of every task's gold conversation (all, or the rotating choice)."""
    labeller = Labeller(data)
    result = GoldScore()
    names = list(PHRASINGS)
    k = 0
    for split in data.splits:
        for i in range(len(data.tasks(split))):
            result.kinds.update(identity_kinds(data, split, i))
            for name, trajectory in variants(data, split, i, **({} if full else _rotation(data, split, i, k, names))):
                result.trajectories += 1
                result.forms[name.split("/")[0]] += 1
                result.forms.update(f"kind:{part}" for part in name.split("/")[1:2])
                result.forms.update(f"phrasing:{part}" for part in name.split("/")[2:3])
                for label in gold_labels(data, split, i, labeller.label(trajectory, i)):
                    result.gold_actions += 1
                    if label.verdict != "invalid":
                        continue
                    result.invalid += 1
                    known = _known(data.domain, split, i, label.action["name"])
                    if known is None:
                        result.false_positives.append((name, split, i, label))
                    else:
                        result.known_seen.add(known)
            k += 1
    assert labeller.stats.leakage_drops == 0
    return result


def _rotation(data: DomainData, split: str, i: int, k: int, names: list[str]) -> dict:
    """The fast test's forms of the ``k``-th task, rotating with ``k`` so that every form,
    identity kind and phrasing is used: retail (635 tasks; its default form is
    ``test_gold_labels``') one form per task, the other domains every form with two phrasings."""
    if data.domain != "retail":
        return {"phrasings": [names[k % len(names)], names[(k + len(names) // 2) % len(names)]]}
    kinds = list(identity_kinds(data, split, i))
    if not kinds:
        return {"forms": ("own words",)}
    return {
        "phrasings": [names[k % len(names)]],
        "kinds": [kinds[(k // 3) % len(kinds)]],
        "forms": (("own words",), ("first turn",), ("on request",))[k % 3],
    }


def _data(benchmarks_dir: Path, domain: str) -> DomainData:
    return load_domain_data(domain, benchmarks_dir / domain, clock=fixed_clock("2025-01-01T12:00:00"))


def _check(domain: str, result: GoldScore) -> None:
    logger.info(
        "%s: %d gold conversations, %d gold action labels, %d invalid (%d known gold faults), "
        "FPR %.4f; false positives by rule: %s", domain, result.trajectories, result.gold_actions,
        result.invalid, result.invalid - len(result.false_positives), result.fpr,
        dict(result.reasons()),
    )
    assert set(FORMS) - {"default"} <= set(result.forms), result.forms
    assert all(f"phrasing:{p}" in result.forms for p in PHRASINGS), result.forms
    assert all(f"kind:{kind}" in result.forms for kind in result.kinds), (result.kinds, result.forms)
    examples = [(form, split, i, lab.source, lab.action) for form, split, i, lab in result.false_positives[:5]]
    assert result.fpr <= FPR_BOUND, (domain, len(result.false_positives), result.gold_actions, examples)
    stale = {k for k in KNOWN_FAULTS if k[0] == domain} - result.known_seen
    assert not stale, f"listed gold faults the labeller no longer flags: {sorted(stale)}"


@pytest.mark.parametrize("domain", ["retail", "airline", "telecom", "telehealth"])
def test_gold_false_positives_at_most_one_percent_per_domain(benchmarks_dir: Path, domain: str) -> None:
    data = _data(benchmarks_dir, domain)
    result = score(data, full=False)
    assert result.trajectories >= sum(len(data.tasks(s)) for s in data.splits)
    _check(domain, result)


@pytest.mark.slow
@pytest.mark.parametrize("domain", ["retail", "airline", "telecom", "telehealth"])
def test_gold_false_positives_every_phrasing_every_task(benchmarks_dir: Path, domain: str) -> None:
    _check(domain, score(_data(benchmarks_dir, domain), full=True))


# -- identification as each policy asks ----------------------------------------------------------

def _opened(data: DomainData, split: str, i: int, first: str) -> ConversationBuilder:
    builder = ConversationBuilder(data, split, i)
    builder.user(first)
    return builder


def _labels(data: DomainData, builder: ConversationBuilder) -> list[tuple[str, str, str]]:
    labels = Labeller(data).label(builder.trajectory(0.0))
    return [(lab.action["name"], lab.verdict, lab.source) for lab in labels if lab.action["name"] != "respond"]


def _airline_reservation_task(data: DomainData) -> tuple[str, int, str, str]:
    for i, task in enumerate(data.tasks("test")):
        first = task.actions[0] if task.actions else None
        if first is not None and first.name == "get_reservation_details":
            return "test", i, task.user_id, first.kwargs["reservation_id"]
    raise AssertionError("no airline task opens with a reservation lookup")


@pytest.mark.parametrize("phrasing", list(PHRASINGS))
def test_airline_a_stated_user_id_identifies_without_a_profile_lookup(benchmarks_dir: Path, phrasing: str) -> None:
    data = _data(benchmarks_dir, "airline")
    split, i, uid, rid = _airline_reservation_task(data)
    builder = _opened(data, split, i, f"Hi! I need help with reservation {rid}.")
    builder.say(ASK_IDENTITY)
    builder.user(PHRASINGS[phrasing]({"user_id": uid}, ""))
    builder.call(Action("get_reservation_details", {"reservation_id": rid}))
    assert _labels(data, builder) == [("get_reservation_details", "valid", "")]


def test_airline_a_reservation_read_before_any_user_id_is_flagged(benchmarks_dir: Path) -> None:
    data = _data(benchmarks_dir, "airline")
    split, i, uid, rid = _airline_reservation_task(data)
    builder = _opened(data, split, i, f"Hi! I need help with reservation {rid}; pay with credit_card_1234567.")
    builder.call(Action("get_reservation_details", {"reservation_id": rid}))
    assert _labels(data, builder) == [("get_reservation_details", "invalid", "authentication")]


def test_airline_another_users_reservation_after_a_stated_id_is_a_second_user(benchmarks_dir: Path) -> None:
    data = _data(benchmarks_dir, "airline")
    split, i, uid, rid = _airline_reservation_task(data)
    other = next(r for r, v in sorted(data.db["reservations"].items()) if v["user_id"] != uid)
    builder = _opened(data, split, i, f"Hi! My user id is {uid}. Please check {rid} and {other}.")
    builder.call(Action("get_reservation_details", {"reservation_id": rid}))
    builder.call(Action("get_reservation_details", {"reservation_id": other}))
    builder.say("Shall I cancel it? Please confirm (yes/no).")
    builder.user("Yes")
    builder.call(Action("cancel_reservation", {"reservation_id": other}))
    assert [(n, v, s) for n, v, s in _labels(data, builder)][-1] == ("cancel_reservation", "invalid", "one_user")


def test_airline_a_cabin_change_made_earlier_lets_the_flights_change(benchmarks_dir: Path) -> None:
    """Test task 22: basic economy, upgraded to economy (same flights), then new flights.  The
    API's output keeps the old cabin; the agent's accepted cabin change counts."""
    data = _data(benchmarks_dir, "airline")
    task = data.task("test", 22)
    upgrade, change = [a for a in task.actions if a.name == "update_reservation_flights"]

    def labels(writes: list[Action]) -> list[tuple[str, str]]:
        builder = _opened(data, "test", 22, "Hi! " + task.instruction)
        for read in task.actions[:3]:  # the profile, the reservation, the flight search
            builder.call(read)
        for write in writes:
            builder.confirm(write)
            builder.call(write)
        return [(v, s) for n, v, s in _labels(data, builder) if n == "update_reservation_flights"]

    assert labels([change]) == [("invalid", "basic_economy")]  # new flights on basic economy
    assert labels([upgrade, change]) == [("valid", ""), ("valid", "")]


def test_telehealth_a_schedule_the_tool_cannot_show_counts_as_checked(benchmarks_dir: Path) -> None:
    """Asking for the schedule is the check; an unchecked slot is the tool's to reject: the
    labeller drops the visible finding when the booking goes through, keeps it when it fails."""
    data = _data(benchmarks_dir, "telehealth")
    task = data.task("test", 18)  # books dr_patel_anesthesiology, whose record breaks get_provider_details
    booking = next(a for a in task.actions if a.name == "schedule_appointment")
    unoffered = Action(booking.name, {**booking.kwargs, "date": "2025-11-08"})  # a Saturday (the day after one said)
    email = data.db["patients"][task.user_id]["demographics"]["email"]
    rules = get_rules("telehealth")
    for tried, action, verdict in ((True, booking, "valid"), (False, booking, "valid"),
                                   (False, unoffered, "invalid")):
        builder = _opened(data, "test", 18, "Hi! " + task.instruction)
        builder.call(Action("find_patient_by_email", {"email": email}))
        if tried:
            builder.call(Action("get_provider_details", {"provider_id": booking.kwargs["provider_id"]}))
        builder.confirm(action)
        builder.call(action)
        visible = Visible(data.policy, builder.messages[:builder.last_call], data.tools)
        findings = visible_findings(action_ref(action), visible, rules)
        assert [f.source for f in findings] == ([] if tried else ["availability_unchecked"])
        labels = _labels(data, builder)
        assert labels[-1][:2] == ("schedule_appointment", verdict), labels
        assert all(v == "valid" for _, v, _ in labels[:-1]), labels  # the failed read included


def test_retail_state_code_and_country_follow_from_the_address_said() -> None:
    said = Visible("", [{"role": "user", "content": "Move me to 101 Highway, New York, 10001."}])
    kwargs = {"address1": "101 Highway", "address2": "", "city": "New York", "state": "NY",
              "country": "USA", "zip": "10001"}
    assert ungrounded("modify_user_address", kwargs, said, get_rules("retail")) == []
    elsewhere = {**kwargs, "state": "CA"}
    assert ungrounded("modify_user_address", elsewhere, said, get_rules("retail")) == [("state", "CA")]
