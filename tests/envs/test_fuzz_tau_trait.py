"""Differential and property tests of the telecom and telehealth tools against tau-trait's code.

The source is extracted from the local tau-trait mirror into a pytest tmp dir at test time (never
committed).  Its tool packages are imported under stub parent packages so that the package
``__init__`` files, which import the env and litellm, never run; ``datetime.now`` in the source's
tool modules is frozen to the clock our database gets.  Every action sequence -- the gold
sequences of every task of every split, randomly perturbed ones (ids changed, calls dropped,
duplicated, swapped, inserted, wrong enum values, wrong or missing argument names, mistyped
values), single calls sweeping every argument of every tool over real and garbage values, and
hypothesis-generated call lists -- runs on fresh source data through the source env's step rule,
and on a fresh fork of our database through ``cast_rl.envs.core.call_tool`` (what ``ToolEnv``
runs): every observation must be equal, and so must the final state.  Two bounds of ours differ
by design and are checked separately (see :func:`_deliberate_difference`).

Final state: for gold sequences, ``source_hash`` of the whole database.  For random sequences the
hash covers the tables a source tool can write (telecom: customers, billing, support_tickets;
telehealth: appointments, medical_records); the other tables are shared with a pristine copy on
the source side and must be untouched on ours, and each test ends by checking the full hash of
both pristine copies, so the comparison is equivalent to a full one.

The property test (hypothesis) also holds without the source: thousands of random calls (unknown
names, missing, extra and mistyped kwargs, real ids and garbage, huge strings) never let an
exception escape the step wrapper, and the pristine database and a parent fork (whose child
runs the rest of the calls) keep their source hash (copy-on-write).

Run: .venv/bin/python -m pytest tests/envs/test_fuzz_tau_trait.py -q
"""

from __future__ import annotations

import copy
import datetime
import importlib
import inspect
import json
import random
import sys
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import upstream_sources
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cast_rl.envs.arith import MAX_EXPRESSION_CHARS
from cast_rl.envs.core import DomainData, call_tool, fixed_clock, load_domain_data
from cast_rl.envs.db import Database, source_hash
from cast_rl.envs.domain import DomainSpec, tool_name
from cast_rl.envs.domains import telecom, telehealth
from cast_rl.envs.types import Action

REPO_ROOT = Path(__file__).resolve().parents[2]
FIXED_NOW = datetime.datetime(2025, 6, 10, 9, 30, 0)
SPLITS = ("train", "dev", "test")
PERTURBED_PER_TASK = {"telecom": 40, "telehealth": 25}
SEED = 20251110

Call = tuple[str, dict[str, Any]]


def benchmarks_dir() -> Path:
    return REPO_ROOT.parent / "shared" / "benchmarks"


@dataclass(frozen=True)
class DomainCase:
    """What the tests need to know about a domain beyond its spec."""

    spec: DomainSpec
    writable: tuple[str, ...]
    """Tables some source tool writes; the rest are never written (checked by full hash)."""
    extra_names: tuple[str, ...]
    """Tool names that are not exposed but an agent may call."""


CASES: dict[str, DomainCase] = {
    "telecom": DomainCase(
        telecom.SPEC,
        writable=("customers", "billing", "support_tickets"),
        extra_names=("transfer_to_human_support", "manage_devices", "check_network_status", ""),
    ),
    "telehealth": DomainCase(
        telehealth.SPEC,
        writable=("appointments", "medical_records"),
        extra_names=("transfer_to_human_agents", "get_services", "Think", ""),
    ),
}

TOOL_MAPS = {domain: case.spec.tool_map for domain, case in CASES.items()}
"""``DomainSpec.tool_map`` builds a new dict on each access; the tests look tools up a lot."""


# -- the source, extracted and imported without its package __init__ files ----------------------


class _FrozenDatetime(datetime.datetime):
    """``datetime`` whose ``now()`` is :data:`FIXED_NOW`, patched into the source tool modules."""

    @classmethod
    def now(cls, tz: Any = None) -> datetime.datetime:  # type: ignore[override]
        return FIXED_NOW


def _is_source_module(name: str) -> bool:
    return name == "tau_trait" or name.startswith("tau_trait.")


