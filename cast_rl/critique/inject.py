"""Trajectories with one deliberate error: test material for the labeller, data for the critic.

Each injector builds a policy-abiding conversation for a task (:class:`ConversationBuilder`), then
at one point makes a mistake of a known kind and ends the conversation after it.  It returns the
trajectory, the position of the faulty action and its expected error type, or None when the task
offers no occasion for that kind (no write, no second order, ...).

Kinds and their error types:

======================  ================  =====================================================
kind                    error type        the faulty action
======================  ================  =====================================================
missing_confirmation    policy_violation  the first write, without listing it and asking
fabricated_id           hallucination     an action with an id that nothing visible mentions
unauthenticated         policy_violation  customer data read by the id the user gave, no lookup
                                          (telecom and airline, where a given id identifies: a
                                          ticket or reservation read before the user gave
                                          anything identifying)
forbidden_state         policy_violation  cancelling what the visible state shows cannot be
second_user             policy_violation  a write on another customer's record
wrong_record            wrong_tool_usage  the first write applied to another visible record
wrong_tool              wrong_tool_usage  a lookup fed an id of the wrong kind
wrong_arguments         wrong_tool_usage  the first write with one argument changed (visible)
tool_overuse            policy_violation  a once-only write repeated (items, exchange, ticket)
======================  ================  =====================================================
"""

from __future__ import annotations

import random
import re
import textwrap
from collections.abc import Callable
from dataclasses import dataclass

from cast_rl.critique.context import is_error
from cast_rl.critique.gold import ConversationBuilder, action_ref
from cast_rl.critique.gold_domains import required_reads
from cast_rl.critique.inject_choices import AIRLINE_NOW, airline_blocked, alternatives, variants
from cast_rl.envs.core import DomainData, call_tool
from cast_rl.envs.types import Action
from cast_rl.records import Trajectory

EXPECTED = {
    "missing_confirmation": "policy_violation",
    "fabricated_id": "hallucination",
    "unauthenticated": "policy_violation",
    "forbidden_state": "policy_violation",
    "second_user": "policy_violation",
    "wrong_record": "wrong_tool_usage",
    "wrong_tool": "wrong_tool_usage",
    "wrong_arguments": "wrong_tool_usage",
    "tool_overuse": "policy_violation",
}


@dataclass
class Injected:
    trajectory: Trajectory
    message_index: int
    """Message index of the faulty action (an assistant tool call)."""
    kind: str
    expected: str


def _start(data: DomainData, split: str, index: int, authenticate: bool = True) -> ConversationBuilder:
    builder = ConversationBuilder(data, split, index)
    builder.user("Hi! " + textwrap.dedent(builder.task.instruction).strip())
    if authenticate:
        builder.authenticate(list(builder.task.actions))
    return builder


def _end(builder: ConversationBuilder, kind: str, target: int) -> Injected:
    builder.finish()
    traj = builder.trajectory(reward=0.0)
    traj.info["injection"] = {"kind": kind, "message_index": target}
    return Injected(traj, target, kind, EXPECTED[kind])


def _first_write(builder: ConversationBuilder) -> int | None:
    for i, action in enumerate(builder.task.actions):
        if builder.rules.is_write(action_ref(action)) and action.name not in builder.rules.terminate_tools:
            return i
    return None


def _prefix(builder: ConversationBuilder, upto: int) -> None:
    for action in builder.task.actions[builder.consumed : upto]:
        if builder.ended:
            return
        builder.perform(action)


def missing_confirmation(data: DomainData, split: str, index: int, rng: random.Random) -> Injected | None:
    builder = _start(data, split, index)
    w = _first_write(builder)
    if w is None:
        return None
    _prefix(builder, w)
    action = builder.task.actions[w]
    _reads(builder, action)
    builder.reveal(action)
    builder.call(action)
    return _end(builder, "missing_confirmation", builder.last_call)


