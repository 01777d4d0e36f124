"""Procedural retail data: a tau-bench-shaped database, tasks with gold actions, policy, tools.

Run::

    cast-rl env generate env.generated_seed=0 env.generated_tasks=64 --out runs/data/retail

It writes ``OUT/db/{orders,products,users}.json`` in the tau-bench retail schema (same keys, key
order and value types), ``OUT/tasks_train.json`` and ``OUT/tasks_test.json`` (every fifth task is
a test task), ``OUT/policy.md`` and ``OUT/tools.json``.  Nothing is read from disk: the product
catalogue and name lists are embedded (:mod:`cast_rl.envs.retail_catalogue`) and combined by a
seeded ``random.Random``, so the same seed and task count give the same bytes.

Size: ``clamp(num_tasks, 20, 60)`` users (compact setting: ``clamp(num_tasks, 20, 400)``) with 2-5 orders each, 20 product types with 4-8
variants each.  Task kinds and gold actions are built in :mod:`cast_rl.envs.retail_tasks`.
"""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path
from typing import Any

from cast_rl.envs.retail_catalogue import (
    CARD_BRANDS,
    FIRST_NAMES,
    LAST_NAMES,
    POLICY,
    PRODUCTS,
    tool_schemas,
)
from cast_rl.envs.retail_tasks import KINDS, build_tasks, random_address
from cast_rl.envs.types import Task

_STATUS_WEIGHTS = (("pending", 0.42), ("delivered", 0.36), ("processed", 0.11), ("cancelled", 0.11))
TEST_EVERY = 5
"""Task ``i`` goes to the test split when ``i % TEST_EVERY == TEST_EVERY - 1`` (an 80/20 split)."""


class _Ids:
    """Unique random digit strings (product, item, order, payment and tracking ids)."""

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng
        self._seen: set[str] = set()

    def digits(self, n: int) -> str:
        while True:
            value = "".join(self._rng.choice("0123456789") for _ in range(n))
            if value[0] != "0" and value not in self._seen:
                self._seen.add(value)
                return value


def _products(rng: random.Random, ids: _Ids) -> dict[str, dict[str, Any]]:
    products: dict[str, dict[str, Any]] = {}
    for name, low, high, options in PRODUCTS:
        combos = list(itertools.product(*options.values()))
        chosen = rng.sample(combos, rng.randint(4, min(8, len(combos))))
        available = [rng.random() < 0.8 for _ in chosen]
        for i in range(3):  # at least three available variants, so every item has alternatives
            available[i] = True
        rng.shuffle(available)
        variants: dict[str, dict[str, Any]] = {}
        for combo, is_available in zip(chosen, available, strict=True):
            item_id = ids.digits(10)
            variants[item_id] = {
                "item_id": item_id,
                "options": dict(zip(options, combo, strict=True)),
                "available": is_available,
                "price": round(rng.uniform(low, high), 2),
            }
        product_id = ids.digits(10)
        products[product_id] = {"name": name, "product_id": product_id, "variants": variants}
    return products


def _payment_methods(rng: random.Random, ids: _Ids) -> dict[str, dict[str, Any]]:
    sources = [s for s in ("credit_card", "paypal", "gift_card") if rng.random() < 0.6]
    if not sources:
        sources = [rng.choice(("credit_card", "paypal", "gift_card"))]
    rng.shuffle(sources)
    methods: dict[str, dict[str, Any]] = {}
    for source in sources:
        method_id = f"{source}_{ids.digits(7)}"
        if source == "credit_card":
            methods[method_id] = {
                "source": source,
                "brand": rng.choice(CARD_BRANDS),
                "last_four": f"{rng.randint(0, 9999):04d}",
                "id": method_id,
            }
        elif source == "gift_card":
            methods[method_id] = {"source": source, "balance": rng.randint(0, 300), "id": method_id}
        else:
            methods[method_id] = {"source": source, "id": method_id}
    return methods


