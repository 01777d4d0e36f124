"""Differential and property tests of the retail tools against tau-bench's own tool code.

The source is extracted from the local tau-bench mirror (``git archive``) into a pytest tmp dir
at test time, never into the repo; its retail tool modules are imported one by one under their
real module names, so the package ``__init__`` files (which import litellm) never run.  Each
action sequence -- all 115 test-split gold sequences, seeded random perturbations of gold
sequences (wrong ids, wrong types, dropped/duplicated/swapped calls, cancel-then-modify, extra
and missing arguments) and hypothesis-drawn sequences -- runs through the source's dispatch rule
on a fresh source data dict and through ``call_tool`` on a fork, and every observation and the
final state must be equal.

Final state: records either side may have changed are compared in the source's canonical form
(``str(to_hashable(record))``, so ``5`` vs ``5.0`` counts); the full source hash is compared for
the gold sequences of a few tasks, and at the end of each test the shared pristine source data
and our pristine database must hash as at the start (no tool wrote to a record it did not own).

The property test needs no source: thousands of random calls (unknown names, missing, extra and
mistyped arguments, ids from the database and garbage, huge strings) never raise out of
``ToolEnv.step`` and never move the pristine database's hash.

Run: .venv/bin/python -m pytest tests/envs/test_fuzz_retail.py -q
"""

from __future__ import annotations

import copy
import importlib.util
import json
import random
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import upstream_sources
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cast_rl.envs.core import DomainData, ToolEnv, call_tool, load_domain_data
from cast_rl.envs.db import source_hash, to_hashable
from cast_rl.envs.types import Action

TOOLS_PACKAGE = "tau_bench.envs.retail.tools"
TABLES = ("orders", "products", "users")
PERTURBED_PER_TASK = 10
SEED = 20240601
Call = tuple[str, Any]

# -- the source, extracted and imported without its package __init__ files ----------------------


