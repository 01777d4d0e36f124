"""Differential and property tests of the airline tools against tau-bench's own tool code.

The source is extracted from the local tau-bench mirror into a pytest tmp dir at test time (never
committed); its airline tool modules are imported one by one so that the package ``__init__``
files, which import litellm, never run.  Every action sequence -- the 50 gold sequences and
randomly perturbed ones -- runs on a fresh source data dict and on a fresh fork of our
:class:`Database`, and every observation plus the final state must be equal.

Final state: the source hash (``cast_rl.envs.db.source_hash``) is compared in full for the
pristine start states and for a few sequences; for all sequences it is compared on the records
that either side may have changed (``source_hash`` of those records, plus equal key sets).  The
two are equivalent because the source's records that a sequence cannot reach are shared with a
pristine copy whose full hash is checked to be unchanged at the end of each test, and our
untouched records are the pristine base, likewise checked.

Run: .venv/bin/python -m pytest tests/envs/test_fuzz_airline.py -q
"""

from __future__ import annotations

import ast
import copy
import importlib.util
import json
import random
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import upstream_sources
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cast_rl.envs.core import DomainData, ToolEnv, call_tool, load_domain_data
from cast_rl.envs.db import Database, source_hash, to_hashable
from cast_rl.envs.domain import tool_name
from cast_rl.envs.domains.airline import SPEC
from cast_rl.envs.types import RESPOND, Action

SOURCE_PATHS = ("tau_bench/envs/airline", "tau_bench/envs/tool.py")
SOURCE_PACKAGE = "tau_bench.envs.airline.tools"
TABLES = ("flights", "reservations", "users")
PERTURBED_PER_TASK = 10
SEED = 20240515

Call = tuple[str, dict[str, Any]]


# -- the source, extracted and imported without its package __init__ files ----------------------