def _order(
    rng: random.Random,
    ids: _Ids,
    user_id: str,
    user: dict[str, Any],
    products: dict[str, dict[str, Any]],
) -> dict[str, Any]:
    order_id = f"#W{ids.digits(7)}"
    items = []
    for product_id in rng.sample(list(products), rng.randint(1, 4)):
        product = products[product_id]
        variant = product["variants"][rng.choice(list(product["variants"]))]
        items.append({
            "name": product["name"],
            "product_id": product_id,
            "item_id": variant["item_id"],
            "price": variant["price"],
            "options": dict(variant["options"]),
        })
    statuses, weights = zip(*_STATUS_WEIGHTS, strict=True)
    status = rng.choices(statuses, weights)[0]
    payment_id = rng.choice(list(user["payment_methods"]))
    amount = round(sum(item["price"] for item in items), 2)
    history = [{"transaction_type": "payment", "amount": amount, "payment_method_id": payment_id}]
    if status == "cancelled":
        history.append(
            {"transaction_type": "refund", "amount": amount, "payment_method_id": payment_id}
        )
    fulfillments = []
    if status != "pending":
        fulfillments.append({
            "tracking_id": [ids.digits(12)],
            "item_ids": [item["item_id"] for item in items],
        })
    address = dict(user["address"]) if rng.random() < 0.85 else random_address(rng)
    return {
        "order_id": order_id,
        "user_id": user_id,
        "address": address,
        "items": items,
        "fulfillments": fulfillments,
        "status": status,
        "payment_history": history,
    }


def build_database(rng: random.Random, num_users: int) -> dict[str, dict[str, Any]]:
    """Tables keyed like the benchmark's files: ``orders``, ``products``, ``users``."""
    ids = _Ids(rng)
    products = _products(rng, ids)
    users: dict[str, dict[str, Any]] = {}
    orders: dict[str, dict[str, Any]] = {}
    names = rng.sample(list(itertools.product(FIRST_NAMES, LAST_NAMES)), num_users)
    for first, last in names:
        user_id = f"{first}_{last}_{ids.digits(4)}".lower()
        user: dict[str, Any] = {
            "name": {"first_name": first, "last_name": last},
            "address": random_address(rng),
            "email": f"{first}.{last}{ids.digits(4)}@example.com".lower(),
            "payment_methods": _payment_methods(rng, ids),
            "orders": [],
        }
        for _ in range(rng.randint(2, 5)):
            order = _order(rng, ids, user_id, user, products)
            orders[order["order_id"]] = order
            user["orders"].append(order["order_id"])
        users[user_id] = user
    return {"orders": orders, "products": products, "users": users}


def generate_retail(
    seed: int, num_tasks: int, kinds: tuple[str, ...] = KINDS, compact: bool = False, auth: str = "either",
) -> tuple[dict[str, dict[str, Any]], list[Task], str, list[dict[str, Any]]]:
    """Database, tasks, policy text and tool schemas for one seed (deterministic).

    ``kinds`` restricts the task kinds (:data:`~cast_rl.envs.retail_tasks.KINDS`).  ``compact``
    gives the compact setting: up to one user per task (400 at most), users always know their order ids (no searching through a
    user's orders), the policy keeps only the rules of those kinds (:func:`compact_policy`) and
    the tool list only the tools their gold actions call plus both authentication lookups, each
    described by its name and parameters only, in the benchmark's order.  Database, tool
    behaviour and reward are those of the full setting; only what the agent reads is shorter.
    ``auth`` is how users identify themselves (see :func:`~cast_rl.envs.retail_tasks.build_tasks`).
    """
    if num_tasks < 1:
        raise ValueError(f"num_tasks={num_tasks} is not allowed; it must be >= 1")
    rng = random.Random(seed)
    # The compact setting draws up to one user per task (400 at most), so a policy trained on
    # it meets many identities and must copy them from the conversation, not remember them.
    db = build_database(rng, num_users=min(400 if compact else 60, max(20, num_tasks)))
    tasks = build_tasks(rng, db, num_tasks, tuple(kinds), unknown_id_rate=0.0 if compact else 0.3,
                        auth=auth)
    if not compact:
        return db, tasks, POLICY, tool_schemas()
    used = {a.name for t in tasks for a in t.actions} | set(_AUTH_TOOLS)
    tools = [_bare(t) for t in tool_schemas() if t["function"]["name"] in used]
    return db, tasks, compact_policy(kinds), tools


