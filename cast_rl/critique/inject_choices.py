"""How injections choose their faulty action: another record, another argument value.

Privileged helpers of :mod:`cast_rl.critique.inject`: they read the database to find a write
that the state allows (so the only fault is the one injected), that changes something, and that
no gold write of the task would make.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from cast_rl.critique.context import is_error
from cast_rl.critique.gold import ConversationBuilder
from cast_rl.critique.labeller import changes, same_effect
from cast_rl.envs.core import call_tool
from cast_rl.envs.types import Action

AIRLINE_NOW = datetime(2024, 5, 15, 15)
"""The airline policy's "current time"."""


def airline_blocked(res: dict[str, Any], now: datetime) -> bool:
    created = datetime.fromisoformat(res["created_at"])
    flown = any(f["date"] < now.date().isoformat() for f in res["flights"])
    return (not flown and res["cabin"] != "business" and res["insurance"] != "yes"
            and now - created > timedelta(hours=24))


def alternatives(builder: ConversationBuilder, action: Action) -> list[Action]:
    """The same write on another of the customer's records that the state allows."""
    db, uid, kw = builder.env.db, builder.task.user_id, action.kwargs
    out: list[Action] = []
    if action.name in ("cancel_pending_order", "modify_pending_order_address"):
        for oid in db["users"].get(uid, {}).get("orders", []):
            if oid != kw.get("order_id") and db["orders"][oid]["status"] == "pending":
                out.append(Action(action.name, {**kw, "order_id": oid}))
    elif action.name == "cancel_reservation":
        now = AIRLINE_NOW
        for rid in db["users"].get(uid, {}).get("reservations", []):
            res = db["reservations"][rid]
            if rid != kw.get("reservation_id") and not airline_blocked(res, now) and res.get("status") != "cancelled" \
                    and not any(f["date"] < "2024-05-15" for f in res["flights"]):
                out.append(Action(action.name, {"reservation_id": rid}))
    elif action.name in ("cancel_appointment",):
        for aid, appt in db["appointments"].items():
            if aid != kw.get("appointment_id") and appt.get("patient_id") == uid \
                    and appt.get("status") in ("scheduled", "pending_approval"):
                out.append(Action(action.name, {"appointment_id": aid}))
    elif action.name == "manage_service" and kw.get("action") == "remove":
        for sid in db["customers"].get(uid, {}).get("services", []):
            if sid != kw.get("service_id"):
                out.append(Action(action.name, {**kw, "service_id": sid}))
    gold = [a for a in builder.task.actions if a.name == action.name]
    return [a for a in out if differs(builder, a, gold)]


def differs(builder: ConversationBuilder, action: Action, gold: list[Action]) -> bool:
    """Whether the write succeeds, changes something and does what no gold write does."""
    db = builder.env.db
    trial = db.fork()
    if is_error(call_tool(builder.data, trial, action)):
        return False
    effect = changes(db, trial)
    if not effect:
        return False
    for write in gold:
        other = db.fork()
        call_tool(builder.data, other, write)
        if same_effect(effect, changes(db, other)):
            return False
    return True


def variants(builder: ConversationBuilder, action: Action) -> list[Action]:
    """The same write with one argument changed to another value the user could have meant."""
    db, uid, kw, name = builder.env.db, builder.task.user_id, action.kwargs, action.name
    out: list[dict[str, Any]] = []
    if name == "cancel_pending_order":
        out.append({"reason": "ordered by mistake" if kw.get("reason") == "no longer needed"
                    else "no longer needed"})
    elif name == "modify_pending_order_payment" and kw.get("order_id") in db["orders"]:
        order = db["orders"][kw["order_id"]]
        original = order["payment_history"][0]["payment_method_id"]
        total = sum(p["amount"] for p in order["payment_history"] if p["transaction_type"] == "payment")
        for pid, method in db["users"][uid]["payment_methods"].items():
            if pid not in (original, kw.get("payment_method_id")) and method.get("balance", total) >= total:
                out.append({"payment_method_id": pid})
    elif name == "return_delivered_order_items" and len(kw.get("item_ids") or []) > 1:
        out.append({"item_ids": kw["item_ids"][:-1]})
    elif name in ("exchange_delivered_order_items", "modify_pending_order_items") and kw.get("order_id") in db["orders"]:
        items = {i["item_id"]: i for i in db["orders"][kw["order_id"]]["items"]}
        old, new = kw["item_ids"][0], kw["new_item_ids"][0]
        if old in items:
            variants = db["products"][items[old]["product_id"]]["variants"]
            for vid, variant in variants.items():
                if vid not in (old, new) and variant["available"]:
                    out.append({"new_item_ids": [vid] + list(kw["new_item_ids"][1:])})
    elif name == "update_reservation_baggages":
        out.append({"total_baggages": kw["total_baggages"] + 1, "nonfree_baggages": kw["nonfree_baggages"] + 1})
    elif name == "create_support_ticket":
        out += [{"priority": p} for p in ("low", "medium", "high", "urgent") if p != kw.get("priority")]
    elif name == "manage_billing":
        out.append({"paperless": not kw.get("paperless")})
    elif name in ("schedule_appointment", "reschedule_appointment"):
        day_key, time_key = ("date", "time") if name == "schedule_appointment" else ("new_date", "new_time")
        provider = kw.get("provider_id") or db["appointments"].get(kw.get("appointment_id"), {}).get("provider_id")
        if provider in db["providers"]:
            weekday = datetime.fromisoformat(kw[day_key]).strftime("%A").lower()
            times = db["providers"][provider]["schedule"].get(weekday, [])
            out += [{time_key: t} for t in times if t != kw.get(time_key)]
    candidates = [Action(name, {**kw, **change}) for change in out]
    return [v for v in candidates if differs(builder, v, [a for a in builder.task.actions if a.name == name])]