def _import_source_tools(root: Path, domain: str) -> tuple[list[type], Callable[[], dict]]:
    """The source's ALL_TOOLS and load_data, imported under stub parent packages.

    sys.modules is left as it was: the classes keep their module globals, which is all they need.
    """
    envs = root / "tau_trait" / "envs"
    saved = {name: module for name, module in sys.modules.items() if _is_source_module(name)}
    for name in saved:
        del sys.modules[name]
    try:
        for name, path in (
            ("tau_trait", root / "tau_trait"),
            ("tau_trait.envs", envs),
            (f"tau_trait.envs.{domain}", envs / domain),
        ):
            package = types.ModuleType(name)
            package.__path__ = [str(path)]  # type: ignore[attr-defined]
            sys.modules[name] = package
        tools = importlib.import_module(f"tau_trait.envs.{domain}.tools")
        load_data = importlib.import_module(f"tau_trait.envs.{domain}.data").load_data
        loaded = [module for name, module in sys.modules.items() if _is_source_module(name)]
    finally:
        for name in [name for name in sys.modules if _is_source_module(name)]:
            del sys.modules[name]
        sys.modules.update(saved)
    for module in loaded:
        if getattr(module, "datetime", None) is datetime.datetime:
            module.datetime = _FrozenDatetime  # type: ignore[attr-defined]
    return list(tools.ALL_TOOLS), load_data


class Source:
    """A source domain: its tools and a pristine data dict; each run gets its own copy."""

    def __init__(self, root: Path, domain: str) -> None:
        self.case = CASES[domain]
        self.tools, load_data = _import_source_tools(root, domain)
        self.tools_map = {tool.get_info()["function"]["name"]: tool for tool in self.tools}
        self.pristine = load_data()
        self.pristine_hash = source_hash(self.pristine)

    def fresh_data(self) -> dict[str, Any]:
        """Writable tables deep-copied, the others shared with the pristine copy."""
        return {
            name: copy.deepcopy(table) if name in self.case.writable else table
            for name, table in self.pristine.items()
        }


@pytest.fixture(scope="module")
def optional_sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Source]:
    """Both source domains, extracted from the upstream tree; empty when it is not given."""
    paths = ("tau_trait/envs/tool.py", "tau_trait/envs/telecom", "tau_trait/envs/telehealth")
    dest = upstream_sources.extract(upstream_sources.TAU_TRAIT_ENV, paths, tmp_path_factory.mktemp("tau_trait_src"))
    if dest is None:
        return {}
    return {domain: Source(dest, domain) for domain in CASES}


@pytest.fixture(scope="module")
def sources(optional_sources: dict[str, Source]) -> dict[str, Source]:
    if not optional_sources:
        pytest.skip(upstream_sources.skip_reason(upstream_sources.TAU_TRAIT_ENV))
    return optional_sources


def domain_data(domain: str) -> DomainData:
    """Our domain data (pristine database at :data:`FIXED_NOW`), loaded once per session."""
    data_dir = benchmarks_dir() / domain
    if not (data_dir / "db").is_dir():
        pytest.skip(f"benchmark data not found at {data_dir}")
    return load_domain_data(domain, data_dir, clock=fixed_clock(FIXED_NOW.isoformat()))


def pristine_db(domain: str) -> Database:
    """Our pristine database; tests only ever fork it."""
    return domain_data(domain).db


def gold_tasks(domain: str) -> list[tuple[str, int, dict[str, Any]]]:
    tasks = []
    for split in SPLITS:
        path = benchmarks_dir() / domain / f"tasks_{split}.json"
        if not path.is_file():
            pytest.skip(f"benchmark tasks not found at {path}")
        tasks += [(split, i, task) for i, task in enumerate(json.loads(path.read_text()))]
    return tasks


def _calls(task: dict[str, Any]) -> list[Call]:
    return [(action["name"], action["kwargs"]) for action in task["actions"]]


# -- running a sequence on both sides -----------------------------------------------------------


def our_step(domain: str, db: Database, name: str, kwargs: dict[str, Any]) -> str:
    """Our env's tool step (what ``ToolEnv.step`` runs for a tool call)."""
    return call_tool(domain_data(domain), db, Action(name, copy.deepcopy(kwargs)))


def step(tools_map: dict[str, Any], data: Any, name: str, kwargs: dict[str, Any]) -> Any:
    """The source env's tool step; kwargs are copied as if freshly parsed from model output."""
    if name not in tools_map:
        return f"Unknown action {name}"
    try:
        return tools_map[name].invoke(data=data, **copy.deepcopy(kwargs))
    except Exception as exc:  # the env's rule: any tool exception becomes the observation
        return f"Error: {exc}"


