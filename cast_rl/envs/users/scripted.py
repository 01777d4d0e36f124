"""A deterministic, rule-based retail customer (no language model), for tests and the default.

:class:`ScriptedUser` reads what the customer wants from the task's gold *write* actions and the
database at reset (names, item options, payment methods), and what the customer knows from the
task: name and zip code always, the email only if the instruction states it (or the gold
authentication uses it), an order id only if the instruction states it.

It learns that a write happened by looking at the database, not at the agent's words: ``reset``
receives the episode's live :class:`~cast_rl.envs.db.Database` and every turn re-reads it, and
``observe_db(db)`` points the user at another database object (an episode that forks or swaps
its state calls it).  A request counts as done when its record shows the gold write's effect
(status, cancel reason, address, new payment, return or exchange items).

Rules for each agent message, first match wins:

1. every gold write done -> ``###STOP###`` (a task without writes stops at the first reply);
   more than ``max_turns`` agent messages, or the agent gives up or transfers ("transfer you",
   "human agent", "cannot help", ...) -> ``###STOP###``;
2. a request finished since the last turn and another remains -> thanks and the next request;
3. identity questions ("email", "zip", "your name", "verify", "identity", "authenticate") that
   name no order id, item id or the new address line: "email" -> the email if known, otherwise
   (and for the others) the name and zip code;
4. a confirmation question ("confirm", "proceed", "yes/no", "shall I", ...) that names an order
   id, item id, the new address line or an action ("cancel", "return", "exchange", ...) ->
   "Yes, please go ahead." when every expected detail of the current write appears (order id;
   reason; address line and zip; each item by id or name and each new variant by id or changed
   option values; payment method by id or description) and no other order id, no other item id
   (item writes) and no other payment-method id does; otherwise "No, ..." plus the correct
   details;
5. detail questions: "reason" -> the cancel reason; "address" -> the new address; "payment",
   "pay", "refund", "card", "method" -> the payment method; "order id"/"order number"/"which
   order" -> the order id, or the order's products when the id is unknown; "item", "which",
   "option", "variant" -> the item changes;
6. anything else -> the current request restated with all its details.

Requests are made one at a time, in gold order: the first message asks for the first write, and
the next is asked for only after the database shows the previous one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cast_rl.envs.retail_tasks import (
    REASON_TEXT,
    describe_address,
    describe_item,
    describe_options,
    describe_payment,
)
from cast_rl.envs.types import STOP_TOKEN, Task

WRITE_TOOLS = (
    "cancel_pending_order", "modify_pending_order_address", "modify_pending_order_items",
    "modify_pending_order_payment", "modify_user_address", "return_delivered_order_items",
    "exchange_delivered_order_items",
)
_GIVE_UP = (
    "transfer you", "transferring you", "human agent", "cannot help", "can't help",
    "unable to help",
)
_IDENTITY = ("email", "zip", "your name", "full name", "verify", "identity", "authenticat")
_CONFIRM = (
    "confirm", "proceed", "yes/no", "(yes", "shall i", "should i", "would you like me to",
    "do you want me to", "go ahead", "is that correct", "is this correct",
)
_ITEM_TOOLS = (
    "modify_pending_order_items", "return_delivered_order_items", "exchange_delivered_order_items",
)
_ACTION_WORDS = ("cancel", "return", "exchange", "modify", "change", "update", "refund")
_ORDER_ID = re.compile(r"#?w(\d{7})\b")
_TEN_DIGITS = re.compile(r"\b\d{10}\b")
_PAYMENT_ID = re.compile(r"\b(?:credit_card|paypal|gift_card)_\d+\b")


@dataclass
class _Goal:
    """One gold write: how to ask for it, its details and how to check the agent's proposal."""

    name: str
    kwargs: dict[str, Any]
    ask: str
    details: str
    facts: list[tuple[str, ...]]
    allowed_ids: set[str] = field(default_factory=set)
    payment_id: str | None = None
    reason: str = ""
    address: str = ""
    payment: str = ""
    order_ref: str = ""
    items: str = ""
    address_line: str = ""


