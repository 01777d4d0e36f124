"""Retail policy (tau-bench ``wiki.md`` and the generated store's policy) as visible rules.

* authenticate by ``find_user_id_by_email`` or ``find_user_id_by_name_zip`` before touching the
  user's profile or orders, even when the user gives the user id; one user per conversation;
* consequential actions (cancel, modify, return, exchange, address change) need the details
  listed and an explicit yes;
* the order's status must have been checked and allow the action: cancel and modify only
  ``pending``, return and exchange only ``delivered``;
* cancel reasons: "no longer needed" or "ordered by mistake";
* modify items and exchange: once per order; each new item an *available* variant of the *same*
  product; a payment method must belong to the user;
* modify payment: a different method than the original; a gift card must cover the total;
* return: the refund goes to the original payment method or a gift card.
"""

from __future__ import annotations

from typing import Any

from cast_rl.critique.context import Visible
from cast_rl.critique.rationale import Evidence
from cast_rl.critique.rules.base import Ctx, DomainRules, Finding
from cast_rl.critique.rules.state import field_evidence, latest_record, parse_json

CANCEL_REASONS = ("no longer needed", "ordered by mistake")
_NEEDS_STATUS = {
    "cancel_pending_order": "pending",
    "modify_pending_order_address": "pending",
    "modify_pending_order_items": "pending",
    "modify_pending_order_payment": "pending",
    "return_delivered_order_items": "delivered",
    "exchange_delivered_order_items": "delivered",
}
_ORDER_OUTPUT_TOOLS = ("get_order_details", *_NEEDS_STATUS)
_STATUS_CLAUSE = (("cancelled if its status", "pending"), ("modified if its status",),
                  ("check its status",), ("check the status",), ("only pending",))


class RetailRules(DomainRules):
    name = "retail"
    subject_arg = "user_id"
    auth_tools = ("find_user_id_by_email", "find_user_id_by_name_zip")
    public_tools = frozenset(
        {"think", "calculate", "get_product_details", "list_all_product_types"}
    )
    write_tools = frozenset({*_NEEDS_STATUS, "modify_user_address"})
    terminate_tools = frozenset({"transfer_to_human_agents"})
    confirm_keys = {
        "cancel_pending_order": ("order_id", "reason"),
        "modify_pending_order_address": ("order_id",),
        "modify_pending_order_items": ("order_id",),
        "modify_pending_order_payment": ("order_id",),
        "return_delivered_order_items": ("order_id",),
        "exchange_delivered_order_items": ("order_id",),
        "modify_user_address": ("address1",),
    }
    once_per_record = {
        "modify_pending_order_items": "order_id",
        "exchange_delivered_order_items": "order_id",
    }
    free_text = {
        "think": frozenset({"thought"}),
        "calculate": frozenset({"expression"}),
        "transfer_to_human_agents": frozenset({"summary"}),
    }
    auth_clause = (("authenticate", "identity"), ("authenticate",))
    one_user_clause = (("one user per conversation",), ("one customer per conversation",),
                       ("only the authenticated",))

    def record_owner(self, ctx: Ctx, arg: str, value: Any) -> tuple[str, Evidence] | None:
        if arg == "order_id":
            found = latest_record(ctx.visible, "order_id", value, _ORDER_OUTPUT_TOOLS)
            if found and isinstance(found[0].get("user_id"), str):
                owner = found[0]["user_id"]
                return owner, (field_evidence(found[1], "user_id", owner) or [Evidence(None, "")])[0]
        return None

    def check(self, ctx: Ctx) -> list[Finding]:
        name, kwargs, visible = ctx.action.name, ctx.action.kwargs, ctx.visible
        out: list[Finding] = []
        user = _user_details(visible, self)
        if name in _NEEDS_STATUS:
            out += _status(ctx, _NEEDS_STATUS[name])
        if name == "cancel_pending_order" and kwargs.get("reason") not in CANCEL_REASONS:
            out.append(Finding(
                "policy_violation",
                f"The cancellation reason {kwargs.get('reason')!r} is not one the policy allows "
                "('no longer needed' or 'ordered by mistake').",
                clause=(("no longer needed",),),
                suggested_fix="Ask the user which of the two allowed reasons applies.",
                source="cancel_reason",
            ))
        pay = kwargs.get("payment_method_id")
        if isinstance(pay, str) and user is not None:
            methods = user[0].get("payment_methods") or {}
            if pay not in methods:
                out.append(Finding(
                    "policy_violation",
                    f"The payment method {pay!r} is not among the authenticated user's payment "
                    "methods listed in their profile.",
                    evidence=ctx.evidence(pay),
                    clause=(("payment method",),),
                    suggested_fix="Use one of the payment methods in the user's profile.",
                    source="payment_owner",
                ))
        order = latest_record(visible, "order_id", kwargs.get("order_id"), _ORDER_OUTPUT_TOOLS)
        if order is not None and isinstance(pay, str):
            history = order[0].get("payment_history") or [{}]
            original = history[0].get("payment_method_id")
            if name == "modify_pending_order_payment" and pay == original:
                out.append(Finding(
                    "policy_violation",
                    f"{pay!r} is already the order's payment method; the new method must differ.",
                    evidence=field_evidence(order[1], "payment_method_id", pay),
                    clause=(("different from the original",), ("must differ",)),
                    suggested_fix="Ask the user for a different payment method.",
                    source="same_payment",
                ))
            if name == "return_delivered_order_items" and pay != original and "gift_card" not in pay:
                out.append(Finding(
                    "policy_violation",
                    f"The refund must go to the original payment method ({original!r}) or an "
                    f"existing gift card, not to {pay!r}.",
                    evidence=field_evidence(order[1], "payment_method_id", original),
                    clause=(("refund must either go",), ("original payment method or an existing gift card",),
                            ("where the refund goes",)),
                    suggested_fix="Refund to the original payment method or a gift card.",
                    source="refund_method",
                ))
            if name == "modify_pending_order_payment" and user is not None and "gift_card" in pay:
                balance = ((user[0].get("payment_methods") or {}).get(pay) or {}).get("balance")
                total = sum(p.get("amount", 0) for p in history if p.get("transaction_type") == "payment")
                if isinstance(balance, (int, float)) and balance < total:
                    out.append(Finding(
                        "policy_violation",
                        f"The gift card balance ({balance}) does not cover the order total.",
                        evidence=field_evidence(user[1], "balance", balance),
                        clause=(("enough balance",), ("must cover",)),
                        suggested_fix="Choose a payment method that covers the whole total.",
                        source="gift_card_balance",
                    ))
        if name in ("modify_pending_order_items", "exchange_delivered_order_items") and order:
            out += _variants(ctx, order[0])
        return out