def _deliberate_difference(name: str, kwargs: dict[str, Any]) -> bool:
    """Whether our observation differs from the source's by design.

    Two bounds keep every tool's work small: ``call_tool`` refuses arguments over
    ``MAX_ARGUMENT_CHARS`` (such calls are not run on the source: ours leaves the state as is)
    and ``calculate`` refuses expressions over ``MAX_EXPRESSION_CHARS`` (arith.py), which the
    source would ``eval``.  Everything else must match.
    """
    expression = kwargs.get("expression")
    return (
        name == "calculate"
        and set(kwargs) == {"expression"}
        and isinstance(expression, str)
        and len(expression) > MAX_EXPRESSION_CHARS
        and all(char in "0123456789+-*/(). " for char in expression)
    )


def _writable_hash(data: Any, tables: tuple[str, ...]) -> str:
    return source_hash({name: dict(data[name].items()) for name in tables})


def compare_run(
    source: Source, domain: str, calls: list[Call], full_hash: bool = False, reads: bool = False
) -> int:
    """Run ``calls`` on both sides; assert equal observations and state; return #calls.

    ``reads``: the calls use tools that write nothing; they run on the source's pristine data
    itself (checked by :func:`assert_pristine` at the end of the test) and must leave our fork
    untouched.
    """
    case = CASES[domain]
    theirs = source.pristine if reads else source.fresh_data()
    pristine = pristine_db(domain)
    ours = pristine.fork()
    for index, (name, kwargs) in enumerate(calls):
        got = our_step(domain, ours, name, kwargs)
        if got.startswith(f"Error: the arguments of {name} are too large"):
            continue  # refused before the tool runs, state untouched: see _deliberate_difference
        expected = step(source.tools_map, theirs, name, kwargs)
        if _deliberate_difference(name, kwargs):
            assert got.startswith("Error: expression longer than"), got
            continue
        assert got == expected, f"call {index} {name}({kwargs!r}) in {calls!r}"
    if full_hash:
        assert source_hash(ours.to_dict()) == source_hash(theirs), calls
        return len(calls)
    for name in ours:
        if name in case.writable and not reads:
            continue
        if isinstance(pristine[name], list):
            assert ours[name] is pristine[name], f"{name} was written: {calls!r}"
        else:
            assert not ours[name].touched_keys(), f"{name} was written: {calls!r}"
    if not reads:
        assert _writable_hash(ours, case.writable) == _writable_hash(theirs, case.writable), calls
    return len(calls)


def assert_pristine(source: Source, domain: str) -> None:
    assert source_hash(source.pristine) == source.pristine_hash
    assert pristine_db(domain).source_hash() == source.pristine_hash


# -- differential tests -------------------------------------------------------------------------


@pytest.mark.parametrize("domain", list(CASES))
def test_same_tools_signatures_and_data(sources: dict[str, Source], domain: str) -> None:
    source, spec = sources[domain], CASES[domain].spec
    assert [tool.__name__ for tool in spec.tools] == [tool.__name__ for tool in source.tools]
    assert [tool_name(tool) for tool in spec.tools] == list(source.tools_map)
    for ours, theirs in zip(spec.tools, source.tools, strict=True):
        ours_sig = inspect.signature(ours.invoke)
        theirs_sig = inspect.signature(theirs.invoke)
        assert list(ours_sig.parameters) == list(theirs_sig.parameters), ours.__name__
        for name, parameter in ours_sig.parameters.items():
            assert parameter.default == theirs_sig.parameters[name].default, (ours.__name__, name)
            assert parameter.kind == theirs_sig.parameters[name].kind, (ours.__name__, name)
    assert pristine_db(domain).source_hash() == source.pristine_hash  # byte-identical data


@pytest.mark.parametrize("domain", list(CASES))
def test_gold_sequences_match_source(sources: dict[str, Source], domain: str) -> None:
    source = sources[domain]
    tasks = gold_tasks(domain)
    compared = sum(compare_run(source, domain, _calls(task), full_hash=True) for *_, task in tasks)
    assert compared == sum(len(task["actions"]) for *_, task in tasks)
    assert_pristine(source, domain)


