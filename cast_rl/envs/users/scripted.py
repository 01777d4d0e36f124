"""A deterministic, rule-based customer (no language model) for all four domains.

:class:`ScriptedUser` wants what the task's gold *write* actions do, asked for one at a time in
gold order (:mod:`cast_rl.envs.users.goals`), plus the task's required outputs as a question.
What it says comes from what a customer knows: its own record, revealed only as far as the
instruction states it (retail: name and zip code always, the email only if the instruction
states it or the gold authentication uses it, an order id only if the instruction states it;
other domains: :func:`~cast_rl.envs.users.goals.identity_line`), and its requests in its own
words (retail: order, items by name and options, payment method by description; other domains:
the action and the values it wants).  On a wrong proposal it restates its request in those words.

It learns that a write happened by looking at the database, not at the agent's words: ``reset``
receives the episode's live :class:`~cast_rl.envs.db.Database` and every turn re-reads it, and
``observe_db(db)`` points the user at another database object (an episode that forks or swaps
its state calls it).  A retail request counts as done when its record shows the write's effect
(status, cancel reason, address, new payment, return or exchange items); another domain's when
the records the gold write changes hold their gold values.  A gold write that changes nothing
(it fails in the source) is *vacuous*: settled once the agent proposes it and the user agrees,
or the agent says it cannot be done.  A required output counts as heard when an agent message
contains it (the reward's own rule).

Rules for each agent message, first match wins:

1. every non-vacuous request done and every output heard -> ``###STOP###`` (a task without
   either stops at the first reply); more than ``max_turns`` agent messages, the agent gives up
   or transfers ("transfer you", "human agent", "cannot help", ...), or (impatient trait) the
   user's patience runs out -> ``###STOP###``;
2. a request finished since the last turn and another remains -> thanks and the next request;
   only outputs remain -> thanks and the question the instruction asks;
3. identity questions ("email", "zip", "your name", "verify", "identity", "authenticate") that
   name no order id, item id, address line or other request value: "email" -> the email if
   known, otherwise the identity line (retail: name and zip code);
4. a confirmation question ("confirm", "proceed", "yes/no", "shall I", ...) that names an order
   id, item id, request value or an action ("cancel", "return", "exchange", ...) -> "Yes, please
   go ahead." when it matches a pending request: every expected detail appears (retail: order
   id; reason; address line and zip; each item by id or name and each new variant by id or
   changed option values; payment method by id or description; other domains: every value of
   the write's arguments) and (retail) no other order id, item id (item writes) or
   payment-method id does; otherwise "No, ..." plus the current request's details;
5. detail questions: retail: "reason" -> the cancel reason; "address" -> the new address;
   "payment", "pay", "refund", "card", "method" -> the payment method; "order id"/"order
   number"/"which order" -> the order id, or the order's products when the id is unknown;
   "item", "which", "option", "variant" -> the item changes; other domains: each argument named
   in the question ("date", "flight number", ...) -> its value;
6. anything else -> the current request restated with all its details.

A :class:`~cast_rl.envs.users.traits.Trait` (tau-trait's impatience, confusion, skepticism,
incoherence) then reshapes replies; ``events`` records which rule and trait shaped each one.
Randomness (traits only) comes from ``seed``; :meth:`ScriptedUser.fork` copies the whole state.
"""

from __future__ import annotations

import copy
import dataclasses
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cast_rl.envs.db import Database
from cast_rl.envs.domain import get_domain
from cast_rl.envs.retail_tasks import (
    REASON_TEXT,
    describe_address,
    describe_item,
    describe_options,
    describe_payment,
)
from cast_rl.envs.types import STOP_TOKEN, Task
from cast_rl.envs.users.goals import (
    Request,
    domain_of,
    effect_seen,
    generic_request,
    gold_effects,
    identity_line,
    information_request,
)
from cast_rl.envs.users.traits import Trait

WRITE_TOOLS = (
    "cancel_pending_order", "modify_pending_order_address", "modify_pending_order_items",
    "modify_pending_order_payment", "modify_user_address", "return_delivered_order_items",
    "exchange_delivered_order_items",
)
_GIVE_UP = (
    "transfer you", "transferring you", "human agent", "cannot help", "can't help",
    "unable to help",
)
_IDENTITY = (
    "email", "zip", "your name", "full name", "verify", "identity", "authenticat", "user id",
    "customer id", "patient id", "date of birth", "phone number",
)
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
class _Goal(Request):
    """A retail write with retail wording, and how to check the agent's proposal of it."""

    allowed_ids: set[str] = field(default_factory=set)
    payment_id: str | None = None
    reason: str = ""
    address: str = ""
    payment: str = ""
    order_ref: str = ""
    items: str = ""
    address_line: str = ""


