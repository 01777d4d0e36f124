"""Task kinds of the procedural retail generator, and how retail facts are phrased in words.

A task is one user with one or two requests.  Its gold actions are: the authentication lookup
(``find_user_id_by_email`` or ``find_user_id_by_name_zip``), ``get_user_details`` when a request
needs the user's payment methods or order list, then for each request the reads the policy asks
for (``get_order_details`` to check the status, ``get_product_details`` for each product whose
variant changes) and its write.  Kinds: cancel, modify_items, modify_address, modify_payment,
return, exchange, user_address, and multi (two different kinds, user_address last).

Every write is valid on the freshly generated database, and a :class:`_Plan` keeps the tasks of
one generation from interfering: no order is the target of two requests (of one task or of two
tasks) while unused orders remain, a user whose default address (and so zip code) changes is not
used again, and gift-card spending is booked so that replaying all tasks in order on one database
makes no write fail.  Only when the database runs out of unused orders (far more tasks than
users) are orders reused; each task still replays to reward 1 on its own.

The ``describe_*`` helpers phrase items, options, payment methods and addresses; the scripted user
(:mod:`cast_rl.envs.users.scripted`) uses the same words as the instructions.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cast_rl.config.schema import RETAIL_AUTH_CHOICES, RETAIL_TASK_KINDS
from cast_rl.envs.retail_catalogue import CITIES, STREETS
from cast_rl.envs.types import Action, Task

logger = logging.getLogger(__name__)

KINDS = RETAIL_TASK_KINDS
SINGLE_KINDS = KINDS[:-1]
ANNOTATOR = "synthetic"
REASON_TEXT = {
    "no longer needed": "you no longer need it",
    "ordered by mistake": "you ordered it by mistake",
}
_SWAP_TOOLS = {
    "pending": "modify_pending_order_items",
    "delivered": "exchange_delivered_order_items",
}
_MARGIN = 0.01  # gift-card headroom: the item tools compare the balance with an unrounded sum


def describe_options(options: dict[str, str]) -> str:
    return ", ".join(f"{key} {value}" for key, value in options.items())


def describe_item(item: dict[str, Any]) -> str:
    """``T-Shirt (color black, size M)`` for an order item."""
    return f"{item['name']} ({describe_options(item['options'])})"


def describe_payment(method: dict[str, Any]) -> str:
    if method["source"] == "credit_card":
        return f"{method['brand']} credit card ending in {method['last_four']}"
    if method["source"] == "paypal":
        return "PayPal account"
    return "gift card"


def describe_address(address: dict[str, str]) -> str:
    return (
        f"{address['address1']}, {address['address2']}, {address['city']}, "
        f"{address['state']} {address['zip']}, {address['country']}"
    )


def address_kwargs(address: dict[str, str]) -> dict[str, str]:
    """Address fields in the order of the address tools' keyword arguments."""
    keys = ("address1", "address2", "city", "state", "country", "zip")
    return {key: address[key] for key in keys}


def order_reference(db: dict[str, Any], order_id: str, knows_id: bool) -> str:
    if knows_id:
        return f"order {order_id}"
    names = [item["name"] for item in db["orders"][order_id]["items"]]
    listed = " and ".join(f"the {name}" for name in names)
    return f"your order containing {listed} (you do not know its order id)"


@dataclass(frozen=True)
class Request:
    """One request of a task: its reads, its write and its sentence in the instruction."""

    reads: tuple[Action, ...]
    write: Action
    text: str
    needs_user_details: bool
    orders: tuple[str, ...] = ()
    gift_spend: tuple[tuple[str, float], ...] = ()
    closes_user: bool = False


@dataclass(frozen=True)
class _Plan:
    """What earlier requests of this generation have claimed."""

    used_orders: frozenset[str] = frozenset()
    closed_users: frozenset[str] = frozenset()
    spent: dict[str, float] = field(default_factory=dict)
    unknown_id_rate: float = 0.3
    """Chance that the user does not know an order's id (when its items identify it)."""

    def balance(self, db: dict[str, Any], user_id: str, method_id: str) -> float:
        method = db["users"][user_id]["payment_methods"][method_id]
        return method["balance"] - self.spent.get(method_id, 0.0)

    def after(self, request: Request, user_id: str) -> _Plan:
        spent = dict(self.spent)
        for method_id, amount in request.gift_spend:
            spent[method_id] = spent.get(method_id, 0.0) + amount
        closed = self.closed_users | ({user_id} if request.closes_user else set())
        return _Plan(self.used_orders | set(request.orders), frozenset(closed), spent, self.unknown_id_rate)