def _load_module(name: str, path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Source:
    """tau-bench's retail tools, its dispatch rule (``Env.step``) and pristine data."""

    def __init__(self, root: Path) -> None:
        tools_dir = root / "tau_bench" / "envs" / "retail" / "tools"
        with pytest.MonkeyPatch.context() as patch:
            for package in ("tau_bench", "tau_bench.envs", "tau_bench.envs.retail", TOOLS_PACKAGE):
                patch.setitem(sys.modules, package, types.ModuleType(package))
            tool = _load_module("tau_bench.envs.tool", root / "tau_bench" / "envs" / "tool.py")
            patch.setitem(sys.modules, "tau_bench.envs.tool", tool)
            modules = [
                _load_module(f"{TOOLS_PACKAGE}.{path.stem}", path)
                for path in sorted(tools_dir.glob("*.py"))
                if path.stem != "__init__"
            ]
        classes = [
            obj
            for module in modules
            for obj in vars(module).values()
            if isinstance(obj, type) and obj.__module__ == module.__name__
        ]
        self.tools_map = {cls.get_info()["function"]["name"]: cls for cls in classes}
        data_dir = root / "tau_bench" / "envs" / "retail" / "data"
        self.pristine = {
            name: json.loads((data_dir / f"{name}.json").read_text()) for name in TABLES
        }

    def fresh_data(self, calls: list[Call]) -> tuple[dict[str, Any], dict[str, set[str]]]:
        """Data for one run: records a call can reach are private deep copies, the rest shared.

        Source tools write only the named order, its owner and the named user; anything else
        they changed would change the shared pristine records, which each test checks.
        """
        orders, users = self.pristine["orders"], self.pristine["users"]
        named = {value for _, kwargs in calls for value in _scalars(kwargs)}
        order_ids = {key for key in named if key in orders}
        user_ids = {key for key in named if key in users}
        user_ids |= {orders[key]["user_id"] for key in order_ids}
        data = {
            "orders": {**orders, **{k: copy.deepcopy(orders[k]) for k in order_ids}},
            "products": self.pristine["products"],
            "users": {**users, **{k: copy.deepcopy(users[k]) for k in user_ids}},
        }
        return data, {"orders": order_ids, "products": set(), "users": user_ids}

    def step(self, data: dict[str, Any], name: str, kwargs: dict[str, Any]) -> str:
        """``Env.step`` for a tool call: the same dispatch and exception rule."""
        if name not in self.tools_map:
            return f"Unknown action {name}"
        try:
            return self.tools_map[name].invoke(data=data, **kwargs)
        except Exception as exc:
            return f"Error: {exc}"


def _scalars(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [s for v in value.values() for s in _scalars(v)]
    if isinstance(value, list):
        return [s for v in value for s in _scalars(v)]
    return [value] if isinstance(value, str) else []


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Source:
    dest = tmp_path_factory.mktemp("tau_bench_source")
    return Source(upstream_sources.require(upstream_sources.TAU_BENCH_ENV, ("tau_bench/envs/retail", "tau_bench/envs/tool.py"), dest))


@pytest.fixture(scope="module")
def data(benchmarks_dir: Path) -> DomainData:
    return load_domain_data("retail", benchmarks_dir / "retail")


@pytest.fixture(scope="module")
def pools(data: DomainData) -> Pools:
    return Pools(data)


# -- running one sequence on both sides ----------------------------------------------------------


def _compare(source: Source, data: DomainData, calls: list[Call], full_hash: bool = False) -> None:
    src_data, reachable = source.fresh_data(calls)
    db = data.db.fork()
    for position, (name, kwargs) in enumerate(calls):
        expected = source.step(src_data, name, copy.deepcopy(kwargs))
        got = call_tool(data, db, Action(name=name, kwargs=copy.deepcopy(kwargs)))
        assert got == expected, (position, name, kwargs)
    for table in TABLES:
        ours, theirs = db[table], src_data[table]
        assert list(ours) == list(theirs), table
        for key in reachable[table] | ours.touched_keys():
            assert str(to_hashable(ours[key])) == str(to_hashable(theirs[key])), (table, key)
    if full_hash:
        assert db.source_hash() == source_hash(src_data)


def _gold_calls(data: DomainData, index: int) -> list[Call]:
    return [(a.name, dict(a.kwargs)) for a in data.tasks("test")[index].actions]


def test_gold_sequences_match_source(source: Source, data: DomainData) -> None:
    start = source_hash(source.pristine)
    for index in range(len(data.tasks("test"))):
        _compare(source, data, _gold_calls(data, index), full_hash=index in (0, 12, 64, 106))
    assert source_hash(source.pristine) == start


def test_perturbed_gold_sequences_match_source(
    source: Source, data: DomainData, pools: Pools
) -> None:
    rng = random.Random(SEED)
    pristine = data.db.state_hash()
    for split in ("test", "dev"):
        for task in data.tasks(split):
            for _ in range(PERTURBED_PER_TASK):
                gold = [(a.name, copy.deepcopy(a.kwargs)) for a in task.actions]
                _compare(source, data, perturb(rng, pools, task.user_id, gold))
    assert data.db.state_hash() == pristine


def test_each_argument_with_each_kind_of_bad_value(
    source: Source, data: DomainData, pools: Pools
) -> None:
    """Every tool, every argument set to every garbage kind, the rest from a gold call."""
    base_calls = {name: kwargs for name, kwargs in pools.gold_calls}
    for name, params in pools.params.items():
        base = base_calls.get(name, {p: "x" for p in params})
        for param in params:
            for bad in GARBAGE:
                _compare(source, data, [(name, {**base, param: copy.deepcopy(bad)})])
            _compare(source, data, [(name, {k: v for k, v in base.items() if k != param})])
        _compare(source, data, [(name, {**base, "data": 1})])
        _compare(source, data, [(name, {**base, "unexpected": 1})])


# -- random action sequences --------------------------------------------------------------------

GARBAGE: list[Any] = [
    None,
    0,
    7,
    -1.5,
    True,
    "",
    " ",
    "#W",
    "W2611340",
    "#w2611340",
    "gift_card",
    "credit_card",
    "pending",
    [],
    [""],
    ["#W2611340"],
    {},
    {"a": 1},
    "x" * 3000,
    "0123456789",
    "1/0",
    "2**10",
]


class Pools:
    """Values a perturbation draws from: ids from the database, argument names, gold calls."""

    def __init__(self, data: DomainData) -> None:
        db = data.db
        self.params = {
            tool["function"]["name"]: list(tool["function"]["parameters"]["properties"])
            for tool in data.tools
        }
        self.order_ids = sorted(db["orders"])
        self.user_ids = sorted(db["users"])
        self.product_ids = sorted(db["products"])
        self.variant_ids = sorted(v for p in db["products"].values() for v in p["variants"])
        self.gold_calls = [
            (a.name, dict(a.kwargs)) for s in data.splits for t in data.tasks(s) for a in t.actions
        ]
        self.db = db

    def value(self, rng: random.Random, param: str, user_id: str) -> Any:
        """A plausible or wrong value for ``param``, biased towards the task user's records."""
        user = self.db["users"].get(user_id)
        if rng.random() < 0.2:
            return copy.deepcopy(rng.choice(GARBAGE))
        if param == "order_id":
            mine = user["orders"] if user else []
            return rng.choice(mine if mine and rng.random() < 0.7 else self.order_ids)
        if param in ("item_ids", "new_item_ids"):
            mine = user["orders"] if user else []
            order = self.db["orders"][rng.choice(mine or self.order_ids)]
            items = [i["item_id"] for i in order["items"]]
            pick = items if param == "item_ids" and rng.random() < 0.6 else self.variant_ids
            return [rng.choice(pick) for _ in range(rng.randint(0, 3))]
        if param == "payment_method_id":
            mine = list(user["payment_methods"]) if user else []
            other = list(self.db["users"][rng.choice(self.user_ids)]["payment_methods"])
            return rng.choice(mine if mine and rng.random() < 0.8 else other)
        if param == "user_id":
            return user_id if rng.random() < 0.7 else rng.choice(self.user_ids)
        if param == "product_id":
            return rng.choice(self.product_ids)
        if param == "reason":
            return rng.choice(["no longer needed", "ordered by mistake", "changed my mind"])
        if param == "email" and user:
            return user["email"].upper() if rng.random() < 0.5 else user["email"]
        if param in ("first_name", "last_name") and user:
            return user["name"][param]
        if param == "zip" and user:
            return user["address"]["zip"]
        if param == "expression":
            return rng.choice(["2 + 2", "(10.5 - 3) * 2", "1 / 3", "1 / 0", "2 ** 3", "abc", ""])
        return rng.choice(["Suite 1", "123 Main St", "Austin", "TX", "USA", "78701", "note"])


def random_call(rng: random.Random, pools: Pools, user_id: str) -> Call:
    if rng.random() < 0.05:
        return rng.choice(["cancel_order", "", "respond_user", "GET_USER_DETAILS"]), {}
    if rng.random() < 0.3:
        return copy.deepcopy(rng.choice(pools.gold_calls))
    name = rng.choice(sorted(pools.params))
    return name, {p: pools.value(rng, p, user_id) for p in pools.params[name]}


def perturb(rng: random.Random, pools: Pools, user_id: str, calls: list[Call]) -> list[Call]:
    """A gold sequence with 1-4 random edits: calls dropped, duplicated, swapped, added, changed."""
    calls = list(calls)
    for _ in range(rng.randint(1, 4)):
        edit = rng.randrange(8)
        if edit == 0 and calls:
            calls.pop(rng.randrange(len(calls)))
        elif edit == 1 and calls:
            position = rng.randrange(len(calls))
            calls.insert(position, copy.deepcopy(calls[position]))
        elif edit == 2 and len(calls) > 1:
            i = rng.randrange(len(calls) - 1)
            calls[i], calls[i + 1] = calls[i + 1], calls[i]
        elif edit == 3:
            calls.insert(rng.randint(0, len(calls)), random_call(rng, pools, user_id))
        elif edit in (4, 5) and calls:
            name, kwargs = calls[rng.randrange(len(calls))]
            if kwargs and isinstance(kwargs, dict):
                param = rng.choice(sorted(kwargs))
                kwargs[param] = pools.value(rng, param, user_id)
        elif edit == 6 and calls:
            name, kwargs = calls[rng.randrange(len(calls))]
            if kwargs and rng.random() < 0.5:
                kwargs.pop(rng.choice(sorted(kwargs)))
            else:
                kwargs[rng.choice(["data", "extra", "order_id", "reason"])] = "x"
        elif edit == 7:
            # Cancel an order the sequence later writes to (cancel-then-modify).
            targets = [i for i, (_, kw) in enumerate(calls) if isinstance(kw.get("order_id"), str)]
            if targets:
                i = rng.choice(targets)
                reason = rng.choice(["no longer needed", "ordered by mistake"])
                calls.insert(
                    i,
                    (
                        "cancel_pending_order",
                        {"order_id": calls[i][1]["order_id"], "reason": reason},
                    ),
                )
    return calls


HUGE = {
    "<huge ascii>": lambda: "a" * 200_000,
    "<huge list>": lambda: ["#W2611340"] * 5000,
    "<huge unicode>": lambda: "\u00e9" * 100_001,
    "<deep list>": lambda: _nested(3000),
}


def _nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


def _expand(kwargs: Any) -> Any:
    if isinstance(kwargs, dict):
        return {k: HUGE[v]() if isinstance(v, str) and v in HUGE else v for k, v in kwargs.items()}
    return kwargs


@st.composite
def call_sequences(draw: st.DrawFn, pools: Pools, huge: bool) -> list[Call]:
    seed = draw(st.integers(0, 2**32 - 1))
    rng = random.Random(seed)
    user_id = draw(st.sampled_from(pools.user_ids))
    calls = [random_call(rng, pools, user_id) for _ in range(draw(st.integers(1, 30)))]
    if huge:
        n = draw(st.integers(0, len(calls)))
        big = draw(st.sampled_from(sorted(HUGE)))  # a token, expanded by the test (short reprs)
        if n < len(calls) and isinstance(calls[n][1], dict):
            name, kwargs = calls[n]
            kwargs[draw(st.sampled_from(sorted(kwargs) or ["order_id"]))] = big
        kind = draw(st.sampled_from(["dict", "list", "str", "none"]))
        bad_kwargs = {"dict": {1: 2}, "list": [1], "str": "{}", "none": None}[kind]
        calls.insert(0, (draw(st.sampled_from(sorted(pools.params))), bad_kwargs))
    return calls


def test_random_calls_never_raise_and_never_touch_the_pristine_db(
    data: DomainData, pools: Pools
) -> None:
    pristine = data.db.state_hash()
    count = 0

    # derandomize: the same examples every run, so the call-count floor below cannot flake
    @settings(max_examples=600, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(call_sequences(pools, huge=True))
    def run(calls: list[Call]) -> None:
        nonlocal count
        env = ToolEnv(data, "test", 0, max_steps=None)
        for name, kwargs in calls:
            result = env.step(Action(name=name, kwargs=_expand(kwargs)))
            assert isinstance(result.observation, str)
            count += 1
            if result.done:  # a terminate tool ends the episode
                break
        if not env.done:
            before = json.dumps(
                [env.db["orders"]["#W5918442"], env.db["users"]["sofia_rossi_8776"]]
            )
            sibling = env.fork()
            cancel = {"order_id": "#W5918442", "reason": "no longer needed"}
            sibling.step(Action("cancel_pending_order", cancel))
            after = json.dumps([env.db["orders"]["#W5918442"], env.db["users"]["sofia_rossi_8776"]])
            assert after == before

    run()
    assert count >= 3000
    assert data.db.state_hash() == pristine
    assert all(not data.db[t].touched_keys() for t in TABLES)


def test_random_sequences_match_source(source: Source, data: DomainData, pools: Pools) -> None:
    start = source_hash(source.pristine)

    @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
    @given(call_sequences(pools, huge=False))
    def run(calls: list[Call]) -> None:
        _compare(source, data, calls)

    run()
    assert source_hash(source.pristine) == start
