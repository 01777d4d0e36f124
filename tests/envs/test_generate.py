"""The procedural retail generator: determinism, benchmark schema, task kinds, gold replays, CLI.

Schema checks compare with the benchmark's retail data (../shared/benchmarks, skipped when
absent); everything else runs on generated data only.

Run: .venv/bin/python -m pytest tests/envs/test_generate.py -q
"""

from __future__ import annotations

import builtins
import json
from pathlib import Path
from typing import Any

import pytest

from cast_rl.envs.core import ToolEnv, call_tool, load_domain_data
from cast_rl.envs.db import Database
from cast_rl.envs.domain import get_domain
from cast_rl.envs.generate import generate_retail, split_tasks, write_retail
from cast_rl.envs.types import Action

SEEDS = (0, 1, 2)
WRITES = get_domain("retail").write_tools
AUTH = ("find_user_id_by_email", "find_user_id_by_name_zip")


def _files(root: Path) -> dict[str, bytes]:
    files = sorted(p for p in root.rglob("*") if p.is_file())
    return {str(p.relative_to(root)): p.read_bytes() for p in files}


def test_same_seed_same_bytes_other_seed_other_data(tmp_path: Path) -> None:
    write_retail(tmp_path / "a", seed=7, num_tasks=20)
    write_retail(tmp_path / "b", seed=7, num_tasks=20)
    write_retail(tmp_path / "c", seed=8, num_tasks=20)
    a, b, c = (_files(tmp_path / name) for name in "abc")
    assert sorted(a) == [
        "db/orders.json", "db/products.json", "db/users.json", "policy.md", "tasks_test.json",
        "tasks_train.json", "tools.json",
    ]
    assert a == b
    assert a["db/users.json"] != c["db/users.json"]
    assert a["tasks_train.json"] != c["tasks_train.json"]