def _candidate_orders(
    rng: random.Random, db: dict[str, Any], plan: _Plan, user_id: str, status: str
) -> list[str]:
    found = [
        oid for oid in db["users"][user_id]["orders"]
        if db["orders"][oid]["status"] == status and oid not in plan.used_orders
    ]
    rng.shuffle(found)
    return found


def _order_reads(
    rng: random.Random, db: dict[str, Any], plan: _Plan, user_id: str, order_id: str
) -> tuple[tuple[Action, ...], bool, str]:
    """Reads that find and check the order, whether they need the user's details, and its name."""
    order_ids = db["users"][user_id]["orders"]
    names = {item["name"] for item in db["orders"][order_id]["items"]}
    unique = all(
        not names <= {item["name"] for item in db["orders"][other]["items"]}
        for other in order_ids if other != order_id
    )
    if unique and rng.random() < plan.unknown_id_rate:
        searched = order_ids[: order_ids.index(order_id) + 1]
        reads = tuple(Action("get_order_details", {"order_id": oid}) for oid in searched)
        return reads, True, order_reference(db, order_id, knows_id=False)
    reads = (Action("get_order_details", {"order_id": order_id}),)
    return reads, False, order_reference(db, order_id, knows_id=True)


def _cancel(rng: random.Random, db: dict[str, Any], plan: _Plan, user_id: str) -> Request | None:
    for order_id in _candidate_orders(rng, db, plan, user_id, "pending"):
        reads, needs_user, ref = _order_reads(rng, db, plan, user_id, order_id)
        reason = rng.choice(sorted(REASON_TEXT))
        write = Action("cancel_pending_order", {"order_id": order_id, "reason": reason})
        text = f"You want to cancel {ref} because {REASON_TEXT[reason]}."
        return Request(reads, write, text, needs_user, (order_id,))
    return None


def random_address(rng: random.Random) -> dict[str, str]:
    """A fresh US address with the benchmark's key order."""
    city, state, zip_prefix = rng.choice(CITIES)
    unit = rng.choice(("Suite", "Apt"))
    return {
        "address1": f"{rng.randint(10, 999)} {rng.choice(STREETS)}",
        "address2": f"{unit} {rng.randint(100, 999)}",
        "city": city,
        "country": "USA",
        "state": state,
        "zip": f"{zip_prefix}{rng.randint(0, 99):02d}",
    }


def _new_address(rng: random.Random, current: dict[str, str]) -> dict[str, str]:
    while True:
        address = random_address(rng)
        if address != current:
            return address


def _modify_address(
    rng: random.Random, db: dict[str, Any], plan: _Plan, user_id: str
) -> Request | None:
    for order_id in _candidate_orders(rng, db, plan, user_id, "pending"):
        reads, needs_user, ref = _order_reads(rng, db, plan, user_id, order_id)
        address = _new_address(rng, db["orders"][order_id]["address"])
        write = Action(
            "modify_pending_order_address", {"order_id": order_id, **address_kwargs(address)}
        )
        text = f"You want {ref} to be shipped to {describe_address(address)} instead."
        return Request(reads, write, text, needs_user, (order_id,))
    return None


def _modify_payment(
    rng: random.Random, db: dict[str, Any], plan: _Plan, user_id: str
) -> Request | None:
    methods = db["users"][user_id]["payment_methods"]
    for order_id in _candidate_orders(rng, db, plan, user_id, "pending"):
        payment = db["orders"][order_id]["payment_history"][0]
        options = [
            mid for mid, m in methods.items()
            if mid != payment["payment_method_id"]
            and (m["source"] != "gift_card" or plan.balance(db, user_id, mid) >= payment["amount"])
        ]
        if not options:
            continue
        method_id = rng.choice(options)
        reads, _, ref = _order_reads(rng, db, plan, user_id, order_id)
        write = Action(
            "modify_pending_order_payment", {"order_id": order_id, "payment_method_id": method_id}
        )
        method = methods[method_id]
        text = f"You want to pay for {ref} with your {describe_payment(method)} instead."
        spend = ((method_id, payment["amount"]),) if method["source"] == "gift_card" else ()
        return Request(reads, write, text, True, (order_id,), spend)
    return None