class ScriptedUser:
    """Rule-based customer; see the module docstring for its rules."""

    def __init__(self, max_turns: int = 20) -> None:
        self.max_turns = max_turns
        self._db: Mapping[str, Any] = {}
        self._goals: list[_Goal] = []
        self._introduced = 0
        self._turns = 0
        self._stopped = False

    def observe_db(self, db: Mapping[str, Any]) -> None:
        """Read the episode's state from ``db`` from now on (after a fork or a state swap)."""
        self._db = db

    @property
    def stopped(self) -> bool:
        return self._stopped

    async def reset(self, task: Task, db: Mapping[str, Any]) -> str:
        self._db = db
        self._turns = 0
        self._stopped = False
        user = db["users"][task.user_id]
        self._name = f"{user['name']['first_name']} {user['name']['last_name']}"
        self._zip = user["address"]["zip"]
        by_email = any(a.name == "find_user_id_by_email" for a in task.actions)
        self._email = user["email"] if by_email or user["email"] in task.instruction else ""
        self._goals = [
            _build_goal(db, task, a.name, a.kwargs) for a in task.actions if a.name in WRITE_TOOLS
        ]
        self._introduced = 1
        if not self._goals:
            return "Hi! I have a question about my account."
        return f"Hi! {self._goals[0].ask}"

    async def step(self, agent_message: str) -> str:
        reply = self._reply(agent_message)
        if reply == STOP_TOKEN:
            self._stopped = True
        return reply

    def _current(self) -> int:
        for i, goal in enumerate(self._goals):
            if not _goal_done(self._db, goal):
                return i
        return len(self._goals)

    def _reply(self, agent_message: str) -> str:
        self._turns += 1
        current = self._current()
        text = agent_message.lower()
        if current == len(self._goals) or self._turns > self.max_turns:
            return STOP_TOKEN
        if any(word in text for word in _GIVE_UP):
            return STOP_TOKEN
        goal = self._goals[current]
        if current >= self._introduced:
            self._introduced = current + 1
            return f"Thank you! {goal.ask}"
        names_detail = bool(
            _ORDER_ID.search(text) or _TEN_DIGITS.search(text)
            or (goal.address_line and goal.address_line.lower() in text)
        )
        if any(w in text for w in _IDENTITY) and not names_detail:
            if "email" in text and self._email:
                return f"My email is {self._email}."
            return f"My name is {self._name} and my zip code is {self._zip}."
        if any(w in text for w in _CONFIRM) and (
            names_detail or any(w in text for w in _ACTION_WORDS)
        ):
            if _proposal_matches(goal, agent_message):
                return "Yes, please go ahead."
            return f"No, that is not what I want. {goal.details}"
        if "reason" in text and goal.reason:
            return goal.reason
        if "address" in text and goal.address:
            return goal.address
        if any(w in text for w in ("payment", "pay", "refund", "card", "method")) and goal.payment:
            return goal.payment
        if any(w in text for w in ("order id", "order number", "which order")) and goal.order_ref:
            return goal.order_ref
        if any(w in text for w in ("item", "which", "option", "variant")) and goal.items:
            return goal.items
        return goal.details


def _order_ref(db: Mapping[str, Any], order_id: str, instruction: str) -> tuple[str, str]:
    """(how the user names the order, the user's answer to "which order?")."""
    if order_id in instruction:
        return f"order {order_id}", f"It is order {order_id}."
    names = " and ".join(f"the {item['name']}" for item in db["orders"][order_id]["items"])
    return (
        f"my order with {names}",
        f"I don't have the order id, but it is the order with {names}.",
    )


def _payment_alternatives(method: dict[str, Any]) -> tuple[str, ...]:
    if method["source"] == "credit_card":
        return (method["id"], method["last_four"])
    return (method["id"], method["source"].replace("_", " "), method["source"])