@pytest.mark.parametrize("domain", list(CASES))
def test_perturbed_sequences_match_source(sources: dict[str, Source], domain: str) -> None:
    source = sources[domain]
    rng = random.Random(SEED)
    pools = Pools.build(domain, source.pristine)
    sequences = compared = 0
    for *_, task in gold_tasks(domain):
        for _ in range(PERTURBED_PER_TASK[domain]):
            compared += compare_run(source, domain, perturb(rng, pools, _calls(task)))
            sequences += 1
    assert sequences == PERTURBED_PER_TASK[domain] * len(gold_tasks(domain))
    assert compared > sequences
    assert_pristine(source, domain)


@pytest.mark.parametrize("domain", list(CASES))
def test_single_call_sweep_matches_source(sources: dict[str, Source], domain: str) -> None:
    """Each tool with each candidate value of each argument, the others taken from gold calls."""
    source = sources[domain]
    pools = Pools.build(domain, source.pristine)
    rng = random.Random(SEED)
    compared = 0
    for tool in CASES[domain].spec.tools:
        name = tool_name(tool)
        parameters = pools.parameters(name)
        base = next((dict(kw) for n, kw in pools.gold_calls if n == name), None)
        if base is None:
            base = {p.name: pools.by_param.get(p.name, ["x"])[0] for p in parameters}
        reads = name not in CASES[domain].spec.write_tools
        for parameter in parameters:
            candidates = pools.by_param.get(parameter.name, [])
            sample = min(len(candidates), 30 if reads else 12)  # write runs compare hashes
            candidates = rng.sample(candidates, sample) + garbage(parameter.name)
            for value in candidates:
                call = (name, {**base, parameter.name: value})
                compared += compare_run(source, domain, [call], reads=reads)
    if domain == "telecom":  # every device with every issue, including the TV quirk
        for device in source.pristine["devices"]:
            for issue in TELECOM_HINTS["issue"]:
                call = ("troubleshoot_device", {"device_name": device, "issue": issue})
                compared += compare_run(source, domain, [call], reads=True)
    assert compared > 300
    assert_pristine(source, domain)


# -- value pools for random calls ---------------------------------------------------------------

HUGE = "9" * 50_000
GARBAGE: list[Any] = [
    "",
    " ",
    "unknown",
    "ÅÄÖ 🙂",
    "x" * 5000,
    HUGE,
    0,
    -1,
    2.5,
    1e308,
    True,
    False,
    None,
    [],
    {},
    ["a"],
    [1, 2],
    {"a": 1},
    {"record_id": "REC001"},
    "None",
    "null",
    "%s {0}",
]


def garbage(key: str) -> list[Any]:
    """GARBAGE fit for argument ``key``.

    ``check_drug_interactions`` compares every pair of ``current_medications``, so a long string
    there (iterated per character) takes minutes on both sides.
    """
    if key != "current_medications":
        return GARBAGE
    return [value for value in GARBAGE if not (isinstance(value, str) and len(value) > 100)]


TELECOM_HINTS: dict[str, list[Any]] = {
    "action": ["add", "remove", "list", "suspend", "activate", "ADD", ""],
    "category": [*telecom.TICKET_CATEGORIES, "Mobile", "network", ""],
    "priority": [*telecom.TICKET_PRIORITIES, "critical", "High", ""],
    "issue": ["no_service", "slow_speeds", "battery_drain", "no_connection", "no_signal", ""],
    "status": ["open", "closed", "pending", "resolved"],
    "original_price": ["85.00", 85, 3, "4.99", "abc", None, -3, "1e400", "nan"],
    "amount": [50, 25.5, "25.50", "x", None, 1e3, -10, "inf", 10**400],
    "method": ["credit_card", "bank_transfer", "cash"],
    "date": ["2025-09-18", "2025-01-01", "yesterday"],
    "paperless": [True, False, "yes", None],
    "auto_pay": [True, False, 1, None],
    "billing_cycle": ["monthly", "quarterly", "annual", "weekly"],
    "devices_ids": [["1"], ["2"], ["1", "2"], ["1", "9"], ["3", "1"], [], "12", ["x"], [1]],
    "expression": ["2 + 2", "(85 - 5) * 12", "10 / 4", "1/0", "2 ** 3", "abc", "", "1e3"],
    "thought": ["hmm", ""],
}
TELEHEALTH_HINTS: dict[str, list[Any]] = {
    "status_filter": [
        "scheduled",
        "Cancelled",
        "completed",
        "pending_approval",
        "available",
        "maintenance",
        "inspection",
        "shipped",
        "",
        None,
    ],
    "limit": [None, 0, 1, 2, 3, 5, 15, -1, "3", 2.5, True],
    "appointment_type": ["follow_up", "consultation", "routine_checkup", "", 5],
    "bill_insurance": [True, False, 0, "no", None],
    "voucher_id": ["THV-224", None, "", "V1"],
    "payment_notes": [None, "", "Paid by voucher", "self pay"],
    "metadata": [None, {}, {"source": "upload"}, {"a": [1, 2]}, ["x"], "m"],
    "price_usd": [12.5, 30, "19.99", "abc", None, "nan", 10**400],
    "currency": ["USD", "CAD", "EUR"],
    "reason": ["help", ""],
    "thought": ["hmm", ""],
    "note": ["Checked upload", "", "x" * 300],
    "expression": ["2 + 2", "30 * 3", "1/0", "45 - 12.5", "abc", ""],
}