def _swap_items(
    rng: random.Random, db: dict[str, Any], plan: _Plan, user_id: str, status: str
) -> Request | None:
    """Shared by modify_items (pending) and exchange (delivered)."""
    methods = db["users"][user_id]["payment_methods"]
    for order_id in _candidate_orders(rng, db, plan, user_id, status):
        items = db["orders"][order_id]["items"]
        chosen = rng.sample(items, rng.randint(1, min(2, len(items))))
        changes, new_ids, diff = [], [], 0.0
        for item in chosen:
            variants = db["products"][item["product_id"]]["variants"]
            others = [v for v in variants if v != item["item_id"] and variants[v]["available"]]
            new_id = rng.choice(others)
            new_ids.append(new_id)
            diff += variants[new_id]["price"] - item["price"]
            changes.append(
                f"the {describe_item(item)} for the one with "
                f"{describe_options(variants[new_id]['options'])}"
            )
        options = [
            mid for mid, m in methods.items()
            if m["source"] != "gift_card" or plan.balance(db, user_id, mid) >= diff + _MARGIN
        ]
        if not options:
            continue
        method_id = rng.choice(options)
        reads, _, ref = _order_reads(rng, db, plan, user_id, order_id)
        reads += tuple(
            Action("get_product_details", {"product_id": item["product_id"]}) for item in chosen
        )
        write = Action(_SWAP_TOOLS[status], {
            "order_id": order_id,
            "item_ids": [item["item_id"] for item in chosen],
            "new_item_ids": new_ids,
            "payment_method_id": method_id,
        })
        text = (
            f"In {ref}, you want to exchange {' and '.join(changes)}. Any price difference should "
            f"be settled with your {describe_payment(methods[method_id])}."
        )
        spend = ()
        if status == "pending" and methods[method_id]["source"] == "gift_card":
            spend = ((method_id, max(diff, 0.0)),)
        return Request(reads, write, text, True, (order_id,), spend)
    return None


def _return(rng: random.Random, db: dict[str, Any], plan: _Plan, user_id: str) -> Request | None:
    methods = db["users"][user_id]["payment_methods"]
    gift_cards = [mid for mid, m in methods.items() if m["source"] == "gift_card"]
    for order_id in _candidate_orders(rng, db, plan, user_id, "delivered"):
        order = db["orders"][order_id]
        original = order["payment_history"][0]["payment_method_id"]
        method_id = original
        if gift_cards and rng.random() < 0.4:
            method_id = gift_cards[0]
        items = rng.sample(order["items"], rng.randint(1, min(2, len(order["items"]))))
        reads, needs_user, ref = _order_reads(rng, db, plan, user_id, order_id)
        write = Action("return_delivered_order_items", {
            "order_id": order_id,
            "item_ids": [item["item_id"] for item in items],
            "payment_method_id": method_id,
        })
        listed = " and the ".join(describe_item(item) for item in items)
        text = (
            f"You want to return the {listed} from {ref}. The refund should go to your "
            f"{describe_payment(methods[method_id])}."
        )
        return Request(reads, write, text, needs_user or method_id != original, (order_id,))
    return None


def _user_address(
    rng: random.Random, db: dict[str, Any], plan: _Plan, user_id: str
) -> Request | None:
    address = _new_address(rng, db["users"][user_id]["address"])
    write = Action("modify_user_address", {"user_id": user_id, **address_kwargs(address)})
    text = f"You have moved and want your default address changed to {describe_address(address)}."
    return Request((), write, text, True, closes_user=True)


_BUILDERS: dict[str, Callable[..., Request | None]] = {
    "cancel": _cancel,
    "modify_items": lambda rng, db, plan, uid: _swap_items(rng, db, plan, uid, "pending"),
    "modify_address": _modify_address,
    "modify_payment": _modify_payment,
    "return": _return,
    "exchange": lambda rng, db, plan, uid: _swap_items(rng, db, plan, uid, "delivered"),
    "user_address": _user_address,
}


def _requests_for(
    rng: random.Random, db: dict[str, Any], plan: _Plan, user_id: str, kinds: list[str]
) -> list[Request] | None:
    requests = []
    for kind in kinds:
        request = _BUILDERS[kind](rng, db, plan, user_id)
        if request is None:
            return None
        requests.append(request)
        plan = plan.after(request, user_id)
    return requests