def _bare(tool: dict[str, Any]) -> dict[str, Any]:
    """A tool schema without descriptions (names, types, enums and required keys stay)."""
    fn = tool["function"]
    params = fn["parameters"]
    props = {k: {f: v for f, v in p.items() if f != "description"} for k, p in params["properties"].items()}
    return {"type": "function", "function": {"name": fn["name"], "parameters": {**params, "properties": props}}}


_AUTH_TOOLS = ("find_user_id_by_email", "find_user_id_by_name_zip")
_KIND_BULLETS = {
    "cancel": ("- Cancel:",),
    "modify_address": ("- Change the shipping",),
    "modify_payment": ("- Change the shipping",),
    "modify_items": ("- Change items",),
    "return": ("- Return:",),
    "exchange": ("- Exchange:",),
    "user_address": (),
}


def compact_policy(kinds: tuple[str, ...]) -> str:
    """The policy cut down to the general rules and the bullets of ``kinds`` (same wording).

    Kept: the title, one line on whom the agent serves, the ``## Rules`` bullets except the
    transfer rule, the order-status bullet, and each kind's own bullet under its section
    heading.  Every kept sentence is the full policy's, so rule-based critiques quote it as they
    quote the full one.
    """
    bullets: dict[str, list[str]] = {}
    section = ""
    for line in POLICY.splitlines():
        if line.startswith("## "):
            section = line
        elif line.startswith("- "):
            bullets.setdefault(section, []).append(line)
        elif line.startswith("  ") and section in bullets:
            bullets[section][-1] += "\n" + line
    wanted = {p for k in kinds if k != "multi" for p in _KIND_BULLETS[k]}
    if "multi" in kinds:
        wanted |= {p for ps in _KIND_BULLETS.values() for p in ps}
    out = ["# Retail agent policy", "", "You help one customer per conversation.", "", "## Rules"]
    out += [b for b in bullets["## Rules"] if not b.startswith("- Transfer")]
    out += [b for b in bullets["## Store facts"] if b.startswith("- Order statuses")]
    for heading in ("## Pending orders", "## Delivered orders"):
        kept = [b for b in bullets[heading] if b.startswith(tuple(wanted))]
        if kept:
            out += ["", heading, *kept]
    return "\n".join(out) + "\n"


def split_tasks(tasks: list[Task]) -> tuple[list[Task], list[Task]]:
    """(train, test): every ``TEST_EVERY``-th task is a test task."""
    train = [t for i, t in enumerate(tasks) if i % TEST_EVERY != TEST_EVERY - 1]
    test = [t for i, t in enumerate(tasks) if i % TEST_EVERY == TEST_EVERY - 1]
    return train, test


def _dump(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2) + "\n", encoding="utf-8")


def write_retail(
    out: str | Path, seed: int, num_tasks: int, kinds: tuple[str, ...] = KINDS, compact: bool = False,
    auth: str = "either", split: str | None = None,
) -> dict[str, int]:
    """Generate and write a data directory; returns counts for a summary line.

    ``split`` names one split that gets every task (``tasks_<split>.json``), e.g. the
    ``unseen-<seed>`` split of a database only evaluation reads; None writes train and test.
    """
    out = Path(out)
    db, tasks, policy, tools = generate_retail(seed, num_tasks, kinds, compact, auth)
    (out / "db").mkdir(parents=True, exist_ok=True)
    for name, table in db.items():
        _dump(out / "db" / f"{name}.json", table)
    splits = {split: tasks} if split else dict(zip(("train", "test"), split_tasks(tasks), strict=True))
    for name, part in splits.items():
        _dump(out / f"tasks_{name}.json", [t.to_json() for t in part])
    (out / "policy.md").write_text(policy, encoding="utf-8")
    _dump(out / "tools.json", tools)
    counts = {"users": len(db["users"]), "orders": len(db["orders"]), "products": len(db["products"])}
    return {**counts, **{name: len(part) for name, part in splits.items()}}

