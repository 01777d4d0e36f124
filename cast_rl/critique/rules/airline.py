"""Airline policy (tau-bench ``wiki.md``) as visible rules.

* the user id must come from the user before reservations are touched: the policy asks the agent
  to "first obtain the user id", so a user id the user states identifies them (in any words, in
  the first message or later), as does a ``get_user_details`` lookup of an id they stated; a
  profile lookup is not required first; only that user's reservations; every update needs the
  details listed and an explicit yes;
* the reservation must have been looked up before it is changed or cancelled (the API does not
  check the rules, so the agent must);
* cancel: within 24 hours of booking, business cabin, or travel insurance; never a trip with a
  segment already flown;
* change flights: not for basic economy (a cabin change the agent made earlier in the
  conversation counts, since the API's output does not show it); baggage can be added, not
  removed; the number of passengers cannot change;
* book: at most five passengers; at most one certificate, one credit card and three gift cards,
  all from the user's profile; only flights shown as available;
* certificates: only when the user complains and asks for compensation, and not for a regular
  member without insurance flying (basic) economy.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Any

from cast_rl.critique.context import Visible
from cast_rl.critique.rationale import Evidence
from cast_rl.critique.rules.base import Ctx, DomainRules, Finding
from cast_rl.critique.rules.state import field_evidence, latest_record, parse_json, user_said

_RESERVATION_TOOLS = (
    "get_reservation_details", "update_reservation_flights", "update_reservation_baggages",
    "update_reservation_passengers", "cancel_reservation",
)
_NOW = re.compile(r"current time is (\d{4}-\d{2}-\d{2})[ T](\d{2}:\d{2}:\d{2})")
_COMPLAINT = (
    r"compensat|gesture|complain|upset|unacceptable|frustrat|angry|annoyed|delay"
    r"|cancell?ed (my )?flight"
)


class AirlineRules(DomainRules):
    name = "airline"
    subject_arg = "user_id"
    auth_tools = ("get_user_details",)
    stated_id_identifies = True
    public_tools = frozenset(
        {"think", "calculate", "search_direct_flight", "search_onestop_flight", "list_all_airports"}
    )
    write_tools = frozenset({
        "book_reservation", "cancel_reservation", "send_certificate",
        "update_reservation_baggages", "update_reservation_flights",
        "update_reservation_passengers",
    })
    terminate_tools = frozenset({"transfer_to_human_agents"})
    confirm_keys = {
        "book_reservation": ("flights",),
        "cancel_reservation": ("reservation_id",),
        "update_reservation_baggages": ("reservation_id",),
        "update_reservation_flights": ("reservation_id",),
        "update_reservation_passengers": ("reservation_id",),
        "send_certificate": ("amount",),
    }
    free_text = {
        "think": frozenset({"thought"}),
        "calculate": frozenset({"expression"}),
        "transfer_to_human_agents": frozenset({"summary"}),
    }
    derived = {"book_reservation": frozenset({"payment_methods.amount"})}
    auth_clause = (("must first obtain the user id",),)
    one_user_clause = (("deny user requests",),)
    confirm_clause = (("explicit user confirmation",), ("confirmation",))

    def authenticated(self, visible: Visible) -> tuple[str, int] | None:
        """The user id the user gave (in any words), once ``get_user_details`` found it."""
        for record in visible.calls("get_user_details", ok=True):
            ident = record.kwargs.get("user_id")
            if isinstance(ident, str) and ident.strip() and visible.user_stated(ident) is not None:
                return ident, record.output_index or record.message_index
        return None

    def record_owner(self, ctx: Ctx, arg: str, value: Any) -> tuple[str, Evidence] | None:
        if arg == "reservation_id":
            found = latest_record(ctx.visible, "reservation_id", value, _RESERVATION_TOOLS)
            if found and isinstance(found[0].get("user_id"), str):
                owner = found[0]["user_id"]
                return owner, (field_evidence(found[1], "user_id", owner) or [Evidence(None, "")])[0]
        return None

    def check(self, ctx: Ctx) -> list[Finding]:
        name, kwargs = ctx.action.name, ctx.action.kwargs
        out: list[Finding] = []
        user = _user(ctx)
        payments = [kwargs.get("payment_id")] if "payment_id" in kwargs else []
        payments += [p.get("payment_id") for p in kwargs.get("payment_methods") or [] if isinstance(p, dict)]
        if user is not None:
            methods = user[0].get("payment_methods") or {}
            for pay in payments:
                if isinstance(pay, str) and pay not in methods:
                    out.append(Finding(
                        "policy_violation",
                        f"The payment method {pay!r} is not in the user's profile.",
                        evidence=ctx.evidence(pay),
                        clause=(("already be in user profile",),),
                        suggested_fix="Use a payment method from the user's profile.",
                        source="payment_owner",
                    ))
        if name in _RESERVATION_TOOLS[1:]:
            out += _reservation_rules(ctx)
        if name == "book_reservation":
            out += _booking_rules(ctx, payments)
        if name == "send_certificate":
            out += _certificate_rules(ctx, user)
        return out


def _user(ctx: Ctx) -> tuple[dict[str, Any], Any] | None:
    for record in reversed(ctx.visible.calls("get_user_details", ok=True)):
        parsed = parse_json(record.output)
        if isinstance(parsed, dict):
            return parsed, record
    return None


def _now(policy: str) -> datetime | None:
    match = _NOW.search(policy)
    return datetime.fromisoformat(f"{match.group(1)}T{match.group(2)}") if match else None


def _finding(text: str, evidence: list[Evidence], clause: tuple[tuple[str, ...], ...],
             fix: str, source: str) -> Finding:
    return Finding("policy_violation", text, evidence=evidence, clause=clause,
                   suggested_fix=fix, source=source)


def _reservation_rules(ctx: Ctx) -> list[Finding]:
    name, kwargs = ctx.action.name, ctx.action.kwargs
    rid = kwargs.get("reservation_id")
    found = latest_record(ctx.visible, "reservation_id", rid, _RESERVATION_TOOLS)
    if found is None:
        return [_finding(
            f"Reservation {rid!r} was not looked up before {name}; the agent must check the "
            "reservation against the rules because the API does not.",
            [], (("must make sure the rules apply",),),
            f"Call get_reservation_details for {rid!r} first.", "reservation_unchecked",
        )]
    res, record = found
    now = _now(ctx.visible.policy)
    flights = [f for f in res.get("flights") or [] if isinstance(f, dict)]
    if name == "cancel_reservation":
        if now is not None and any(str(f.get("date", "9999")) < now.date().isoformat() for f in flights):
            return [_finding(
                "A segment of this reservation has already been flown; only a trip that is not "
                "flown can be cancelled.",
                field_evidence(record, "date", min(str(f.get("date")) for f in flights)),
                (("whole trip that is not flown",),),
                "Transfer the user to a human agent instead.", "flown",
            )]
        created = res.get("created_at")
        recent = False
        if now is not None and isinstance(created, str):
            try:
                recent = now - datetime.fromisoformat(created) <= timedelta(hours=24)
            except ValueError:
                recent = False
        if not (recent or res.get("cabin") == "business" or res.get("insurance") == "yes"):
            return [_finding(
                "This reservation was booked more than 24 hours ago, is not business class and "
                "has no travel insurance, so the policy does not allow cancelling it.",
                field_evidence(record, "cabin", res.get("cabin"))
                + field_evidence(record, "insurance", res.get("insurance")),
                (("can be cancelled within 24 hours",), ("cancelled within 24 hours",)),
                "Explain to the user that this reservation cannot be cancelled.", "cancel_rule",
            )]
    if name == "update_reservation_flights" and _cabin(ctx, rid, res) == "basic_economy":
        old = {(f.get("flight_number"), f.get("date")) for f in flights}
        new = {(f.get("flight_number"), f.get("date")) for f in kwargs.get("flights") or [] if isinstance(f, dict)}
        if old != new:
            return [_finding(
                "The reservation is basic economy, and basic economy flights cannot be modified.",
                field_evidence(record, "cabin", "basic_economy"),
                (("basic economy flights cannot be modified",),),
                "Offer a cabin change without changing the flights, or explain the rule.",
                "basic_economy",
            )]
    if name == "update_reservation_baggages":
        current, total = res.get("total_baggages"), kwargs.get("total_baggages")
        if isinstance(current, int) and isinstance(total, int) and total < current:
            return [_finding(
                f"The reservation has {current} checked bags; bags can be added but not removed.",
                field_evidence(record, "total_baggages", current),
                (("add but not remove checked bags",),),
                "Keep the total at least the current number of bags.", "remove_bags",
            )]
    if name == "update_reservation_passengers":
        new_count = len(kwargs.get("passengers") or [])
        if new_count != len(res.get("passengers") or []):
            return [_finding(
                "The number of passengers of a reservation cannot be changed.",
                field_evidence(record, "passengers", res.get("passengers")),
                (("cannot modify the number of passengers",),),
                "Keep the same number of passengers.", "passenger_count",
            )]
    return []


def _cabin(ctx: Ctx, rid: Any, res: dict[str, Any]) -> Any:
    """The reservation's cabin: the latest cabin change the agent made (the API's output keeps the
    old cabin), else the record's."""
    for record in reversed(ctx.visible.calls("update_reservation_flights", ok=True)):
        if record.kwargs.get("reservation_id") == rid and isinstance(record.kwargs.get("cabin"), str):
            return record.kwargs["cabin"]
    return res.get("cabin")