def _build_goal(db: Mapping[str, Any], task: Task, name: str, kwargs: dict[str, Any]) -> _Goal:
    if name == "modify_user_address":
        address = describe_address(kwargs)
        ask = "I have moved and would like to update my default address."
        return _Goal(name, kwargs, ask, f"{ask} The new address is {address}.",
                     [(kwargs["address1"],), (kwargs["zip"],)],
                     address=f"My new address is {address}.", address_line=kwargs["address1"])
    order_id = kwargs["order_id"]
    order = db["orders"][order_id]
    ref, answer = _order_ref(db, order_id, task.instruction)
    facts: list[tuple[str, ...]] = [(order_id, order_id.lstrip("#"))]
    digits = order_id.lstrip("#").lower().lstrip("w")  # what _ORDER_ID captures
    goal = _Goal(name, kwargs, "", "", facts, {digits}, order_ref=answer)
    method = None
    if "payment_method_id" in kwargs:
        method = db["users"][order["user_id"]]["payment_methods"].get(kwargs["payment_method_id"])
    if method is not None:
        goal.payment_id = method["id"]
        goal.payment = f"Please use my {describe_payment(method)}."
        facts.append(_payment_alternatives(method))
    by_id = {item["item_id"]: item for item in order["items"]}
    if name == "cancel_pending_order":
        reason = kwargs["reason"]
        goal.ask = f"I'd like to cancel {ref}."
        goal.reason = f"Because {REASON_TEXT[reason].replace('you ', 'I ')}."
        goal.details = f"{goal.ask} {goal.reason}"
        facts.append((reason, "no longer need" if "longer" in reason else "mistake"))
    elif name == "modify_pending_order_address":
        address = describe_address(kwargs)
        goal.ask = f"I'd like to change the shipping address of {ref}."
        goal.address = f"Please ship it to {address}."
        goal.address_line = kwargs["address1"]
        goal.details = f"{goal.ask} {goal.address}"
        facts.extend([(kwargs["address1"],), (kwargs["zip"],)])
    elif name == "modify_pending_order_payment":
        goal.ask = f"I'd like to change the payment method of {ref}."
        goal.details = f"{goal.ask} {goal.payment}"
    elif name == "return_delivered_order_items":
        listed = " and the ".join(describe_item(by_id[i]) for i in kwargs["item_ids"])
        goal.ask = f"I'd like to return the {listed} from {ref}."
        goal.items = f"The {listed}."
        goal.payment = goal.payment.replace("use", "refund it to")
        goal.details = f"{goal.ask} {goal.payment}"
        facts.extend((i, by_id[i]["name"].lower()) for i in kwargs["item_ids"])
        goal.allowed_ids.update(kwargs["item_ids"])
        goal.allowed_ids.update(by_id[i]["product_id"] for i in kwargs["item_ids"])
    else:  # modify_pending_order_items or exchange_delivered_order_items
        changes = []
        for old_id, new_id in zip(kwargs["item_ids"], kwargs["new_item_ids"], strict=False):
            item = by_id[old_id]
            product = db["products"][item["product_id"]]
            new_options = product["variants"][new_id]["options"]
            changed = [v for k, v in new_options.items() if item["options"].get(k) != v]
            facts.append((old_id, item["name"].lower()))
            facts.append((new_id, " ".join(changed)))
            goal.allowed_ids.update({old_id, new_id, item["product_id"]})
            changes.append(
                f"the {describe_item(item)} for the one with {describe_options(new_options)}"
            )
        verb = "change" if name == "modify_pending_order_items" else "exchange"
        goal.items = f"I want to {verb} {' and '.join(changes)}."
        goal.ask = f"I'd like to {verb} some items in {ref}. {goal.items}"
        goal.details = f"{goal.ask} {goal.payment}"
    return goal


def _proposal_matches(goal: _Goal, message: str) -> bool:
    """Every expected detail is named and no other order, item or payment-method id is."""
    text = message.lower()
    for alternatives in goal.facts:
        if not any(_mentions(text, alt.lower()) for alt in alternatives):
            return False
    ids = _ORDER_ID.findall(text) if goal.name != "modify_user_address" else []
    if goal.name in _ITEM_TOOLS:
        ids += _TEN_DIGITS.findall(text)
    if any(found not in goal.allowed_ids for found in ids):
        return False
    if goal.payment_id is not None:
        return all(found == goal.payment_id for found in _PAYMENT_ID.findall(text))
    return True


def _mentions(text: str, phrase: str) -> bool:
    """All words of ``phrase`` occur in ``text`` (option values may be listed in any order)."""
    return all(word in text for word in phrase.split())


def _goal_done(db: Mapping[str, Any], goal: _Goal) -> bool:
    """Whether the database shows the effect of the goal's write."""
    kwargs = goal.kwargs
    address_keys = ("address1", "address2", "city", "state", "country", "zip")
    try:
        if goal.name == "modify_user_address":
            address = db["users"][kwargs["user_id"]]["address"]
            return all(address.get(k) == kwargs[k] for k in address_keys)
        order = db["orders"][kwargs["order_id"]]
        if goal.name == "cancel_pending_order":
            return order["status"] == "cancelled" and order.get("cancel_reason") == kwargs["reason"]
        if goal.name == "modify_pending_order_address":
            return all(order["address"].get(k) == kwargs[k] for k in address_keys)
        if goal.name == "modify_pending_order_payment":
            return any(
                p["transaction_type"] == "payment"
                and p["payment_method_id"] == kwargs["payment_method_id"]
                for p in order["payment_history"][1:]
            )
        if goal.name == "modify_pending_order_items":
            now = [item["item_id"] for item in order["items"]]
            return order["status"] == "pending (item modified)" and all(
                now.count(i) >= kwargs["new_item_ids"].count(i) for i in kwargs["new_item_ids"]
            )
        if goal.name == "return_delivered_order_items":
            return order["status"] == "return requested" and order.get("return_items") == sorted(
                kwargs["item_ids"]
            )
        return order["status"] == "exchange requested" and order.get(
            "exchange_new_items"
        ) == sorted(kwargs["new_item_ids"])
    except (KeyError, TypeError, AttributeError):
        return False