def _strings(value: Any) -> Iterator[str]:
    """Every short string of a JSON-like value (dict keys included)."""
    if isinstance(value, str):
        if len(value) <= 60:
            yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _strings(key)
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def _week_slots(providers: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(provider_id, date, time) for every offered slot in June and July 2025."""
    slots = []
    day = datetime.date(2025, 6, 1)
    while day < datetime.date(2025, 8, 1):
        weekday = day.strftime("%A").lower()
        for provider_id, provider in providers.items():
            for time in provider["schedule"].get(weekday, []):
                slots.append((provider_id, day.isoformat(), time))
        day += datetime.timedelta(days=1)
    return slots


@dataclass
class Pools:
    """Candidate values for each kwarg name: real ids from the data, near misses and garbage."""

    domain: str
    by_param: dict[str, list[Any]]
    strings: list[str]
    names: list[str]
    gold_calls: list[Call]
    slots: list[tuple[str, str, str]] = field(default_factory=list)

    @classmethod
    def build(cls, domain: str, data: dict[str, Any]) -> Pools:
        spec = CASES[domain].spec
        by_param: dict[str, list[Any]] = {}
        gold_calls = [call for *_, task in gold_tasks(domain) for call in _calls(task)]
        for _, kwargs in gold_calls:
            for key, value in kwargs.items():
                by_param.setdefault(key, []).append(value)
        hints = TELECOM_HINTS if domain == "telecom" else TELEHEALTH_HINTS
        for key, values in hints.items():
            by_param.setdefault(key, []).extend(values)
        ids = _domain_ids(domain, data)
        for key, values in ids.items():
            by_param.setdefault(key, []).extend(values)
        names = [tool_name(tool) for tool in spec.tools] + list(CASES[domain].extra_names)
        slots = _week_slots(data["providers"]) if domain == "telehealth" else []
        return cls(domain, by_param, sorted(set(_strings(data))), names, gold_calls, slots)

    def value(self, rng: random.Random, key: str, current: Any = None) -> Any:
        roll = rng.random()
        if roll < 0.6 and self.by_param.get(key):
            return copy.deepcopy(rng.choice(self.by_param[key]))
        if roll < 0.75:
            return rng.choice(self.strings)
        if roll < 0.85 and isinstance(current, str) and current:
            return rng.choice([current + "x", current.upper(), current.lower(), current[:-1]])
        return copy.deepcopy(rng.choice(garbage(key)))

    def parameters(self, name: str) -> list[inspect.Parameter]:
        tool = TOOL_MAPS[self.domain].get(name)
        if tool is None:
            return []
        return list(inspect.signature(tool.invoke).parameters.values())[1:]

    def random_call(self, rng: random.Random) -> Call:
        """A call of a random (or unknown) tool; kwargs mostly plausible, sometimes not."""
        name = rng.choice(self.names)
        if name in ("schedule_appointment", "reschedule_appointment") and rng.random() < 0.7:
            return name, self._booking(rng, name)
        kwargs = {
            p.name: self.value(rng, p.name)
            for p in self.parameters(name)
            if p.default is inspect.Parameter.empty or rng.random() < 0.5
        }
        return name, kwargs

    def _booking(self, rng: random.Random, name: str) -> dict[str, Any]:
        """A schedule/reschedule call on a slot the provider offers (the success path)."""
        provider_id, date, time = rng.choice(self.slots)
        if name == "reschedule_appointment":
            return {
                "appointment_id": self.value(rng, "appointment_id"),
                "new_date": date,
                "new_time": time,
            }
        kwargs: dict[str, Any] = {
            "patient_id": self.value(rng, "patient_id"),
            "provider_id": provider_id,
            "date": date,
            "time": time,
            "appointment_type": rng.choice(["follow_up", "consultation", "routine_checkup"]),
        }
        for optional in ("bill_insurance", "voucher_id", "payment_notes"):
            if rng.random() < 0.5:
                kwargs[optional] = self.value(rng, optional)
        return kwargs


def _domain_ids(domain: str, data: dict[str, Any]) -> dict[str, list[Any]]:
    """Real values of the data for each kwarg name (and a few that the tools will create)."""
    if domain == "telecom":
        customers = data["customers"].values()
        return {
            "customer_id": list(data["customers"]),
            "service_id": list(data["services"]),
            "device_name": list(data["devices"]),
            "ticket_id": [*data["support_tickets"], "TICKET003", "TICKET004", "TICKET999"],
            "email": [c["demographics"]["email"] for c in customers],
            "phone": [c["demographics"]["phone"] for c in customers],
        }
    patients = data["patients"].values()
    prescriptions = [
        rx["medication"]
        for record in data["medical_records"].values()
        for rx in record.get("prescriptions", [])
    ]
    interactions = list(data["drug_interactions"])
    interactions += [name for inner in data["drug_interactions"].values() for name in inner]
    suppliers = [item for items in data["medication_suppliers"].values() for item in items]
    return {
        "patient_id": [*data["patients"], *data["regimen_plans"]],
        "provider_id": list(data["providers"]),
        "appointment_id": [*data["appointments"], "APPT059", "APPT060", "APPT032"],
        "record_id": [*data["medical_records"], "REC999"],
        "email": [p["demographics"]["email"] for p in patients],
        "first_name": [p["name"]["first_name"] for p in patients],
        "last_name": [p["name"]["last_name"] for p in patients],
        "date_of_birth": [p["demographics"]["date_of_birth"] for p in patients],
        "specialty": sorted({p["specialty"] for p in data["providers"].values()})
        + ["primary care"],
        "medication": [*data["medication_suppliers"], *prescriptions],
        "primary_medication": interactions,
        "current_medications": [interactions[:3], interactions[2:], [], prescriptions[:4]],
        "country_filter": sorted({item.get("country", "") for item in suppliers}),
        "supplier_company": [item.get("company") for item in suppliers],
        "brand_name": [item.get("brand_name") for item in suppliers],
        "device_id": [item["device_id"] for item in data["telemetry_inventory"]]
        + [item["device_id"] for item in data["telemetry_uploads"]],
        "date": [item["date"] for item in data["telemetry_uploads"]] + ["2025-06-16"],
        "start_date": ["2025-06-01", "2025-06-03", "", None],
        "end_date": ["2025-06-07", "2025-06-02", None],
        "new_date": ["2025-06-12", "2025-06-16", "2025-13-01", "06/12/2025"],
        "new_time": ["08:00", "09:00", "14:30", "8:00"],
        "time": ["08:00", "09:00", "10:00", "25:00"],
    }


# -- random perturbations of gold sequences -----------------------------------------------------

ARG_NAMES = ["device_id", "customer_id", "id", "note", "patient", "extra", "data", "self"]


def _mutate_kwargs(rng: random.Random, pools: Pools, kwargs: dict[str, Any]) -> dict[str, Any]:
    kwargs = copy.deepcopy(kwargs)
    keys = sorted(kwargs)
    choice = rng.randrange(6)
    if choice == 0 and keys:
        del kwargs[rng.choice(keys)]
    elif choice == 1:
        target = rng.choice(ARG_NAMES + keys)
        kwargs[target] = pools.value(rng, target)
    elif choice == 2 and keys:
        old = rng.choice(keys)
        kwargs[rng.choice(ARG_NAMES)] = kwargs.pop(old)  # a wrong argument name
    elif keys:
        key = rng.choice(keys)
        kwargs[key] = pools.value(rng, key, kwargs[key])
    return kwargs


def perturb(rng: random.Random, pools: Pools, calls: list[Call]) -> list[Call]:
    """A gold sequence with 1-4 random edits: calls dropped, duplicated, swapped, added, changed."""
    calls = [(name, copy.deepcopy(kwargs)) for name, kwargs in calls]
    for _ in range(rng.randint(1, 4)):
        choice = rng.randrange(8)
        if choice == 0 and calls:
            calls.pop(rng.randrange(len(calls)))
        elif choice == 1 and calls:
            index = rng.randrange(len(calls))
            calls.insert(rng.randint(index, len(calls)), copy.deepcopy(calls[index]))
        elif choice == 2 and len(calls) >= 2:
            i, j = rng.sample(range(len(calls)), 2)
            calls[i], calls[j] = calls[j], calls[i]
        elif choice == 3:
            calls.insert(rng.randint(0, len(calls)), copy.deepcopy(rng.choice(pools.gold_calls)))
        elif choice in (4, 5) or not calls:
            calls.insert(rng.randint(0, len(calls)), pools.random_call(rng))
        elif choice == 6:
            index = rng.randrange(len(calls))
            calls[index] = (rng.choice(pools.names), calls[index][1])
        else:
            index = rng.randrange(len(calls))
            name, kwargs = calls[index]
            calls[index] = (name, _mutate_kwargs(rng, pools, kwargs))
    return calls


# -- property test: random calls never escape the wrapper and never touch a parent ---------------


_json_scalars = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=40)
)
_json_values = st.recursive(
    _json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=8,
)


def _merge(pair: tuple[dict[str, Any], dict[str, Any]]) -> dict[str, Any]:
    arguments, extras = pair
    return {**extras, **arguments}


def _call_strategy(pools: Pools) -> st.SearchStrategy[list[Call]]:
    """Lists of calls: any tool name (or a near miss), each argument present or not, drawn from
    the pools or arbitrary JSON, sometimes with an extra argument, sometimes a gold call."""
    calls = []
    extras = st.dictionaries(st.sampled_from(ARG_NAMES), _json_values, max_size=1)
    for name in pools.names + ["respond_x", "get_customer_details "]:
        values = {}
        for parameter in pools.parameters(name):
            known = pools.by_param.get(parameter.name) or pools.strings
            mixed = (
                known + garbage(parameter.name) + pools.strings[:: max(1, len(pools.strings) // 20)]
            )
            values[parameter.name] = st.sampled_from(mixed) | _json_values
        arguments = st.fixed_dictionaries({}, optional=values)
        calls.append(st.tuples(st.just(name), st.tuples(arguments, extras).map(_merge)))
    calls.append(st.sampled_from(pools.gold_calls))
    return st.lists(st.one_of(calls), min_size=2, max_size=20)


def _property_check(domain: str, source: Source | None, max_examples: int) -> tuple[int, int]:
    """Run the property on ``max_examples`` call lists; return (call lists, calls) that ran."""
    pristine = pristine_db(domain)
    pristine_hash = pristine.source_hash()
    writable = CASES[domain].writable
    data_for_pools = source.pristine if source else pristine.to_dict()
    pools = Pools.build(domain, data_for_pools)

    @settings(
        max_examples=max_examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(calls=_call_strategy(pools), split=st.integers(min_value=0, max_value=20))
    def run(calls: list[Call], split: int) -> None:
        steps[0] += len(calls)
        steps[1] += 1
        parent = pristine.fork()
        db = parent
        parent_hash = None
        for index, (name, kwargs) in enumerate(calls):
            if index == split:  # continue on a child: the parent must keep its state
                parent_hash = _writable_hash(parent, writable)
                db = parent.fork()
            observation = our_step(domain, db, name, kwargs)
            assert isinstance(observation, str), (name, kwargs)
        if parent_hash is not None:
            assert _writable_hash(parent, writable) == parent_hash
        if source is not None:
            compare_run(source, domain, calls)

    steps = [0, 0]
    run()
    assert pristine.source_hash() == pristine_hash
    return steps[1], steps[0]


@pytest.mark.parametrize("domain", list(CASES))
def test_random_calls_are_contained_and_copy_on_write(
    optional_sources: dict[str, Source], domain: str
) -> None:
    """Runs without the mirror too; with it, every example is also compared with the source."""
    source = optional_sources.get(domain)
    # every example ran (the number of calls in them depends on pytest-randomly's seed: a fixed
    # total of calls once failed at 1993 > 2000)
    examples, calls = _property_check(domain, source, max_examples=450)
    assert examples >= 450 and calls >= 2 * examples
    if source is not None:
        assert_pristine(source, domain)