def _user_details(visible: Visible, rules: RetailRules) -> tuple[dict[str, Any], Any] | None:
    auth = rules.authenticated(visible)
    if auth is None:
        return None
    for record in reversed(visible.calls("get_user_details", ok=True)):
        if record.kwargs.get("user_id") == auth[0]:
            parsed = parse_json(record.output)
            if isinstance(parsed, dict):
                return parsed, record
    return None


def _status(ctx: Ctx, needed: str) -> list[Finding]:
    order_id = ctx.action.kwargs.get("order_id")
    found = latest_record(ctx.visible, "order_id", order_id, _ORDER_OUTPUT_TOOLS)
    if found is None:
        return [Finding(
            "policy_violation",
            f"The status of order {order_id!r} was never checked before {ctx.action.name}; the "
            "policy asks to check it first.",
            clause=_STATUS_CLAUSE,
            suggested_fix=f"Call get_order_details for {order_id!r} and check it is {needed}.",
            source="status_unchecked",
        )]
    status = found[0].get("status")
    if status == needed:
        return []
    return [Finding(
        "policy_violation",
        f"Order {order_id!r} is shown as {status!r}; {ctx.action.name} is only allowed for "
        f"{needed} orders.",
        evidence=field_evidence(found[1], "status", status),
        clause=_STATUS_CLAUSE,
        suggested_fix=f"Do not call {ctx.action.name} on this order; tell the user why it cannot "
        "be done.",
        source="status",
    )]


def _variants(ctx: Ctx, order: dict[str, Any]) -> list[Finding]:
    """New items: an available variant of the same product, as the visible catalogue shows."""
    kwargs = ctx.action.kwargs
    old_ids, new_ids = kwargs.get("item_ids"), kwargs.get("new_item_ids")
    if not isinstance(old_ids, list) or not isinstance(new_ids, list):
        return []
    items = {i.get("item_id"): i for i in order.get("items") or [] if isinstance(i, dict)}
    for old, new in zip(old_ids, new_ids):
        item = items.get(old)
        if item is None or not isinstance(new, str):
            continue
        product = latest_record(ctx.visible, "product_id", item.get("product_id"), ("get_product_details",))
        if product is None:
            continue
        variants = product[0].get("variants") or {}
        if new in variants:
            if variants[new].get("available") is False:
                return [Finding(
                    "policy_violation",
                    f"Item {new!r} is shown as not available; only available items can be chosen.",
                    evidence=field_evidence(product[1], "item_id", new),
                    clause=(("available new item",), ("another available variant",)),
                    suggested_fix="Offer the user one of the available variants instead.",
                    source="unavailable_item",
                )]
            continue
        for record in ctx.visible.calls("get_product_details", ok=True):
            if f'"{new}"' in (record.output or "") and record is not product[1]:
                return [Finding(
                    "policy_violation",
                    f"Item {new!r} belongs to a different product than {old!r}; the product type "
                    "cannot change.",
                    evidence=ctx.evidence(new),
                    clause=(("change of product types",), ("same product",)),
                    suggested_fix="Choose a variant of the same product.",
                    source="product_type",
                )]
    return []