def _fabricate(value: str, rng: random.Random, builder: ConversationBuilder) -> str:
    for _ in range(50):
        fake = re.sub(r"\d", lambda _m: str(rng.randint(0, 9)), value)
        if fake != value and not builder.visible().contains(fake) and not _in_db(builder, fake):
            return fake
    return value + "9"


def _in_db(builder: ConversationBuilder, value: str) -> bool:
    return any(value in table for table in builder.env.db.values() if hasattr(table, "touched_keys"))


def fabricated_id(data: DomainData, split: str, index: int, rng: random.Random) -> Injected | None:
    builder = _start(data, split, index)
    for i, action in enumerate(builder.task.actions):
        if action.name in builder.rules.auth_tools or i < builder.consumed:
            continue
        keys = [k for k, v in action.kwargs.items() if isinstance(v, str) and re.search(r"\d", v)
                and k.endswith("id") and k not in builder.rules.free_text.get(action.name, ())]
        if keys:
            break
    else:
        return None
    _prefix(builder, i)
    if builder.ended:
        return None
    key = rng.choice(keys)
    fake = Action(action.name, {**action.kwargs, key: _fabricate(action.kwargs[key], rng, builder)})
    # everything as for the real action (reads, confirmation), then the call with the made-up id
    _reads(builder, action)
    builder.reveal(action)
    if builder.rules.is_write(action_ref(action)):
        builder.confirm(action)
    builder.call(fake)
    return _end(builder, "fabricated_id", builder.last_call)


def _reads(builder: ConversationBuilder, action: Action) -> None:
    for read in required_reads(builder.data.domain, builder.env.db, builder.task.user_id, action):
        if not is_error(call_tool(builder.data, builder.env.db.fork(), read)):
            builder.reveal(read)
            builder.call(read)


_SELF_LOOKUP = {
    "retail": ("get_user_details", "user_id"),
    "telehealth": ("get_patient_details", "patient_id"),
}


def unauthenticated(data: DomainData, split: str, index: int, rng: random.Random) -> Injected | None:
    if data.domain in _UNIDENTIFIED_RECORD:
        return _unidentified_record(data, split, index)
    builder = _start(data, split, index, authenticate=False)
    uid = builder.task.user_id
    builder.say("Happy to help. Could you tell me your account id?")
    builder.user(f"Sure, my id is {uid}.")
    tool, arg = _SELF_LOOKUP[data.domain]
    builder.call(Action(tool, {arg: uid}))
    return _end(builder, "unauthenticated", builder.last_call)


_UNIDENTIFIED_RECORD = {
    "telecom": ("support ticket", "get_support_ticket_details", "ticket_id"),
    "airline": ("reservation", "get_reservation_details", "reservation_id"),
}


def _records_of(data: DomainData, builder: ConversationBuilder, uid: str) -> list[str]:
    if data.domain == "telecom":
        return sorted(t for t, r in builder.env.db["support_tickets"].items() if r.get("customer_id") == uid)
    return list(builder.env.db["users"].get(uid, {}).get("reservations", []))


def _unidentified_record(data: DomainData, split: str, index: int) -> Injected | None:
    """Telecom and airline: an id the user gives identifies them, so the fault is reading a record
    of theirs (a support ticket, a reservation) before they gave any identifying value."""
    builder = ConversationBuilder(data, split, index)
    what, tool, arg = _UNIDENTIFIED_RECORD[data.domain]
    records = _records_of(data, builder, builder.task.user_id)
    if not records:
        return None
    builder.user(f"Hi! I have a question about my {what} {records[0]}.")
    builder.call(Action(tool, {arg: records[0]}))
    return _end(builder, "unauthenticated", builder.last_call)


def _act_on(builder: ConversationBuilder, reads: list[Action], action: Action) -> int:
    for read in reads:
        builder.reveal(read)
        builder.call(read)
    builder.reveal(action)
    builder.confirm(action)
    builder.call(action)
    return builder.last_call