class ScriptedUser:
    """Rule-based customer for every domain; see the module docstring for its rules."""

    def __init__(self, max_turns: int = 20, trait: Trait | None = None, seed: int = 0) -> None:
        self.max_turns = max_turns
        self.trait = trait or Trait()
        self.seed = seed
        self._rng = random.Random(seed)
        self._db: Mapping[str, Any] = {}
        self._goals: list[Request] = []
        self._outputs: dict[str, bool] = {}
        self._introduced = 0
        self._turns = 0
        self._progress_turn = 0
        self._asked_info = False
        self._stopped = False
        self.events: list[str] = []
        """What shaped each reply (rule and trait), one entry per reply: for tests and reports."""

    def observe_db(self, db: Mapping[str, Any]) -> None:
        """Read the episode's state from ``db`` from now on (after a fork or a state swap)."""
        self._db = db

    def fork(self) -> ScriptedUser:
        """An independent copy of this user's state (goals, turn counters, random state) that
        reads the same database until :meth:`observe_db` points it at the branch's own."""
        child = copy.copy(self)
        child._rng = random.Random()
        child._rng.setstate(self._rng.getstate())
        child._goals = [dataclasses.replace(goal) for goal in self._goals]
        child._outputs = dict(self._outputs)
        child.events = list(self.events)
        return child

    @property
    def stopped(self) -> bool:
        return self._stopped

    async def reset(self, task: Task, db: Mapping[str, Any]) -> str:
        self._db = db
        self._rng = random.Random(self.seed)
        self._turns = self._progress_turn = 0
        self._stopped = self._asked_info = False
        self.events = []
        self._domain = domain_of(db)
        self._name, self._identity, self._email = identity_line(self._domain, db, task)
        if self._domain == "retail":
            user = db["users"][task.user_id]
            self._zip = user["address"]["zip"]
            by_email = any(a.name == "find_user_id_by_email" for a in task.actions)
            self._email = f"My email is {user['email']}." if by_email or user["email"] in task.instruction else ""
            self._identity = f"My name is {self._name} and my zip code is {self._zip}."
        writes = get_domain(self._domain).write_tools
        effects = gold_effects(self._domain, db, task) if isinstance(db, Database) else None
        self._goals = []
        for i, action in enumerate(a for a in task.actions if a.name in writes):
            goal = self._request(db, task, action.name, dict(action.kwargs))
            goal.effect = effects[i] if effects is not None else None
            self._goals.append(goal)
        self._outputs = {out: False for out in task.outputs}
        self._info = information_request(task.instruction)
        self._introduced = 1
        if self._goals:
            opening = f"Hi! {self._goals[0].ask}"
        elif self._outputs:
            opening, self._asked_info = f"Hi! {self._info}", True
        else:
            opening = "Hi! I have a question about my account."
        return self._shape("open", opening)

    def _request(self, db: Mapping[str, Any], task: Task, name: str, kwargs: dict[str, Any]) -> Request:
        if self._domain == "retail" and name in WRITE_TOOLS:
            try:
                return _build_goal(db, task, name, kwargs)
            except (KeyError, TypeError):  # a gold write naming records that do not exist
                pass
        return generic_request(name, kwargs, task.user_id)

    async def step(self, agent_message: str) -> str:
        reply = self._reply(agent_message)
        if STOP_TOKEN in reply:
            self._stopped = True
        return reply

    # ------------------------------------------------------------------ state

    def _observe(self, agent_message: str) -> bool:
        """Mark requests seen done and outputs heard; whether anything new happened."""
        new = False
        said = agent_message.lower().replace(",", "")
        for out, heard in self._outputs.items():
            if not heard and out.lower() in said:
                self._outputs[out] = new = True
        for goal in self._goals:  # in order: a later request may undo an earlier one's record
            if goal.done or _vacuous(goal):
                continue
            if not self._seen(goal):
                break
            goal.done = new = True
        return new

    def _seen(self, goal: Request) -> bool:
        if isinstance(goal, _Goal):
            return _goal_done(self._db, goal)
        return goal.effect is not None and effect_seen(self._db, goal.effect)

    def _finished(self) -> bool:
        return all(g.done or _vacuous(g) for g in self._goals) and all(self._outputs.values())

    def _current(self) -> int:
        """Index of the request being pursued (len(goals): only information is missing)."""
        for i, goal in enumerate(self._goals):
            if not goal.done:
                return i
        return len(self._goals)

    # ------------------------------------------------------------------ replies

    def _reply(self, agent_message: str) -> str:
        self._turns += 1
        agent_message = agent_message.replace('\\"', '"')  # quotes escaped inside JSON details
        text = agent_message.lower()
        if self._observe(agent_message):
            self._progress_turn = self._turns
        if self._finished() or self._turns > self.max_turns:
            return self._say("stop", STOP_TOKEN)
        if any(word in text for word in _GIVE_UP):
            return self._say("stop", STOP_TOKEN)
        if self.trait.gives_up(self._turns):
            return self._say("trait:impatience gives up", STOP_TOKEN)
        current = self._current()
        if current < len(self._goals) and _vacuous(self._goals[current]) and any(w in text for w in _REFUSAL):
            self._goals[current].done = True  # the agent explains it cannot be done: accept that
            current = self._current()
        if current == len(self._goals):
            if not self._asked_info:
                self._asked_info = True
                return self._shape("next", f"Thank you! {self._info}")
            return self._shape("restate", self._info)
        goal = self._goals[current]
        if current >= self._introduced:
            self._introduced = current + 1
            return self._shape("next", f"Thank you! {goal.ask}")
        names_detail = bool(
            _ORDER_ID.search(text) or _TEN_DIGITS.search(text)
            or (isinstance(goal, _Goal) and goal.address_line and goal.address_line.lower() in text)
        )
        if any(w in text for w in _IDENTITY) and not names_detail and not _names_fact(goal, text):
            if "email" in text and self._email:
                return self._shape("identity", self._email)
            return self._shape("identity", self._identity)
        if any(w in text for w in _CONFIRM) and (
            names_detail or any(w in text for w in _ACTION_WORDS) or _names_fact(goal, text)
            or goal.name in text or _humanize_name(goal.name) in text
        ):
            match = next((g for g in self._goals[current:] if not g.done and _proposal_matches(g, agent_message)), None)
            if match is None:
                return self._shape("refuse", f"No, that is not what I want. {goal.details}")
            reply = self._shape("confirm", "Yes, please go ahead.")
            if reply.startswith("Yes") and _vacuous(match):
                match.done = True  # nothing to see afterwards: agreeing settles it
            return reply
        answer = _detail_answer(goal, text)
        return self._shape("detail" if answer else "restate", answer or goal.details)

    def _shape(self, kind: str, reply: str) -> str:
        shaped, note = self.trait.shape(kind, reply, self._rng)
        self.events.append(f"{kind}{' ' + note if note else ''}")
        return shaped

    def _say(self, kind: str, reply: str) -> str:
        self.events.append(kind)
        return reply


_REFUSAL = ("cannot", "can't", "unable", "not possible", "not able", "not eligible")


def _humanize_name(name: str) -> str:
    return name.replace("_", " ")


def _vacuous(goal: Request) -> bool:
    """The gold write changes nothing (it fails in the source): nothing to wait for."""
    return goal.effect is not None and not goal.effect


def _names_fact(goal: Request, text: str) -> bool:
    """Whether the message names one of the request's distinctive values (ids, codes, dates)."""
    return any(_mentions(text, alt.lower()) for alts in goal.facts for alt in alts if len(alt) >= 4)


def _detail_answer(goal: Request, text: str) -> str:
    if isinstance(goal, _Goal):
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
        return ""
    return " ".join(answer for key, answer in goal.answers.items() if key in text)


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
    goal = _Goal(name, kwargs, "", "", facts, allowed_ids={digits}, order_ref=answer)
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


def _proposal_matches(goal: Request, message: str) -> bool:
    """Every expected detail is named and (retail) no other order, item or payment-method id is."""
    text = message.lower()
    for alternatives in goal.facts:
        if not any(_mentions(text, alt.lower()) for alt in alternatives):
            return False
    if not isinstance(goal, _Goal):
        return True
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