def _assemble(db: dict[str, Any], user_id: str, requests: list[Request], by_email: bool) -> Task:
    user = db["users"][user_id]
    first, last = user["name"]["first_name"], user["name"]["last_name"]
    zip_code = user["address"]["zip"]
    if by_email:
        auth = Action("find_user_id_by_email", {"email": user["email"]})
    else:
        auth = Action(
            "find_user_id_by_name_zip", {"first_name": first, "last_name": last, "zip": zip_code}
        )
    actions = [auth]
    if any(r.needs_user_details for r in requests):
        actions.append(Action("get_user_details", {"user_id": user_id}))
    for request in requests:
        actions.extend(request.reads)
        actions.append(request.write)
    intro = f"You are {first} {last} in {zip_code}."
    if by_email:
        intro += f" Your email is {user['email']}."
    closing = (
        "When the agent lists the exact details of a change and asks you to confirm, say yes if "
        "they match what you want and no otherwise."
    )
    instruction = " ".join([intro, *(r.text for r in requests), closing])
    return Task(user_id, instruction, tuple(actions), annotator=ANNOTATOR)


def _kinds_of(rng: random.Random, kind: str, allowed: tuple[str, ...] = KINDS) -> list[str]:
    if kind != "multi":
        return [kind]
    singles = [k for k in SINGLE_KINDS if k in allowed]
    pair = rng.sample(singles if len(singles) >= 2 else SINGLE_KINDS, 2)
    return sorted(pair, key=lambda k: k == "user_address")  # a zip change comes last


def _find(
    rng: random.Random, db: dict[str, Any], plan: _Plan, wanted: str, allowed: tuple[str, ...] = KINDS
) -> tuple[str, list[Request]] | None:
    """A user and requests for ``wanted``, or for the next feasible kind of ``allowed``."""
    for kind in [wanted] + [k for k in allowed if k != wanted]:
        kinds = _kinds_of(rng, kind, allowed)
        users = list(db["users"])
        rng.shuffle(users)
        for user_id in users:
            if user_id in plan.closed_users:
                continue
            requests = _requests_for(rng, db, plan, user_id, kinds)
            if requests is not None:
                return user_id, requests
    return None


def build_tasks(
    rng: random.Random, db: dict[str, Any], num_tasks: int, kinds: tuple[str, ...] = KINDS,
    unknown_id_rate: float = 0.3, auth: str = "either",
) -> list[Task]:
    """``num_tasks`` tasks cycling through ``kinds`` (shuffled within each cycle).

    ``auth`` is how users identify themselves: ``either`` (email or name and zip, half each),
    ``email`` or ``name_zip`` (the same draws are made, so only the identification differs).

    With a subset of :data:`KINDS`, every task is of one of those kinds (``multi`` pairs two of
    the chosen single kinds).  ``unknown_id_rate`` is the chance that the user describes an order
    by its items instead of its id (the agent must then search the user's orders).
    """
    if auth not in RETAIL_AUTH_CHOICES:
        raise ValueError(f"auth={auth!r} is not allowed; choose one of {list(RETAIL_AUTH_CHOICES)}")
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or not kinds:
        raise ValueError(f"task kinds {list(kinds)} are not allowed; choose from {list(KINDS)}")
    schedule: list[str] = []
    while len(schedule) < num_tasks:
        cycle = list(kinds)
        rng.shuffle(cycle)
        schedule.extend(cycle)
    plan = _Plan(unknown_id_rate=unknown_id_rate)
    tasks = []
    reused = 0
    for wanted in schedule[:num_tasks]:
        found = _find(rng, db, plan, wanted, kinds)
        if found is None:  # out of unused orders: plan this task against the fresh database
            found = _find(rng, db, _Plan(unknown_id_rate=unknown_id_rate), wanted, kinds)
            reused += 1
        assert found is not None, "a generated database always allows some request"
        user_id, requests = found
        for request in requests:
            plan = plan.after(request, user_id)
        by_email = rng.random() < 0.5
        tasks.append(_assemble(db, user_id, requests, by_email=by_email if auth == "either" else auth == "email"))
    if reused:
        logger.info("%d of %d tasks reuse orders of earlier tasks", reused, num_tasks)
    return tasks