def forbidden_state(data: DomainData, split: str, index: int, rng: random.Random) -> Injected | None:
    builder = _start(data, split, index)
    db, uid = builder.env.db, builder.task.user_id
    if data.domain == "retail":
        orders = [o for o in db["users"].get(uid, {}).get("orders", []) if db["orders"][o]["status"] != "pending"]
        if not orders:
            return None
        oid = rng.choice(orders)
        action = Action("cancel_pending_order", {"order_id": oid, "reason": "no longer needed"})
        reads = [Action("get_user_details", {"user_id": uid}), Action("get_order_details", {"order_id": oid})]
    elif data.domain == "airline":
        now = AIRLINE_NOW
        rids = [
            r for r in db["users"].get(uid, {}).get("reservations", [])
            if airline_blocked(db["reservations"][r], now)
        ]
        if not rids:
            return None
        rid = rng.choice(rids)
        action = Action("cancel_reservation", {"reservation_id": rid})
        reads = [Action("get_reservation_details", {"reservation_id": rid})]
    elif data.domain == "telehealth":
        done = [a for a, appt in db["appointments"].items()
                if appt.get("patient_id") == uid and appt.get("status") in ("completed", "cancelled")]
        if not done:
            return None
        aid = rng.choice(sorted(done))
        action = Action("cancel_appointment", {"appointment_id": aid})
        reads = [Action("get_appointment_details", {"appointment_id": aid})]
    elif data.domain == "telecom":
        have = set(db["customers"].get(uid, {}).get("services", []))
        absent = sorted(set(db["services"]) - have)
        if not absent:
            return None
        action = Action("manage_service", {
            "customer_id": uid, "action": "remove", "service_id": rng.choice(absent),
        })
        reads = [Action("get_customer_details", {"customer_id": uid}), Action("get_services", {})]
    else:
        return None
    return _end(builder, "forbidden_state", _act_on(builder, reads, action))


def second_user(data: DomainData, split: str, index: int, rng: random.Random) -> Injected | None:
    builder = _start(data, split, index)
    db, uid = builder.env.db, builder.task.user_id
    if data.domain == "retail":
        others = sorted(o for o, v in db["orders"].items() if v["user_id"] != uid and v["status"] == "pending")
        oid = rng.choice(others)
        builder.user(f"Also, please cancel order {oid} because it is no longer needed.")
        return _end(builder, "second_user", _act_on(
            builder, [Action("get_order_details", {"order_id": oid})],
            Action("cancel_pending_order", {"order_id": oid, "reason": "no longer needed"})))
    if data.domain == "airline":
        others = sorted(r for r, v in db["reservations"].items() if v["user_id"] != uid and v["cabin"] == "business")
        rid = rng.choice(others)
        builder.user(f"Also, please cancel reservation {rid}.")
        return _end(builder, "second_user", _act_on(
            builder, [Action("get_reservation_details", {"reservation_id": rid})],
            Action("cancel_reservation", {"reservation_id": rid})))
    if data.domain == "telecom":
        tickets = sorted(t for t, v in db["support_tickets"].items() if v["customer_id"] != uid)
        if not tickets:
            return None
        tid = rng.choice(tickets)
        builder.user(f"Also, please close support ticket {tid}.")
        return _end(builder, "second_user", _act_on(
            builder, [Action("get_support_ticket_details", {"ticket_id": tid})],
            Action("modify_support_ticket", {"ticket_id": tid, "status": "closed", "priority": "low"})))
    # one whose details the tool can show (some records break get_appointment_details): the
    # fault is acting on a record visibly another patient's
    def shown(aid: str) -> bool:
        return not is_error(call_tool(data, db.fork(), Action("get_appointment_details", {"appointment_id": aid})))

    appts = sorted(a for a, v in db["appointments"].items()
                   if v.get("patient_id") != uid and v.get("status") == "scheduled" and shown(a))
    aid = rng.choice(appts)
    builder.user(f"Also, please cancel appointment {aid}.")
    return _end(builder, "second_user", _act_on(
        builder, [Action("get_appointment_details", {"appointment_id": aid})],
        Action("cancel_appointment", {"appointment_id": aid})))


