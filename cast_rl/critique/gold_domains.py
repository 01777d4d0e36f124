"""Per-domain knowledge the gold-trajectory constructor needs (privileged: it reads the database).

For each domain: how the customer proves who they are (the lookup and the words the user says),
which read calls can make a value visible (candidates for revealing an argument), and which reads
the policy asks for before an action (status checks, availability checks, payment methods).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from cast_rl.envs.db import Database
from cast_rl.envs.types import Action


def identity(domain: str, db: Database, user_id: str) -> tuple[Action, str] | None:
    """The authentication call for the task's customer and the user's words that supply it."""
    if domain == "retail" and user_id in db["users"]:
        email = db["users"][user_id]["email"]
        return Action("find_user_id_by_email", {"email": email}), f"Sure, my email is {email}."
    if domain == "airline":
        return Action("get_user_details", {"user_id": user_id}), f"My user id is {user_id}."
    if domain == "telecom" and user_id in db["customers"]:
        email = db["customers"][user_id]["demographics"]["email"]
        return Action("find_customer_by_email", {"email": email}), f"Sure, my email is {email}."
    if domain == "telehealth" and user_id in db["patients"]:
        email = db["patients"][user_id]["demographics"]["email"]
        return Action("find_patient_by_email", {"email": email}), f"Sure, my email is {email}."
    return None


def identities(domain: str, db: Database, user_id: str) -> dict[str, Action]:
    """Every way the policy lets the task's customer identify themselves: kind -> the call.

    The call's arguments are the values the user says (their email, name and zip code, phone,
    name and date of birth, or id where the policy accepts an id); in telecom a customer id the
    user gives is read directly (the benchmark's own gold actions do so).
    """
    out: dict[str, Action] = {}
    if domain == "retail" and user_id in db["users"]:
        user = db["users"][user_id]
        out["email"] = Action("find_user_id_by_email", {"email": user["email"]})
        out["name_zip"] = Action("find_user_id_by_name_zip", {
            "first_name": user["name"]["first_name"], "last_name": user["name"]["last_name"],
            "zip": user["address"]["zip"],
        })
    elif domain == "airline" and user_id in db["users"]:
        out["user_id"] = Action("get_user_details", {"user_id": user_id})
    elif domain == "telecom" and user_id in db["customers"]:
        demographics = db["customers"][user_id]["demographics"]
        out["email"] = Action("find_customer_by_email", {"email": demographics["email"]})
        out["phone"] = Action("find_customer_by_phone", {"phone": demographics["phone"]})
        out["customer_id"] = Action("get_customer_details", {"customer_id": user_id})
    elif domain == "telehealth" and user_id in db["patients"]:
        patient = db["patients"][user_id]
        out["email"] = Action("find_patient_by_email", {"email": patient["demographics"]["email"]})
        out["name_dob"] = Action("find_patient_by_name_dob", {
            "first_name": patient["name"]["first_name"], "last_name": patient["name"]["last_name"],
            "date_of_birth": patient["demographics"]["date_of_birth"],
        })
    return out


def stated_identities(domain: str, db: Database, user_id: str) -> dict[str, dict[str, str]]:
    """Ids the policy lets the task's customer identify with by just stating them, no lookup:
    kind -> the values the user says.

    Airline asks the agent to "first obtain the user id" (a profile lookup is not required);
    telecom asks for no lookup when the customer gives their customer id.  Retail and
    telehealth demand the lookup "even when the user already provides" the id: none there.
    """
    if domain == "airline" and user_id in db["users"]:
        return {"user_id": {"user_id": user_id}}
    if domain == "telecom" and user_id in db["customers"]:
        return {"customer_id": {"customer_id": user_id}}
    return {}


def candidate_reads(domain: str, db: Database, user_id: str, value: Any) -> Iterator[Action]:
    """Read calls that might show ``value`` (tried in order on a fork until one does)."""
    text = str(value)
    if domain == "retail":
        user = db["users"].get(user_id) or {}
        yield Action("get_user_details", {"user_id": user_id})
        for order_id in user.get("orders", []):
            yield Action("get_order_details", {"order_id": order_id})
        for product_id, product in db["products"].items():
            if text in product.get("variants", {}) or text == product_id:
                yield Action("get_product_details", {"product_id": product_id})
        yield Action("list_all_product_types", {})
    elif domain == "airline":
        user = db["users"].get(user_id) or {}
        yield Action("get_user_details", {"user_id": user_id})
        for rid in user.get("reservations", []):
            yield Action("get_reservation_details", {"reservation_id": rid})
        yield Action("list_all_airports", {})
        flight = db["flights"].get(text)
        if flight is not None:
            for day in sorted(flight.get("dates", {})):
                yield Action("search_direct_flight", {
                    "origin": flight["origin"], "destination": flight["destination"], "date": day,
                })
    elif domain == "telecom":
        yield Action("get_customer_details", {"customer_id": user_id})
        yield Action("get_billing_details", {"customer_id": user_id})
        yield Action("get_services", {})
        for ticket_id, ticket in db["support_tickets"].items():
            if ticket.get("customer_id") == user_id:
                yield Action("get_support_ticket_details", {"ticket_id": ticket_id})
    elif domain == "telehealth":
        yield Action("get_patient_details", {"patient_id": user_id})
        yield Action("list_patient_appointments", {"patient_id": user_id})
        yield Action("list_patient_medical_records", {"patient_id": user_id, "limit": 50})
        specialties = sorted({p.get("specialty", "") for p in db["providers"].values()})
        for specialty in specialties:
            yield Action("list_available_providers", {"specialty": specialty})
        if text in db["appointments"]:
            yield Action("get_appointment_details", {"appointment_id": text})
        if text in db["medical_records"]:
            yield Action("get_medical_record", {"record_id": text})


def required_reads(domain: str, db: Database, user_id: str, action: Action) -> list[Action]:
    """Reads the policy asks for right before ``action`` (status and availability checks)."""
    kw = action.kwargs
    out: list[Action] = []
    if domain == "retail":
        order = db["orders"].get(kw.get("order_id")) if isinstance(kw.get("order_id"), str) else None
        if "payment_method_id" in kw:
            out.append(Action("get_user_details", {"user_id": user_id}))
        if order is not None:
            out.append(Action("get_order_details", {"order_id": kw["order_id"]}))
            items = {i["item_id"]: i for i in order.get("items", [])}
            products = []
            for item_id in kw.get("item_ids") or []:
                if item_id in items and items[item_id]["product_id"] not in products:
                    products.append(items[item_id]["product_id"])
            if "new_item_ids" in kw:
                out += [Action("get_product_details", {"product_id": p}) for p in products]
    elif domain == "airline":
        if action.name in ("send_certificate", "book_reservation") or "payment_id" in kw:
            out.append(Action("get_user_details", {"user_id": user_id}))
        rid = kw.get("reservation_id")
        if isinstance(rid, str) and rid in db["reservations"]:
            out.append(Action("get_reservation_details", {"reservation_id": rid}))
        if action.name == "send_certificate":
            for other in (db["users"].get(user_id) or {}).get("reservations", []):
                out.append(Action("get_reservation_details", {"reservation_id": other}))
        if action.name == "book_reservation":
            for leg in kw.get("flights") or []:
                flight = db["flights"].get(leg.get("flight_number")) if isinstance(leg, dict) else None
                if flight is not None:
                    out.append(Action("search_direct_flight", {
                        "origin": flight["origin"], "destination": flight["destination"],
                        "date": leg.get("date"),
                    }))
    elif domain == "telehealth":
        aid = kw.get("appointment_id")
        if action.name in ("cancel_appointment", "reschedule_appointment") and isinstance(aid, str):
            out.append(Action("get_appointment_details", {"appointment_id": aid}))
            appointment = db["appointments"].get(aid)
            if action.name == "reschedule_appointment" and appointment is not None:
                out.append(Action("get_provider_details", {"provider_id": appointment["provider_id"]}))
        if action.name == "schedule_appointment" and isinstance(kw.get("provider_id"), str):
            out.append(Action("get_provider_details", {"provider_id": kw["provider_id"]}))
    return out
