"""Telecom policy (tau-trait ``wiki.md``) as visible rules.

* the customer is identified before their account, billing, services or tickets are touched: by
  ``find_customer_by_email`` or ``find_customer_by_phone``, or by giving their customer id (the
  policy asks for no lookup, only that a customer id found by email or phone is read back, and
  the benchmark's own gold actions read a customer id the user gave directly); one customer per
  conversation;
* changes (services added or removed, devices, billing settings, payments, tickets) need the
  actions listed and the customer's explicit confirmation; ``manage_service`` with ``list`` is a
  read;
* no more than one support ticket for the same issue;
* removing a service the customer does not have, or adding devices that are not the customer's.
"""

from __future__ import annotations

from typing import Any

from cast_rl.critique.context import ActionRef
from cast_rl.critique.rationale import Evidence
from cast_rl.critique.rules.base import Ctx, DomainRules, Finding
from cast_rl.critique.rules.state import field_evidence, latest_record, parse_json


class TelecomRules(DomainRules):
    name = "telecom"
    subject_arg = "customer_id"
    auth_tools = ("find_customer_by_email", "find_customer_by_phone")
    stated_id_identifies = True
    public_tools = frozenset({
        "think", "calculate", "get_services", "get_service_details", "get_senior_discount",
        "get_device_details", "troubleshoot_device",
    })
    write_tools = frozenset({
        "manage_service", "create_support_ticket", "add_device", "manage_billing",
        "modify_support_ticket", "record_payment",
    })
    terminate_tools = frozenset({"transfer_to_human_support"})
    confirm_keys = {
        "manage_service": ("service_id",),
        "create_support_ticket": ("category",),
        "add_device": ("device_name",),
        "modify_support_ticket": ("ticket_id",),
        "record_payment": ("amount",),
    }
    free_text = {
        "think": frozenset({"thought"}),
        "calculate": frozenset({"expression"}),
        "troubleshoot_device": frozenset({"issue"}),
    }
    auth_clause = (("authenticating a user",), ("authenticat",))
    one_user_clause = (("deny user requests",),)
    confirm_clause = (("explicit confirmation",), ("confirmation",))

    def is_write(self, action: ActionRef) -> bool:
        if action.name == "manage_service":
            return action.kwargs.get("action") not in ("list", None)
        return action.name in self.write_tools

    def record_owner(self, ctx: Ctx, arg: str, value: Any) -> tuple[str, Evidence] | None:
        if arg == "ticket_id":
            found = latest_record(ctx.visible, "ticket_id", value, ("get_support_ticket_details",))
            if found and isinstance(found[0].get("customer_id"), str):
                owner = found[0]["customer_id"]
                return owner, (field_evidence(found[1], "customer_id", owner) or [Evidence(None, "")])[0]
        return None

    def check(self, ctx: Ctx) -> list[Finding]:
        name, kwargs = ctx.action.name, ctx.action.kwargs
        if name == "create_support_ticket":
            earlier = [
                r for r in ctx.visible.calls("create_support_ticket", ok=True)
                if r.kwargs.get("customer_id") == kwargs.get("customer_id")
                and r.kwargs.get("category") == kwargs.get("category")
            ]
            if earlier:
                return [Finding(
                    "policy_violation",
                    f"A {kwargs.get('category')!r} support ticket was already created for this "
                    "customer in this conversation; the policy forbids a second ticket for the "
                    "same issue.",
                    evidence=[Evidence(earlier[0].output_index, (earlier[0].output or "")[:120])],
                    clause=(("more than one support ticket",),),
                    suggested_fix="Refer to the existing ticket instead of creating another.",
                    source="duplicate_ticket",
                )]
        if name == "manage_service" and kwargs.get("action") == "remove":
            services = _customer_services(ctx)
            sid = kwargs.get("service_id")
            if services is not None and sid not in services[0]:
                return [Finding(
                    "policy_violation",
                    f"The customer's services shown do not include {sid!r}, so it cannot be "
                    "removed.",
                    evidence=field_evidence(services[1], "services", services[0]),
                    clause=(("removing a service",),),
                    suggested_fix="Remove one of the services the customer actually has.",
                    source="service_absent",
                )]
        if name == "manage_service" and kwargs.get("action") == "add":
            services = _customer_services(ctx)
            sid = kwargs.get("service_id")
            if services is not None and sid in services[0]:
                return [Finding(
                    "policy_violation",
                    f"The customer's services shown already include {sid!r}.",
                    evidence=ctx.evidence(sid),
                    clause=(("adding a service",),),
                    suggested_fix="Do not add a service the customer already has.",
                    source="service_present",
                )]
            devices = _customer_devices(ctx)
            wanted = kwargs.get("devices_ids") or []
            if devices is not None and isinstance(wanted, list):
                foreign = [d for d in wanted if d not in devices[0]]
                if foreign:
                    return [Finding(
                        "policy_violation",
                        f"Device id {foreign[0]!r} is not among the customer's devices; only "
                        "the customer's own devices can be attached.",
                        clause=(("device ids can be found",),),
                        suggested_fix="Attach devices listed in the customer's details.",
                        source="foreign_device",
                    )]
        return []


def _customer(ctx: Ctx) -> tuple[dict[str, Any], Any] | None:
    cid = ctx.action.kwargs.get("customer_id")
    for record in reversed(ctx.visible.calls("get_customer_details", "manage_service", ok=True)):
        parsed = parse_json(record.output)
        if isinstance(parsed, dict) and parsed.get("customer_id") == cid and "services" in parsed:
            return parsed, record
    return None


def _customer_services(ctx: Ctx) -> tuple[list[str], Any] | None:
    found = _customer(ctx)
    if found is None:
        return None
    services = [s.get("service_id") if isinstance(s, dict) else s for s in found[0]["services"]]
    # services added or removed since the lookup change the list
    for record in ctx.visible.calls("manage_service", ok=True):
        if record.message_index > found[1].message_index:
            sid = record.kwargs.get("service_id")
            if record.kwargs.get("action") == "add":
                services.append(sid)
            elif record.kwargs.get("action") == "remove" and sid in services:
                services.remove(sid)
    return services, found[1]


def _customer_devices(ctx: Ctx) -> tuple[list[str], Any] | None:
    found = _customer(ctx)
    if found is None or "devices" not in found[0]:
        return None
    devices = [str(d.get("device_id")) for d in found[0]["devices"] if isinstance(d, dict)]
    added = [r for r in ctx.visible.calls("add_device", ok=True) if r.message_index > found[1].message_index]
    devices += [str(len(devices) + i + 1) for i in range(len(added))]
    return devices, found[1]