def wrong_record(data: DomainData, split: str, index: int, rng: random.Random) -> Injected | None:
    builder = _start(data, split, index)
    for i, action in enumerate(builder.task.actions):
        if builder.rules.is_write(action_ref(action)):
            _prefix(builder, i)
            others = alternatives(builder, action)
            if not others or builder.ended:
                return None
            builder.perform(rng.choice(others))
            return _end(builder, "wrong_record", builder.last_call)
    return None


def wrong_arguments(data: DomainData, split: str, index: int, rng: random.Random) -> Injected | None:
    builder = _start(data, split, index)
    for i, action in enumerate(builder.task.actions):
        if i < builder.consumed or not builder.rules.is_write(action_ref(action)):
            continue
        _prefix(builder, i)
        choices = variants(builder, action)
        if not choices or builder.ended:
            return None
        choice = rng.choice(choices)
        _reads(builder, choice)
        builder.reveal(choice)
        if builder.missing(choice):
            # the changed value cannot be shown (a provider whose schedule the tool cannot
            # list): using it would be a made-up value, not a visible wrong one
            shown = [c for c in choices if not builder.missing(c)]
            if not shown:
                return None
            choice = rng.choice(shown)
        builder.perform(choice)
        return _end(builder, "wrong_arguments", builder.last_call)
    return None


def tool_overuse(data: DomainData, split: str, index: int, rng: random.Random) -> Injected | None:
    builder = _start(data, split, index)
    once = ("modify_pending_order_items", "exchange_delivered_order_items", "create_support_ticket")
    for i, action in enumerate(builder.task.actions):
        if i >= builder.consumed and action.name in once:
            _prefix(builder, i)
            if builder.ended or is_error(builder.perform(action)):
                return None
            builder.perform(action)
            return _end(builder, "tool_overuse", builder.last_call)
    return None


_WRONG_KIND = {
    "retail": ("get_product_details", "product_id", r'"item_id": "(\d+)"'),
    "airline": ("get_reservation_details", "reservation_id", r'"flight_number": "(\w+)"'),
    "telecom": ("get_service_details", "service_id", r'"device_id": "(\w+)"'),
    "telehealth": ("get_medical_record", "record_id", r"\b(APPT\d+)\b"),
}


def wrong_tool(data: DomainData, split: str, index: int, rng: random.Random) -> Injected | None:
    builder = _start(data, split, index)
    tool, arg, pattern = _WRONG_KIND[data.domain]
    for action in builder.task.actions:
        if builder.ended:
            return None
        builder.perform(action)
        found = [m for _, text in builder.visible().sources if text for m in re.findall(pattern, text)]
        if found:
            builder.call(Action(tool, {arg: rng.choice(sorted(set(found)))}))
            return _end(builder, "wrong_tool", builder.last_call)
    return None


INJECTORS: dict[str, Callable[[DomainData, str, int, random.Random], Injected | None]] = {
    "missing_confirmation": missing_confirmation,
    "fabricated_id": fabricated_id,
    "unauthenticated": unauthenticated,
    "forbidden_state": forbidden_state,
    "second_user": second_user,
    "wrong_record": wrong_record,
    "wrong_tool": wrong_tool,
    "wrong_arguments": wrong_arguments,
    "tool_overuse": tool_overuse,
}


def inject(kind: str, data: DomainData, split: str, index: int, seed: int = 0) -> Injected | None:
    """One trajectory of ``kind`` for a task, or None when the task offers no occasion."""
    if kind not in INJECTORS:
        raise ValueError(f"unknown injection kind {kind!r}; choose one of {', '.join(INJECTORS)}")
    return INJECTORS[kind](data, split, index, random.Random(f"{seed}:{kind}:{split}:{index}"))