def _load_module(name: str, path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _import_source_tools(root: Path) -> list[type]:
    """The classes of the source's ALL_TOOLS, in order, read from ``tools/__init__.py``."""
    tools_dir = root / "tau_bench" / "envs" / "airline" / "tools"
    init = ast.parse((tools_dir / "__init__.py").read_text())
    module_of = {
        alias.name: node.module
        for node in init.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    order = [
        element.id
        for node in init.body
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "ALL_TOOLS"
        for element in node.value.elts  # type: ignore[attr-defined]
    ]
    with pytest.MonkeyPatch.context() as patch:
        for package in ("tau_bench", "tau_bench.envs", "tau_bench.envs.airline", SOURCE_PACKAGE):
            patch.setitem(sys.modules, package, types.ModuleType(package))
        tool_module = _load_module("tau_bench.envs.tool", root / "tau_bench" / "envs" / "tool.py")
        patch.setitem(sys.modules, "tau_bench.envs.tool", tool_module)
        # Real module names: Python puts them in one error text (a kwarg named "data").
        return [
            getattr(
                _load_module(
                    f"{SOURCE_PACKAGE}.{module_of[name]}", tools_dir / f"{module_of[name]}.py"
                ),
                name,
            )
            for name in order
        ]


class Source:
    """The source tools and pristine data; each run gets its own data dict."""

    def __init__(self, root: Path) -> None:
        self.tools = _import_source_tools(root)
        self.tools_map = {tool.get_info()["function"]["name"]: tool for tool in self.tools}
        data_dir = root / "tau_bench" / "envs" / "airline" / "data"
        self.pristine = {
            name: json.loads((data_dir / f"{name}.json").read_text()) for name in TABLES
        }
        self.pristine_hash = source_hash(self.pristine)

    def fresh_data(self, calls: list[Call]) -> tuple[dict[str, Any], dict[str, set[str]]]:
        """Data for one run: records a call can reach are private deep copies, the rest shared.

        Reachable: users and reservations named anywhere in the calls' kwargs, and the owners of
        those reservations.  A source tool that changed anything else would change the shared
        pristine records, which each test checks by full hash at its end.
        """
        named = {value for _, kwargs in calls for value in _scalars(kwargs)}
        reservations, users = self.pristine["reservations"], self.pristine["users"]
        reservation_ids = {rid for rid in named if rid in reservations}
        user_ids = {uid for uid in named if uid in users}
        user_ids |= {reservations[rid]["user_id"] for rid in reservation_ids}
        data = {
            "flights": self.pristine["flights"],  # no source tool writes flights
            "reservations": {
                **reservations,
                **{r: copy.deepcopy(reservations[r]) for r in reservation_ids},
            },
            "users": {**users, **{u: copy.deepcopy(users[u]) for u in user_ids}},
        }
        return data, {"flights": set(), "reservations": reservation_ids, "users": user_ids}


def _scalars(value: Any) -> Iterator[Any]:
    """Every string found in a JSON-like value (dict keys included)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _scalars(key)
            yield from _scalars(item)
    elif isinstance(value, list):
        for item in value:
            yield from _scalars(item)


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Source:
    dest = tmp_path_factory.mktemp("tau_bench_src")
    return Source(upstream_sources.require(upstream_sources.TAU_BENCH_ENV, SOURCE_PATHS, dest))


@pytest.fixture(scope="module")
def domain_data(benchmarks_dir: Path) -> DomainData:
    return load_domain_data("airline", benchmarks_dir / "airline")


@pytest.fixture(scope="module")
def pristine_db(domain_data: DomainData) -> Database:
    return domain_data.db


@pytest.fixture(scope="module")
def tasks(benchmarks_dir: Path) -> list[dict[str, Any]]:
    return json.loads((benchmarks_dir / "airline" / "tasks_test.json").read_text())


# -- running a sequence on both sides -----------------------------------------------------------


def _source_step(tools_map: dict[str, Any], data: Any, name: str, kwargs: dict[str, Any]) -> Any:
    """The source env's tool step; kwargs are copied as if freshly parsed from model output."""
    if name not in tools_map:
        return f"Unknown action {name}"
    try:
        observation = tools_map[name].invoke(data=data, **copy.deepcopy(kwargs))
    except Exception as exc:  # the env's rule: any tool exception becomes the observation
        return f"Error: {exc}"
    # send_certificate returns None, which the source env then fails to wrap (its observation
    # must be a str); ours shows the agent "None" instead of crashing the episode.
    return "None" if observation is None else observation


def _our_step(data: DomainData, db: Database, name: str, kwargs: dict[str, Any]) -> Any:
    return call_tool(data, db, Action(name=name, kwargs=copy.deepcopy(kwargs)))


def _partial_hash(data: Any, keys: dict[str, set[str]]) -> str:
    return source_hash({table: {key: data[table][key] for key in keys[table]} for table in TABLES})


def _compare_run(
    source: Source, domain_data: DomainData, calls: list[Call], full_hash: bool = False
) -> int:
    """Run ``calls`` on both sides, assert equal observations and state; return #observations."""
    source_data, copied = source.fresh_data(calls)
    ours = domain_data.db.fork()
    for index, (name, kwargs) in enumerate(calls):
        expected = _source_step(source.tools_map, source_data, name, kwargs)
        got = _our_step(domain_data, ours, name, kwargs)
        assert got == expected, f"call {index} {name}({kwargs!r})"
    for table in TABLES:
        assert set(ours[table]) == set(source_data[table]), table
    keys = {
        table: ours[table].touched_keys()
        | copied[table]
        | (set(source_data[table]) - set(source.pristine[table]))
        for table in TABLES
    }
    assert _partial_hash(ours, keys) == _partial_hash(source_data, keys), calls
    if full_hash:
        assert source_hash(ours.to_dict()) == source_hash(source_data)
    return len(calls)


def _assert_pristine(source: Source, pristine_db: Database) -> None:
    assert source_hash(source.pristine) == source.pristine_hash
    assert pristine_db.source_hash() == source.pristine_hash


def _gold_calls(task: dict[str, Any]) -> list[Call]:
    return [(action["name"], action["kwargs"]) for action in task["actions"]]


# -- differential tests -------------------------------------------------------------------------


def test_same_tools_in_source_order(source: Source) -> None:
    assert [tool.__name__ for tool in SPEC.tools] == [tool.__name__ for tool in source.tools]
    assert [tool_name(tool) for tool in SPEC.tools] == list(source.tools_map)
    for ours, theirs in zip(SPEC.tools, source.tools, strict=True):
        ours_args = ours.invoke.__code__.co_varnames[: ours.invoke.__code__.co_argcount]
        theirs_args = theirs.invoke.__code__.co_varnames[: theirs.invoke.__code__.co_argcount]
        assert ours_args == theirs_args, ours.__name__
        assert ours.invoke.__defaults__ == theirs.invoke.__defaults__, ours.__name__


def test_gold_sequences_match_source(
    source: Source, domain_data: DomainData, pristine_db: Database, tasks: list[dict[str, Any]]
) -> None:
    assert pristine_db.source_hash() == source.pristine_hash
    full = {0, 9, 20}  # a booking, three bookings after a cancel, flight changes
    compared = sum(
        _compare_run(source, domain_data, _gold_calls(task), full_hash=index in full)
        for index, task in enumerate(tasks)
    )
    assert compared == sum(len(task["actions"]) for task in tasks)
    _assert_pristine(source, pristine_db)


def test_perturbed_sequences_match_source(
    source: Source, domain_data: DomainData, pristine_db: Database, tasks: list[dict[str, Any]]
) -> None:
    rng = random.Random(SEED)
    pools = Pools(source.pristine)
    compared = 0
    for task in tasks:
        for _ in range(PERTURBED_PER_TASK):
            calls = perturb(rng, pools, task["user_id"], _gold_calls(task))
            compared += _compare_run(source, domain_data, calls)
    assert compared > 0
    _assert_pristine(source, pristine_db)


def test_quirk_scenarios_match_source(
    source: Source, domain_data: DomainData, pristine_db: Database
) -> None:
    for index, calls in enumerate(quirk_scenarios(Pools(source.pristine))):
        _compare_run(source, domain_data, calls, full_hash=index == 2)
    _assert_pristine(source, pristine_db)


def quirk_scenarios(pools: Pools) -> list[list[Call]]:
    """Hand-made sequences for paths that random edits rarely reach."""
    user = "aarav_nguyen_1055"  # certificate_3863871: 100, gift_card_9785014: 133
    empty_booking = {
        "user_id": user,
        "origin": "JFK",
        "destination": "SEA",
        "flight_type": "one_way",
        "cabin": "economy",
        "flights": [],
        "passengers": [],
        "payment_methods": [],
        "total_baggages": 0,
        "nonfree_baggages": 0,
        "insurance": "no",
    }

    def paid(nonfree: int, *payments: tuple[str, Any]) -> Call:
        methods = [{"payment_id": pid, "amount": amount} for pid, amount in payments]
        return "book_reservation", {
            **empty_booking,
            "nonfree_baggages": nonfree,
            "payment_methods": methods,
        }

    certificate, gift_card = "certificate_3863871", "gift_card_9785014"
    overnight = sorted(
        {
            f["origin"]
            for f in pools.data["flights"].values()
            if "+1" in f["scheduled_arrival_time_est"]
        }
    )
    # Only May 16-30 is bookable, so the unpadded date (days 1-8) never shows in this data.
    onestop = [
        ("search_onestop_flight", {"origin": origin, "destination": destination, "date": date})
        for origin in overnight
        for destination in pools.airports
        for date in ("2024-05-20", "2024-05-30")
    ]
    return [
        [("send_certificate", {"user_id": user, "amount": 100})] * 5,
        [("book_reservation", empty_booking)] * 4 + [("get_user_details", {"user_id": user})],
        # a certificate paid twice: the gift card is charged, then KeyError on the certificate
        [
            paid(3, (gift_card, 50), (certificate, 50), (certificate, 50)),
            ("get_user_details", {"user_id": user}),
        ],
        [paid(4, (gift_card, 100), (gift_card, 100)), ("get_user_details", {"user_id": user})],
        [paid(1, (gift_card, 50.0)), ("cancel_reservation", {"reservation_id": "HATHAT"})] * 2,
        onestop,
    ]


# -- random perturbations of gold sequences -----------------------------------------------------

CABINS = ["basic_economy", "economy", "business", "first", "", None]
GARBAGE: list[Any] = ["", " ", "unknown", "HATHAT", "x" * 5000, "ÅÄÖ", 0, -1, 2.5, True, None]
GARBAGE += [[], {}, ["a"], {"a": 1}]


class Pools:
    """Values a perturbation draws from: real ids and dates from the data, and garbage."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data
        self.user_ids = sorted(data["users"])
        self.reservation_ids = sorted(data["reservations"])
        self.flight_numbers = sorted(data["flights"])
        self.airports = sorted({f["origin"] for f in data["flights"].values()})
        days = [f"2024-05-{day:02d}" for day in range(1, 31)]
        self.dates = days + [
            "2024-05-31",
            "2024-06-01",
            "2024-05-1",
            "2024-04-30",
            "2024-05-0a",
            "05",
        ]
        self.payment_ids = sorted({p for u in data["users"].values() for p in u["payment_methods"]})

    def user_payments(self, user_id: str) -> list[str]:
        user = self.data["users"].get(user_id)
        return sorted(user["payment_methods"]) if user else []

    def user_reservations(self, user_id: str) -> list[str]:
        user = self.data["users"].get(user_id)
        return list(user["reservations"]) + ["HATHAT", "HATHAU"] if user else ["HATHAT"]


def _random_flights(rng: random.Random, pools: Pools) -> list[dict[str, Any]]:
    return [
        {"flight_number": rng.choice(pools.flight_numbers), "date": rng.choice(pools.dates[:30])}
        for _ in range(rng.randint(0, 3))
    ]


def _booking(rng: random.Random, pools: Pools, user_id: str) -> dict[str, Any]:
    """A booking whose payment usually adds up, so that the success path is exercised."""
    cabin = rng.choice(CABINS[:3])
    flights = _random_flights(rng, pools)
    user = pools.data["users"].get(user_id, {"saved_passengers": []})
    passengers = [
        {"first_name": "Ann", "last_name": "Lee", "dob": "1990-01-01"},
        *user["saved_passengers"],
    ][: rng.randint(1, 3)]
    total = 0
    for flight in flights:
        on_date = pools.data["flights"][flight["flight_number"]]["dates"][flight["date"]]
        total += on_date.get("prices", {}).get(cabin, 0) * len(passengers)
    insurance = rng.choice(["yes", "no"])
    nonfree = rng.randint(0, 2)
    total += 30 * len(passengers) * (insurance == "yes") + 50 * nonfree + rng.choice([0, 0, 0, 1])
    payments = pools.user_payments(user_id) or ["credit_card_0"]
    if rng.random() < 0.5:
        first = rng.choice(payments)
        split = rng.randint(0, total)
        payment_methods = [
            {"payment_id": first, "amount": split},
            {"payment_id": rng.choice(payments), "amount": total - split},
        ]
    else:
        payment_methods = [{"payment_id": rng.choice(payments), "amount": total}]
    return {
        "user_id": user_id,
        "origin": rng.choice(pools.airports),
        "destination": rng.choice(pools.airports),
        "flight_type": rng.choice(["one_way", "round_trip"]),
        "cabin": cabin,
        "flights": flights,
        "passengers": passengers,
        "payment_methods": payment_methods,
        "total_baggages": nonfree + rng.randint(0, 2),
        "nonfree_baggages": nonfree,
        "insurance": insurance,
    }


def random_call(rng: random.Random, pools: Pools, user_id: str) -> Call:
    """A plausible call of a random tool (or an unknown one) about the task's user."""
    reservation = rng.choice(pools.user_reservations(user_id))
    payment = rng.choice(pools.user_payments(user_id) or pools.payment_ids)
    name = rng.choice([tool_name(tool) for tool in SPEC.tools] + ["unknown_tool"])
    date = rng.choice(pools.dates)
    kwargs: dict[str, Any] = {
        "book_reservation": lambda: _booking(rng, pools, user_id),
        "calculate": lambda: {
            "expression": rng.choice(["2 + 2", "(1 + 2) * 3 / 4", "1/0", "a", ""])
        },
        "cancel_reservation": lambda: {"reservation_id": reservation},
        "get_reservation_details": lambda: {"reservation_id": reservation},
        "get_user_details": lambda: {"user_id": user_id},
        "list_all_airports": lambda: {},
        "search_direct_flight": lambda: {
            "origin": rng.choice(pools.airports),
            "destination": rng.choice(pools.airports),
            "date": date,
        },
        "search_onestop_flight": lambda: {
            "origin": rng.choice(pools.airports),
            "destination": rng.choice(pools.airports),
            "date": date,
        },
        "send_certificate": lambda: {"user_id": user_id, "amount": rng.choice([50, 100.5, "100"])},
        "think": lambda: {"thought": "hmm"},
        "transfer_to_human_agents": lambda: {"summary": "help"},
        "update_reservation_baggages": lambda: {
            "reservation_id": reservation,
            "total_baggages": rng.randint(0, 5),
            "nonfree_baggages": rng.randint(0, 4),
            "payment_id": payment,
        },
        "update_reservation_flights": lambda: {
            "reservation_id": reservation,
            "cabin": rng.choice(CABINS),
            "flights": _reservation_flights(rng, pools, reservation),
            "payment_id": payment,
        },
        "update_reservation_passengers": lambda: {
            "reservation_id": reservation,
            "passengers": [{"first_name": "Bo", "last_name": "Ng", "dob": "2000-02-02"}]
            * rng.randint(0, 4),
        },
        "unknown_tool": lambda: {"x": 1},
    }[name]()
    return name, kwargs


def _reservation_flights(
    rng: random.Random, pools: Pools, reservation_id: str
) -> list[dict[str, Any]]:
    """The reservation's flights with some changed, dropped or added."""
    existing = pools.data["reservations"].get(reservation_id, {"flights": []})["flights"]
    flights = [{"flight_number": f["flight_number"], "date": f["date"]} for f in existing]
    if flights and rng.random() < 0.5:
        flights[rng.randrange(len(flights))]["date"] = rng.choice(pools.dates)
    if rng.random() < 0.3:
        flights += _random_flights(rng, pools)
    if flights and rng.random() < 0.2:
        flights.pop(rng.randrange(len(flights)))
    return flights


def _mutate_value(rng: random.Random, pools: Pools, user_id: str, key: str, value: Any) -> Any:
    """A changed value for kwarg ``key``: another real id of the right kind, a tweak or garbage."""
    if rng.random() < 0.2:
        return rng.choice(GARBAGE)
    if key == "user_id":
        return rng.choice(pools.user_ids)
    if key == "reservation_id":
        return rng.choice(pools.reservation_ids + pools.user_reservations(user_id))
    if key == "payment_id":
        return rng.choice(pools.user_payments(user_id) + pools.payment_ids[:5])
    if key == "cabin":
        return rng.choice(CABINS)
    if key == "date":
        return rng.choice(pools.dates)
    if key in ("origin", "destination"):
        return rng.choice(pools.airports)
    if isinstance(value, bool) or not isinstance(value, (int, float, list, str)):
        return rng.choice(GARBAGE)
    if isinstance(value, (int, float)):
        return rng.choice([value + 1, value - 1, value * 2, 0, -value, value + 0.5, str(value)])
    if isinstance(value, list):
        return _mutate_list(rng, pools, user_id, key, value)
    return rng.choice([value + "x", value.upper(), "", value[:-1]])


def _mutate_list(rng: random.Random, pools: Pools, user_id: str, key: str, value: list[Any]) -> Any:
    items = copy.deepcopy(value)
    choice = rng.randrange(5)
    if choice == 0 and items:
        items.pop(rng.randrange(len(items)))
    elif choice == 1 and items:
        items.append(copy.deepcopy(rng.choice(items)))  # duplicate: a certificate used twice...
    elif choice == 2 and items and isinstance(items[0], dict):
        item = rng.choice(items)
        field = rng.choice(sorted(item) + ["extra"])
        item[field] = _mutate_value(rng, pools, user_id, field, item.get(field))
    elif choice == 3 and items and isinstance(items[0], dict) and items[0]:
        items[0].pop(rng.choice(sorted(items[0])))
    else:
        return {"wrapped": items} if rng.random() < 0.5 else items[::-1]
    return items


def _mutate_kwargs(
    rng: random.Random, pools: Pools, user_id: str, kwargs: dict[str, Any]
) -> dict[str, Any]:
    kwargs = copy.deepcopy(kwargs)
    choice = rng.randrange(6)
    keys = sorted(kwargs)
    if choice == 0 and keys:
        del kwargs[rng.choice(keys)]
    elif choice == 1:
        kwargs[rng.choice(["extra", "data", "self", "amount"])] = rng.choice(GARBAGE)
    elif choice == 2 and len(keys) >= 2:
        first, second = rng.sample(keys, 2)
        kwargs[first], kwargs[second] = kwargs[second], kwargs[first]
    elif keys:
        key = rng.choice(keys)
        kwargs[key] = _mutate_value(rng, pools, user_id, key, kwargs[key])
    return kwargs


def perturb(rng: random.Random, pools: Pools, user_id: str, calls: list[Call]) -> list[Call]:
    """A gold sequence with 1-4 random edits: calls dropped, duplicated, swapped, added, changed."""
    calls = [(name, copy.deepcopy(kwargs)) for name, kwargs in calls]
    for _ in range(rng.randint(1, 4)):
        choice = rng.randrange(7)
        if choice == 0 and calls:
            calls.pop(rng.randrange(len(calls)))
        elif choice == 1 and calls:
            index = rng.randrange(len(calls))
            calls.insert(rng.randint(index, len(calls)), copy.deepcopy(calls[index]))
        elif choice == 2 and len(calls) >= 2:
            i, j = rng.sample(range(len(calls)), 2)
            calls[i], calls[j] = calls[j], calls[i]
        elif choice in (3, 4) or not calls:
            calls.insert(rng.randint(0, len(calls)), random_call(rng, pools, user_id))
        else:
            index = rng.randrange(len(calls))
            name, kwargs = calls[index]
            calls[index] = (name, _mutate_kwargs(rng, pools, user_id, kwargs))
    return calls


# -- property test: random calls through the env's step never raise nor touch the pristine db ----

FIELD_NAMES = ["flight_number", "date", "payment_id", "amount", "first_name", "last_name", "dob"]


def _call_strategies(
    pools: Pools,
) -> tuple[st.SearchStrategy[Any], dict[str, st.SearchStrategy[Any]]]:
    """A strategy for any JSON-like value, and for each parameter name a well-formed one."""
    ids = st.sampled_from(
        pools.user_ids[:40]
        + pools.reservation_ids[:40]
        + pools.flight_numbers[:40]
        + pools.payment_ids[:40]
        + pools.dates
        + pools.airports
        + CABINS[:4]
        + ["HATHAT", "HATHAU"]
    )
    huge = st.integers(1_000, 150_000).map(lambda n: "x" * n)  # core caps arguments at 100k chars
    scalars = st.one_of(
        ids,
        st.text(max_size=12),
        st.integers(-(10**6), 10**6),
        st.floats(),
        st.booleans(),
        st.none(),
        huge,
    )
    value = st.recursive(
        scalars,
        lambda inner: (
            st.lists(inner, max_size=4)
            | st.dictionaries(st.sampled_from(FIELD_NAMES) | st.text(max_size=6), inner, max_size=4)
        ),
        max_leaves=10,
    )
    flight = st.fixed_dictionaries(
        {
            "flight_number": st.sampled_from(pools.flight_numbers),
            "date": st.sampled_from(pools.dates),
        }
    )
    passenger = st.fixed_dictionaries(
        {
            "first_name": st.text(max_size=8),
            "last_name": st.text(max_size=8),
            "dob": st.text(max_size=10),
        }
    )
    payment = st.fixed_dictionaries(
        {"payment_id": st.sampled_from(pools.payment_ids), "amount": st.integers(-100, 3000)}
    )
    well_formed = {
        "user_id": st.sampled_from(pools.user_ids),
        "reservation_id": st.sampled_from(pools.reservation_ids + ["HATHAT", "HATHAU", "HATHAV"]),
        "payment_id": st.sampled_from(pools.payment_ids),
        "origin": st.sampled_from(pools.airports),
        "destination": st.sampled_from(pools.airports),
        "date": st.sampled_from(pools.dates),
        "cabin": st.sampled_from(CABINS),
        "flights": st.lists(flight, max_size=3),
        "passengers": st.lists(passenger, max_size=4),
        "payment_methods": st.lists(payment, max_size=3),
        "amount": st.integers(0, 1000) | st.floats(0, 1000),
        "total_baggages": st.integers(0, 6),
        "nonfree_baggages": st.integers(0, 6),
        "flight_type": st.sampled_from(["one_way", "round_trip"]),
        "insurance": st.sampled_from(["yes", "no"]),
        "expression": st.text("0123456789+-*/(). ", max_size=20),
    }
    return value, well_formed


def _action_strategy(pools: Pools) -> st.SearchStrategy[Action]:
    """Calls of known, unknown and ``respond`` actions with kwargs dropped, added and mistyped."""
    value, well_formed = _call_strategies(pools)
    params = {
        name: tool.invoke.__code__.co_varnames[1 : tool.invoke.__code__.co_argcount]
        for name, tool in SPEC.tool_map.items()
    }
    arguments = {param: well_formed[param] | value for param in well_formed}
    names = st.sampled_from([*params, "unknown_tool", "", RESPOND])
    extra_keys = st.sampled_from(["data", "extra", "self"]) | st.text(max_size=5)
    present = st.integers(0, 9)

    @st.composite
    def action(draw: st.DrawFn) -> Action:
        name = draw(names)
        if name in params:
            kwargs = {
                param: draw(arguments.get(param, value))
                for param in params[name]
                if draw(present) > 0  # sometimes missing
            }
        else:
            kwargs = {"content": draw(value)}
        if draw(present) == 0:
            kwargs[draw(extra_keys)] = draw(value)
        return Action(name=name, kwargs=kwargs)

    return action()


def _named_records(pools: Pools, actions: list[Action]) -> list[tuple[str, str]]:
    """Records the actions could reach: those their kwargs name and those bookings' owners."""
    named = {value for action in actions for value in _scalars(action.kwargs)}
    keys = [(table, key) for table in TABLES for key in named if key in pools.data[table]]
    owners = {
        pools.data["reservations"][key]["user_id"] for table, key in keys if table == "reservations"
    }
    return keys + [("users", owner) for owner in owners]


def test_random_calls_never_raise_nor_touch_the_pristine_db(
    domain_data: DomainData, pristine_db: Database, benchmarks_dir: Path
) -> None:
    fresh = Database.load(benchmarks_dir / "airline" / "db")
    pools = Pools(fresh.to_dict())
    calls = 0

    @settings(
        max_examples=400,
        deadline=None,
        derandomize=True,  # the same examples every run: the call-count floor cannot flake
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(
        task_index=st.integers(0, 49),
        actions=st.lists(_action_strategy(pools), min_size=2, max_size=12),
    )
    def run(task_index: int, actions: list[Action]) -> None:
        nonlocal calls
        env = ToolEnv(domain_data, "test", task_index, max_steps=None)  # one fork per example
        for action in actions:
            result = env.step(action)  # raising here fails the test
            calls += 1
            assert isinstance(result.observation, str)
            if result.done:
                break
        # a cheap check per example; the full source hash is compared once at the end
        for table, key in _named_records(pools, actions):
            assert str(to_hashable(pristine_db[table][key])) == str(to_hashable(fresh[table][key]))

    run()
    assert calls >= 1000  # about 1600 per run
    assert pristine_db.source_hash() == fresh.source_hash()
