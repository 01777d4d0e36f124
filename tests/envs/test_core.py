"""Tests of the domain-generic env core on the retail data: loading, stepping, reward, forks.

Expected rewards follow the source rule in shared/benchmarks/README.md, worked out per case.

Run: .venv/bin/python -m pytest tests/envs/test_core.py -q
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest

from cast_rl.envs import core
from cast_rl.envs.core import (
    DomainData,
    Episode,
    ToolEnv,
    fixed_clock,
    load_domain_data,
    parse_tool_call,
)
from cast_rl.envs.db import Database, json_state_hash
from cast_rl.envs.types import RESPOND, STOP_TOKEN, Action, Task

CANCEL = Action("cancel_pending_order", {"order_id": "#W5918442", "reason": "no longer needed"})
TRANSFER = Action("transfer_to_human_agents", {"summary": "help"})
OUTPUT_TASK = 16  # test task with outputs ["8276.23"]
NO_ACTION_TASK = 24  # test task with no actions and outputs ["polyester", "cotton"]


@pytest.fixture(scope="module")
def data(benchmarks_dir: Path) -> DomainData:
    return load_domain_data("retail", benchmarks_dir / "retail")


def say(text: str) -> Action:
    return Action(RESPOND, {"content": text})


def run_gold(env: ToolEnv) -> None:
    for action in env.task.actions:
        if env.step(action).done:
            break


# -- loading ------------------------------------------------------------------------------------


def test_load_is_cached_per_domain_dir_and_clock(data: DomainData, benchmarks_dir: Path) -> None:
    assert load_domain_data("retail", benchmarks_dir / "retail") is data
    assert fixed_clock("2024-05-15T15:00:00") is fixed_clock("2024-05-15T15:00:00")
    fixed = load_domain_data("retail", benchmarks_dir / "retail", clock=fixed_clock("2024-05-15"))
    assert fixed is not data and fixed.db.clock().isoformat() == "2024-05-15T00:00:00"
    assert data.splits == ["dev", "test", "train"]
    assert [len(data.tasks(s)) for s in data.splits] == [20, 115, 500]
    assert data.policy.startswith("# Retail agent policy")
    assert len(data.tools) == 16 and list(data.tool_map) == [
        t["function"]["name"] for t in data.tools
    ]


def test_load_errors_name_the_path(tmp_path: Path, benchmarks_dir: Path) -> None:
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "nope")):
        load_domain_data("retail", tmp_path / "nope")
    partial = tmp_path / "partial"
    shutil.copytree(benchmarks_dir / "retail" / "db", partial / "db")
    with pytest.raises(FileNotFoundError, match="policy.md"):
        load_domain_data("retail", partial)
    (partial / "policy.md").write_text("policy")
    (partial / "tools.json").write_text("[]")
    (partial / "tasks_dev.json").write_text("[]")
    loaded = load_domain_data("retail", partial)
    with pytest.raises(ValueError, match=r"tasks_test\.json.*available splits of retail: dev"):
        loaded.tasks("test")
    with pytest.raises(IndexError, match="out of range"):
        loaded.task("dev", 0)
    with pytest.raises(ValueError, match="unknown domain"):
        load_domain_data("bank", partial)


# -- stepping -----------------------------------------------------------------------------------


def test_bad_calls_become_observations(data: DomainData) -> None:
    env = ToolEnv(data, "test", 0)
    cases = [
        (Action("no_such_tool", {}), "Unknown action no_such_tool"),
        (
            Action("get_user_details", {}),
            "Error: GetUserDetails.invoke() missing 1 required positional argument: 'user_id'",
        ),
        (
            Action("get_user_details", {"user_id": "x", "zip": 1}),
            "Error: GetUserDetails.invoke() got an unexpected keyword argument 'zip'",
        ),
        (
            Action("get_user_details", {"user_id": "x", "data": 1}),
            "Error: tau_bench.envs.retail.tools.get_user_details.GetUserDetails.invoke() got "
            "multiple values for keyword argument 'data'",
        ),
        (
            Action("get_order_details", {"order_id": ["#W5918442"]}),
            "Error: unhashable type: 'list'",
        ),
        (
            Action("get_user_details", ["x"]),  # type: ignore[arg-type]
            "Error: the tool arguments must be a JSON object, got list",
        ),
        (
            Action("think", {"thought": "a" * (core.MAX_ARGUMENT_CHARS + 1)}),
            "Error: the arguments of think are too large (more than 100000 characters of text)",
        ),
        (
            Action(
                "modify_pending_order_items",
                {
                    "order_id": "#W5918442",
                    "item_ids": ["1"] * 2000,
                    "new_item_ids": [],
                    "payment_method_id": "x",
                },
            ),
            "Error: the arguments of modify_pending_order_items are too large (more than 1000 "
            "list or object entries)",
        ),
        (Action("calculate", {"expression": "1/0"}), "Error: division by zero"),
        (Action(RESPOND, {"text": "hi"}), 'Error: respond needs {"content": <message text>}'),
    ]
    for action, expected in cases:
        result = env.step(action)
        assert (result.observation, result.done) == (expected, False), action
    assert env.num_steps == len(cases) and env.db.same_state(data.db)


def test_parse_tool_call() -> None:
    assert parse_tool_call("think", '{"thought": "x"}') == Action("think", {"thought": "x"})
    assert parse_tool_call("list_all_product_types", "") == Action("list_all_product_types", {})
    assert parse_tool_call("think", {"thought": "x"}) == Action("think", {"thought": "x"})
    assert str(parse_tool_call("think", '{"thought": ')).startswith(
        "Error: the tool arguments are not valid JSON: Expecting value"
    )
    assert (
        parse_tool_call("think", "[1]")
        == "Error: the tool arguments must be a JSON object, got list"
    )
    assert parse_tool_call(3, "{}") == "Error: the tool name must be a string, got int"
    assert str(parse_tool_call("think", "[" * 100_000)).startswith("Error: the tool arguments")


def test_terminate_tool_ends_with_reward(data: DomainData) -> None:
    env = ToolEnv(data, "test", NO_ACTION_TASK)
    result = env.step(TRANSFER)
    assert (result.observation, result.done) == ("Transfer successful", True)
    # DB untouched = gold (no actions), but the outputs were never said: reward 0.
    assert result.reward == 0.0
    assert result.info["r_actions"] == 1.0 and result.info["r_outputs"] == 0.0
    assert result.info["outputs"] == {"polyester": False, "cotton": False}
    with pytest.raises(RuntimeError):
        env.step(TRANSFER)


def test_outputs_rule_lowercase_and_commas_removed_from_replies_only(data: DomainData) -> None:
    env = ToolEnv(data, "test", OUTPUT_TASK)
    run_gold(env)
    assert env.reward()[0] == 0.0  # "8276.23" never said
    env.step(say("The refund is $8,276.23 IN TOTAL"))
    assert env.reward() == (1.0, {"r_actions": 1.0, "r_outputs": 1.0, "outputs": {"8276.23": True}})
    assert env.reward(check_outputs=False) == (1.0, {"r_actions": 1.0})
    other = ToolEnv(data, "test", NO_ACTION_TASK)
    other.step(say("Polyester, or COTTON?"))
    assert other.reward()[0] == 1.0


def test_max_steps_ends_with_zero_unless_the_last_step_is_terminal(data: DomainData) -> None:
    env = ToolEnv(data, "test", NO_ACTION_TASK, max_steps=3)
    env.step(say("polyester cotton"))
    assert not env.step(Action("think", {"thought": "x"})).done
    result = env.step(Action("think", {"thought": "x"}))
    assert (result.done, result.reward, result.info["max_steps_reached"]) == (True, 0.0, True)
    env = ToolEnv(data, "test", NO_ACTION_TASK, max_steps=2)
    env.step(say("polyester cotton"))
    result = env.step(TRANSFER)  # the 2nd (last) action ends the episode: it is rewarded
    assert (result.done, result.reward) == (True, 1.0)


def test_gold_replay_db_is_cached(data: DomainData) -> None:
    first = data.gold_db("test", 5)
    assert data.gold_db("test", 5) is first
    assert not first.same_state(data.db)


def test_wrong_write_gives_zero(data: DomainData) -> None:
    env = ToolEnv(data, "test", 0)
    run_gold(env)
    assert env.reward()[0] == 1.0
    env.step(CANCEL)
    assert env.reward() == (0.0, {"r_actions": 0.0})


# -- forks and state hashes ---------------------------------------------------------------------


def test_fork_isolation(data: DomainData) -> None:
    pristine = data.db.state_hash()
    parent = ToolEnv(data, "test", 0)
    parent.step(
        Action(
            "modify_user_address",
            {
                "user_id": "noah_brown_6181",
                "address1": "a",
                "address2": "b",
                "city": "c",
                "state": "d",
                "country": "e",
                "zip": "f",
            },
        )
    )
    parent_hash = parent.state_hash()
    left, right = parent.fork(), parent.fork()
    assert left.state_hash() == parent_hash and left.num_steps == 1
    left.step(CANCEL)
    right.step(
        Action(
            "modify_user_address",
            {
                "user_id": "noah_brown_6181",
                "address1": "z",
                "address2": "b",
                "city": "c",
                "state": "d",
                "country": "e",
                "zip": "f",
            },
        )
    )
    assert parent.state_hash() == parent_hash and parent.num_steps == 1
    assert parent.db["orders"]["#W5918442"]["status"] == "pending"
    assert right.db["orders"]["#W5918442"]["status"] == "pending"
    assert left.db["orders"]["#W5918442"]["status"] == "cancelled"
    assert left.db["users"]["noah_brown_6181"]["address"]["address1"] == "a"
    assert right.db["users"]["noah_brown_6181"]["address"]["address1"] == "z"
    parent.step(CANCEL)  # the parent writes after forking: children do not see it
    assert right.db["orders"]["#W5918442"]["status"] == "pending"
    assert left.state_hash() != right.state_hash() != parent_hash
    assert data.db.state_hash() == pristine


def test_state_hash_is_sorted_key_json(data: DomainData) -> None:
    env = ToolEnv(data, "test", 0)
    env.step(CANCEL)
    state = env.db.to_dict()
    reordered = {name: dict(reversed(list(state[name].items()))) for name in reversed(list(state))}
    assert env.state_hash() == json_state_hash(reordered) == json_state_hash(state)
    assert len(env.state_hash()) == 64


# -- the async episode --------------------------------------------------------------------------


class EchoUser:
    """A fake user for the episode logic: stops when the agent says "bye"."""

    def __init__(self) -> None:
        self.heard: list[str] = []

    async def reset(self, task: Task, db: Database) -> str:
        return f"hi, I am {task.user_id}"

    async def step(self, agent_message: str) -> str:
        self.heard.append(agent_message)
        return STOP_TOKEN if "bye" in agent_message else "ok"


def test_episode_asks_the_user_and_stops_on_stop_token(data: DomainData) -> None:
    async def play() -> None:
        user = EchoUser()
        episode = Episode(data, "test", NO_ACTION_TASK, user)
        assert await episode.reset() == f"hi, I am {episode.task.user_id}"
        result = await episode.step(say("polyester or cotton?"))
        assert (result.observation, result.done) == ("ok", False)
        result = await episode.step(Action("think", {"thought": "x"}))
        assert (result.observation, result.done) == ("", False)
        result = await episode.step(Action(RESPOND, {}))
        assert result.observation.startswith("Error: respond needs") and user.heard == [
            "polyester or cotton?"
        ]
        result = await episode.step(say("bye"))
        assert (result.observation, result.done, result.reward) == (STOP_TOKEN, True, 1.0)
        await episode.reset()
        assert episode.env.num_steps == 0

    asyncio.run(play())


def test_episode_stop_on_the_last_allowed_step_is_rewarded(data: DomainData) -> None:
    async def play(max_steps: int, last: str) -> tuple[bool, float]:
        episode = Episode(data, "test", NO_ACTION_TASK, EchoUser(), max_steps=max_steps)
        await episode.reset()
        await episode.step(say("polyester cotton"))
        result = await episode.step(say(last))
        return result.done, result.reward

    assert asyncio.run(play(2, "bye")) == (True, 1.0)
    assert asyncio.run(play(2, "hm")) == (True, 0.0)
    assert asyncio.run(play(3, "hm")) == (False, 0.0)


def test_tasks_json_round_trip(data: DomainData, benchmarks_dir: Path) -> None:
    raw = json.loads((benchmarks_dir / "retail" / "tasks_test.json").read_text())
    assert [task.to_json() for task in data.tasks("test")] == raw