def _booking_rules(ctx: Ctx, payments: list[Any]) -> list[Finding]:
    kwargs = ctx.action.kwargs
    if len(kwargs.get("passengers") or []) > 5:
        return [_finding("A reservation can have at most five passengers.", [],
                         (("at most five passengers",),), "Split the booking.", "passengers")]
    kinds = [str(p).split("_")[0] for p in payments if isinstance(p, str)]
    if kinds.count("certificate") > 1 or kinds.count("credit") > 1 or kinds.count("gift") > 3:
        return [_finding(
            "A reservation can use at most one travel certificate, one credit card and three "
            "gift cards.", [], (("at most one travel certificate",),),
            "Use fewer payment methods of that kind.", "payment_mix",
        )]
    for leg in kwargs.get("flights") or []:
        if not isinstance(leg, dict):
            continue
        number = leg.get("flight_number")
        for record in reversed(ctx.visible.calls("search_direct_flight", "search_onestop_flight", ok=True)):
            text = record.output or ""
            pos = text.find(f'"flight_number": "{number}"')
            if pos < 0 or leg.get("date") != record.kwargs.get("date"):
                continue
            status = re.search(r'"status": "([^"]+)"', text[pos:])
            if status and status.group(1) != "available":
                return [_finding(
                    f"Flight {number} is shown as {status.group(1)!r}; only available flights "
                    "can be booked.", [Evidence(record.output_index, status.group())],
                    (("cannot be booked",),), "Choose a flight shown as available.", "unavailable",
                )]
            break
    return []


def _certificate_rules(ctx: Ctx, user: tuple[dict[str, Any], Any] | None) -> list[Finding]:
    complaint = user_said(ctx.visible, _COMPLAINT)
    if complaint is None:
        return [_finding(
            "The user has not complained and asked for compensation; the policy says not to "
            "offer certificates proactively.", [], (("proactively offer",),),
            "Do not send a certificate unless the user asks for compensation.", "proactive",
        )]
    if user is not None and user[0].get("membership") == "regular":
        reservations = [
            latest_record(ctx.visible, "reservation_id", r, _RESERVATION_TOOLS)
            for r in user[0].get("reservations") or []
        ]
        eligible = any(
            r and (r[0].get("insurance") == "yes" or r[0].get("cabin") == "business")
            for r in reservations
        )
        if not eligible:
            return [_finding(
                "The user is a regular member and no reservation shown has travel insurance or "
                "business class, so no compensation is allowed.",
                field_evidence(user[1], "membership", "regular"),
                (("do not compensate",),),
                "Do not send a certificate; explain the policy.", "certificate_rule",
            )]
    return []