def test_generator_reads_no_files(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError(f"the generator opened a file: {args}")

    monkeypatch.setattr(builtins, "open", refuse)
    monkeypatch.setattr(Path, "read_text", refuse)
    monkeypatch.setattr(Path, "read_bytes", refuse)
    db, tasks, policy, tools = generate_retail(seed=3, num_tasks=12)
    assert len(tasks) == 12 and policy and len(tools) == 16


def _shapes(value: Any, path: str, out: dict[str, set[str]]) -> None:
    """Record key lists and value types under generic paths (ids and option names elided)."""
    if isinstance(value, dict):
        out.setdefault(path, set()).add("dict")
        for key, child in value.items():
            _shapes(child, f"{path}.{key}", out)
    elif isinstance(value, list):
        out.setdefault(path, set()).add("list")
        for child in value:
            _shapes(child, f"{path}[]", out)
    else:
        out.setdefault(path, set()).add(type(value).__name__)


def _generic(table: str, record: dict[str, Any]) -> dict[str, Any]:
    """The record with id-keyed maps turned into lists, so paths do not depend on ids."""
    record = json.loads(json.dumps(record))
    if table == "products":
        record["variants"] = list(record["variants"].values())
        for variant in record["variants"]:
            variant["options"] = "options"
    elif table == "users":
        record["payment_methods"] = list(record["payment_methods"].values())
    else:
        for item in record["items"]:
            item["options"] = "options"
    return record


@pytest.mark.parametrize("table", ["orders", "products", "users"])
def test_schema_matches_benchmark(benchmarks_dir: Path, table: str) -> None:
    bench = json.loads((benchmarks_dir / "retail" / "db" / f"{table}.json").read_text())
    db, _, _, _ = generate_retail(seed=0, num_tasks=64)
    ours = db[table]
    bench_shapes: dict[str, set[str]] = {}
    our_shapes: dict[str, set[str]] = {}
    for record in bench.values():
        _shapes(_generic(table, record), table, bench_shapes)
    for key, record in ours.items():
        _shapes(_generic(table, record), table, our_shapes)
        assert isinstance(key, str)
    assert set(our_shapes) == set(bench_shapes)
    for path, types in our_shapes.items():
        assert types <= bench_shapes[path], path
    assert {tuple(r) for r in ours.values()} <= {tuple(r) for r in bench.values()}
    if table == "orders":
        assert {r["status"] for r in ours.values()} == {r["status"] for r in bench.values()}
        assert {tuple(r["address"]) for r in ours.values()} == {
            tuple(r["address"]) for r in bench.values()
        }
    if table == "users":
        method_keys = {tuple(m) for r in bench.values() for m in r["payment_methods"].values()}
        assert {tuple(m) for r in ours.values() for m in r["payment_methods"].values()} == (
            method_keys
        )


def test_tasks_and_tools_match_benchmark_keys(benchmarks_dir: Path) -> None:
    _, tasks, _, tools = generate_retail(seed=0, num_tasks=10)
    bench_tasks = json.loads((benchmarks_dir / "retail" / "tasks_test.json").read_text())
    assert list(tasks[0].to_json()) == list(bench_tasks[0])
    assert list(tasks[0].to_json()["actions"][0]) == list(bench_tasks[0]["actions"][0])
    bench_tools = json.loads((benchmarks_dir / "retail" / "tools.json").read_text())
    assert len(tools) == len(bench_tools) == 16
    for ours, theirs in zip(tools, bench_tools, strict=True):
        mine, src = ours["function"], theirs["function"]
        assert mine["name"] == src["name"]
        assert mine["parameters"]["required"] == src["parameters"]["required"]
        assert list(mine["parameters"]["properties"]) == list(src["parameters"]["properties"])
        for name, prop in src["parameters"]["properties"].items():
            got = mine["parameters"]["properties"][name]
            assert {k: v for k, v in got.items() if k != "description"} == {
                k: v for k, v in prop.items() if k != "description"
            }
        assert mine["description"] != src["description"]


def test_policy_is_our_own_and_short(benchmarks_dir: Path) -> None:
    _, _, policy, _ = generate_retail(seed=0, num_tasks=1)
    theirs = (benchmarks_dir / "retail" / "policy.md").read_text()
    assert len(policy) < 0.7 * len(theirs)
    sentences = [s.strip() for s in theirs.replace("\n", " ").split(".") if len(s.strip()) > 30]
    assert not [s for s in sentences if s in policy.replace("\n", " ")]


@pytest.mark.parametrize("seed", SEEDS)
def test_all_kinds_present_and_gold_structure(seed: int) -> None:
    db, tasks, _, _ = generate_retail(seed=seed, num_tasks=64)
    writes_per_task = [[a.name for a in t.actions if a.name in WRITES] for t in tasks]
    singles = {w[0] for w in writes_per_task if len(w) == 1}
    assert singles == set(WRITES)
    assert any(len(w) == 2 and w[0] != w[1] for w in writes_per_task)
    assert all(1 <= len(w) <= 2 for w in writes_per_task)
    for task in tasks:
        user = db["users"][task.user_id]
        first = task.actions[0]
        assert first.name in AUTH
        assert task.instruction.startswith(
            f"You are {user['name']['first_name']} {user['name']['last_name']} in "
            f"{user['address']['zip']}."
        )
        if first.name == "find_user_id_by_email":
            assert user["email"] in task.instruction
        seen: list[Action] = []
        for action in task.actions[1:]:
            if action.name in WRITES and "order_id" in action.kwargs:
                assert Action("get_order_details", {"order_id": action.kwargs["order_id"]}) in seen
                if action.kwargs["order_id"] not in task.instruction:  # the user describes it
                    assert Action("get_user_details", {"user_id": task.user_id}) in seen
            needs_profile = (
                "payment_method_id" in action.kwargs or action.name == "modify_user_address"
            )
            if needs_profile and action.name != "return_delivered_order_items":
                assert Action("get_user_details", {"user_id": task.user_id}) in seen
            if "new_item_ids" in action.kwargs:
                order = db["orders"][action.kwargs["order_id"]]
                for item in order["items"]:
                    if item["item_id"] in action.kwargs["item_ids"]:
                        product = Action("get_product_details", {"product_id": item["product_id"]})
                        assert product in seen
            seen.append(action)


def test_lookups_identify_users_uniquely() -> None:
    db, _, _, _ = generate_retail(seed=0, num_tasks=64)
    users = db["users"].values()
    keys = [(u["name"]["first_name"].lower(), u["name"]["last_name"].lower(), u["address"]["zip"])
            for u in users]
    assert len(set(keys)) == len(keys)
    assert len({u["email"] for u in users}) == len(keys)
    assert 20 <= len(keys) <= 60
    for user in users:
        assert len({m["source"] for m in user["payment_methods"].values()}) == len(
            user["payment_methods"]
        )


@pytest.mark.parametrize("seed", SEEDS)
def test_every_gold_sequence_replays_to_reward_one(tmp_path: Path, seed: int) -> None:
    write_retail(tmp_path, seed=seed, num_tasks=40)
    data = load_domain_data("retail", tmp_path)
    for split in ("train", "test"):
        for index, task in enumerate(data.tasks(split)):
            env = ToolEnv(data, split, index)
            for action in task.actions:
                result = env.step(action)
                assert not result.done
                if action.name in WRITES:
                    assert not result.observation.startswith("Error"), (split, index, action)
            reward, info = env.reward()
            assert reward == 1.0, (split, index, info)
            assert not env.db.same_state(data.db), "a task's writes change nothing"


@pytest.mark.parametrize("seed", SEEDS)
def test_tasks_do_not_interfere(tmp_path: Path, seed: int) -> None:
    """All tasks' gold actions replayed in order on one database: no write fails."""
    write_retail(tmp_path, seed=seed, num_tasks=64)
    data = load_domain_data("retail", tmp_path)
    db = Database.load(tmp_path / "db")
    _, tasks, _, _ = generate_retail(seed=seed, num_tasks=64)
    targets = [a.kwargs.get("order_id") for t in tasks for a in t.actions if a.name in WRITES]
    orders = [t for t in targets if t is not None]
    assert len(orders) == len(set(orders))
    for task in tasks:
        for action in task.actions:
            observation = call_tool(data, db, action)
            if action.name in WRITES:
                assert not observation.startswith("Error"), (task.instruction, observation)


def test_split_is_eighty_twenty() -> None:
    _, tasks, _, _ = generate_retail(seed=0, num_tasks=50)
    train, test = split_tasks(tasks)
    assert (len(train), len(test)) == (40, 10)
    assert test == [tasks[i] for i in range(4, 50, 5)]
    assert train == [t for i, t in enumerate(tasks) if i % 5 != 4]


def test_many_tasks_still_replay_one_by_one(tmp_path: Path) -> None:
    """Beyond the unused orders the generator reuses them; each task stays valid on its own."""
    write_retail(tmp_path, seed=5, num_tasks=150)
    data = load_domain_data("retail", tmp_path)
    for index, task in enumerate(data.tasks("train")):
        env = ToolEnv(data, "train", index)
        for action in task.actions:
            observation = env.step(action).observation
            assert action.name not in WRITES or not observation.startswith("Error")
        assert env.reward()[0] == 1.0


def test_cli_writes_a_loadable_data_dir(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from cast_rl.cli import main

    out = tmp_path / "retail"
    assert main(["env", "generate", "env.generated_seed=4", "env.generated_tasks=10", "--out", str(out)]) == 0
    assert str(out) in capsys.readouterr().out
    data = load_domain_data("retail", out)
    assert (len(data.tasks("train")), len(data.tasks("test"))) == (8, 2)
    assert data.policy.startswith("# Retail agent policy")
    assert [t["function"]["name"] for t in data.tools] == list(get_domain("retail").tool_map)
    assert json.loads((out / "tasks_test.json").read_text())[0]["annotator"] == "synthetic"


@pytest.mark.parametrize(("auth", "expected"), [("email", {AUTH[0]}), ("name_zip", {AUTH[1]}), ("either", set(AUTH))])
def test_auth_choice_changes_only_how_users_identify(auth: str, expected: set[str]) -> None:
    db, tasks, _, _ = generate_retail(seed=0, num_tasks=40, kinds=("cancel",), compact=True, auth=auth)
    _, either, _, _ = generate_retail(seed=0, num_tasks=40, kinds=("cancel",), compact=True)
    assert {t.actions[0].name for t in tasks} == expected
    # the same users and requests: only the identifying lookup (and its line) differs
    assert [(t.user_id, t.actions[1:]) for t in tasks] == [(t.user_id, t.actions[1:]) for t in either]
    with pytest.raises(ValueError, match="auth='phone' is not allowed"):
        generate_retail(seed=0, num_tasks=4, auth="phone")
