"""User simulators: the scripted customer through a real Episode, the LLM customer's history,
timeouts and its OpenAI-compatible engine (``user.inference.backend=openai``, against a local HTTP
server), and ``build_user``.

Run: .venv/bin/python -m pytest tests/envs/test_users.py -q
"""

from __future__ import annotations

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from cast_rl.config.schema import InferenceConfig, ModelConfig, UserConfig
from cast_rl.envs.core import DomainData, Episode, load_domain_data
from cast_rl.envs.domain import get_domain
from cast_rl.envs.generate import write_retail
from cast_rl.envs.types import RESPOND, STOP_TOKEN, Action, StepResult, Task
from cast_rl.envs.users import LLMUser, ScriptedUser, UserSimulatorTimeout, build_user, user_engine
from cast_rl.envs.users.llm import OPENING

WRITES = get_domain("retail").write_tools
IDENTITY_QUESTION = "Could you give me your email, or your first name, last name and zip code?"


@pytest.fixture(scope="module", params=[0, 1])
def data(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> DomainData:
    out = tmp_path_factory.mktemp(f"retail{request.param}")
    write_retail(out, seed=request.param, num_tasks=24)
    return load_domain_data("retail", out)


def _say(text: str) -> Action:
    return Action(RESPOND, {"content": text})


def _proposal(action: Action) -> str:
    return f"I will call {action.name} with {json.dumps(action.kwargs)}. Do you confirm (yes/no)?"


async def run_gold_agent(episode: Episode) -> tuple[StepResult, list[str]]:
    """Authenticate, then run the gold actions, asking for a yes before each write."""
    replies = [await episode.reset()]
    result = await episode.step(_say(IDENTITY_QUESTION))
    replies.append(result.observation)
    for action in episode.task.actions:
        if action.name in WRITES:
            result = await episode.step(_say(_proposal(action)))
            replies.append(result.observation)
            assert result.observation.startswith("Yes"), replies
        result = await episode.step(action)
        assert not result.done
        if action.name in WRITES:
            result = await episode.step(_say(f"Done: {result.observation[:80]}"))
            replies.append(result.observation)
    return result, replies


def _tasks(data: DomainData) -> list[tuple[str, int, Task]]:
    return [(s, i, t) for s in ("train", "test") for i, t in enumerate(data.tasks(s))]


def test_gold_agent_reaches_stop_with_reward_one(data: DomainData) -> None:
    for split, index, task in _tasks(data):
        episode = Episode(data, split, index, ScriptedUser())
        result, replies = asyncio.run(run_gold_agent(episode))
        assert result.done and result.observation == STOP_TOKEN, replies
        assert result.reward == 1.0, (replies, result.info)
        user = data.db["users"][task.user_id]
        if task.actions[0].name == "find_user_id_by_email":
            assert replies[1] == f"My email is {user['email']}."
        else:
            assert user["address"]["zip"] in replies[1]


def _first_task(data: DomainData, write: str) -> tuple[str, int, Task, Action]:
    for split, index, task in _tasks(data):
        writes = [a for a in task.actions if a.name in WRITES]
        if len(writes) == 1 and writes[0].name == write:
            return split, index, task, writes[0]
    raise AssertionError(f"no single-{write} task")


async def _ask(data: DomainData, write: str, *messages: str) -> tuple[Task, Action, list[str]]:
    split, index, task, gold = _first_task(data, write)
    episode = Episode(data, split, index, ScriptedUser())
    replies = [await episode.reset()]
    for message in messages:
        replies.append((await episode.step(_say(message.format(**gold.kwargs)))).observation)
    return task, gold, replies


def _changed(action: Action, **changes: Any) -> Action:
    return Action(action.name, {**action.kwargs, **changes})


def test_declines_wrong_writes(data: DomainData) -> None:
    split, index, task, gold = _first_task(data, "cancel_pending_order")
    other = "no longer needed" if gold.kwargs["reason"] == "ordered by mistake" else (
        "ordered by mistake"
    )
    episode = Episode(data, split, index, ScriptedUser())
    asyncio.run(episode.reset())
    for wrong in (_changed(gold, order_id="#W0000001"), _changed(gold, reason=other)):
        reply = asyncio.run(episode.step(_say(_proposal(wrong)))).observation
        assert reply.startswith("No"), reply
    assert asyncio.run(episode.step(_say(_proposal(gold)))).observation.startswith("Yes")

    for name in ("modify_pending_order_items", "exchange_delivered_order_items"):
        split, index, task, gold = _first_task(data, name)
        order = data.db["orders"][gold.kwargs["order_id"]]
        old_id, new_id = gold.kwargs["item_ids"][0], gold.kwargs["new_item_ids"][0]
        product_id = next(i["product_id"] for i in order["items"] if i["item_id"] == old_id)
        episode = Episode(data, split, index, ScriptedUser())
        asyncio.run(episode.reset())
        variants = data.db["products"][product_id]["variants"]
        wrong_new = next(v for v in variants if v not in (old_id, new_id))
        wrong_item = _changed(gold, new_item_ids=[wrong_new] + gold.kwargs["new_item_ids"][1:])
        methods = data.db["users"][task.user_id]["payment_methods"]
        wrongs = [wrong_item] + [
            _changed(gold, payment_method_id=m)
            for m in methods if m != gold.kwargs["payment_method_id"]
        ]
        for wrong in wrongs:
            reply = asyncio.run(episode.step(_say(_proposal(wrong)))).observation
            assert reply.startswith("No, that is not what I want."), (wrong, reply)
        assert asyncio.run(episode.step(_say(_proposal(gold)))).observation.startswith("Yes")


def test_stop_needs_the_write_in_the_database(data: DomainData) -> None:
    """Saying "done" is not enough: the user stops only once the database shows the write."""
    split, index, task, gold = _first_task(data, "modify_pending_order_address")
    episode = Episode(data, split, index, ScriptedUser())
    asyncio.run(episode.reset())
    assert asyncio.run(episode.step(_say(_proposal(gold)))).observation.startswith("Yes")
    reply = asyncio.run(episode.step(_say("All done, your order has been updated!")))
    assert reply.observation != STOP_TOKEN and not reply.done
    asyncio.run(episode.step(gold))
    assert asyncio.run(episode.step(_say("Done now."))).observation == STOP_TOKEN


def test_observe_db_follows_a_fork(data: DomainData) -> None:
    split, index, task, gold = _first_task(data, "return_delivered_order_items")
    user = ScriptedUser()
    episode = Episode(data, split, index, user)
    asyncio.run(episode.reset())
    fork = episode.env.fork()
    fork.step(gold)
    assert asyncio.run(user.step("Anything else?")) != STOP_TOKEN
    user.observe_db(fork.db)
    assert asyncio.run(user.step("Anything else?")) == STOP_TOKEN


def test_answers_detail_questions(data: DomainData) -> None:
    task, gold, replies = asyncio.run(_ask(
        data, "modify_pending_order_address", "What is your zip code?",
        "What is the new address?", "Which order is it?"))
    assert replies[0].startswith("Hi! I'd like to change the shipping address of ")
    assert data.db["users"][task.user_id]["address"]["zip"] in replies[1]
    assert gold.kwargs["address1"] in replies[2] and gold.kwargs["zip"] in replies[2]
    if gold.kwargs["order_id"] in task.instruction:
        assert replies[3] == f"It is order {gold.kwargs['order_id']}."
    else:
        assert replies[3].startswith("I don't have the order id, but it is the order with the ")

    _, gold, replies = asyncio.run(_ask(
        data, "cancel_pending_order", "What is the reason for the cancellation?"))
    assert ("no longer need" in replies[1]) == (gold.kwargs["reason"] == "no longer needed")
    _, gold, replies = asyncio.run(_ask(
        data, "modify_pending_order_payment", "Which payment method would you like to use?"))
    assert replies[1].startswith("Please use my ")


def test_stops_on_transfer_and_turn_limit(data: DomainData) -> None:
    _, _, replies = asyncio.run(_ask(data, "cancel_pending_order", "I will transfer you now."))
    assert replies[-1] == STOP_TOKEN
    split, index, _, _ = _first_task(data, "cancel_pending_order")
    episode = Episode(data, split, index, ScriptedUser(max_turns=3), max_steps=None)
    asyncio.run(episode.reset())
    replies = [asyncio.run(episode.step(_say("Hello?"))).observation for _ in range(4)]
    assert replies[:3] == [replies[0]] * 3 and replies[0] != STOP_TOKEN
    assert replies[3] == STOP_TOKEN


def test_scripted_user_is_deterministic(data: DomainData) -> None:
    split, index, _, _ = _first_task(data, "exchange_delivered_order_items")

    def run() -> list[str]:
        episode = Episode(data, split, index, ScriptedUser())
        return asyncio.run(run_gold_agent(episode))[1]

    assert run() == run()


# ----------------------------------------------------------------------------- LLM user


class FakeEngine:
    """Records what it was sent and answers with padded canned lines."""

    def __init__(self, *replies: str) -> None:
        self.replies = list(replies)
        self.calls: list[list[dict[str, str]]] = []

    async def __call__(self, messages: list[dict[str, str]]) -> str:
        self.calls.append(messages)
        return self.replies.pop(0)


TASK = Task(user_id="ann_lee_1", instruction="You are Ann Lee in 02134. Cancel order #W1.",
            actions=())


def test_llm_user_history_has_flipped_roles() -> None:
    engine = FakeEngine("  Hi, I want to cancel an order.\n", "My zip is 02134. ", "###STOP###\n")
    user = LLMUser(engine, timeout_s=5)
    assert asyncio.run(user.reset(TASK, None)) == "Hi, I want to cancel an order."
    assert asyncio.run(user.step("Sure, your zip?")) == "My zip is 02134."
    assert asyncio.run(user.step("Done.")) == "###STOP###"
    system = user.messages[0]
    assert system["role"] == "system" and TASK.instruction in system["content"]
    assert "###STOP###" in system["content"] and "one line" in system["content"]
    assert [(m["role"], m["content"]) for m in user.messages[1:]] == [
        ("user", OPENING),
        ("assistant", "Hi, I want to cancel an order."),
        ("user", "Sure, your zip?"),
        ("assistant", "My zip is 02134."),
        ("user", "Done."),
        ("assistant", "###STOP###"),
    ]
    assert [len(call) for call in engine.calls] == [2, 4, 6]
    assert engine.calls[1] == user.messages[:4]
    engine.calls[0].append({"role": "user", "content": "tampered"})
    assert user.messages[2]["content"] == "Hi, I want to cancel an order."


def test_llm_user_times_out_cleanly() -> None:
    async def never(messages: list[dict[str, str]]) -> str:
        await asyncio.Event().wait()  # never set: the call hangs until cancelled
        return ""

    user = LLMUser(never, timeout_s=0.05)
    with pytest.raises(UserSimulatorTimeout, match="user.timeout_s=0.05"):
        asyncio.run(user.reset(TASK, None))
    assert [m["role"] for m in user.messages] == ["system", "user"]
    with pytest.raises(ValueError, match="timeout_s"):
        LLMUser(never, timeout_s=0)


class _ChatHandler(BaseHTTPRequestHandler):
    seen: list[tuple[str, dict[str, Any]]] = []

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _ChatHandler.seen.append((self.headers.get("Authorization", ""), body))
        reply = {
            "id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": " Hello there! \n"}}],
        }
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture()
def chat_server() -> Any:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _ChatHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _ChatHandler.seen.clear()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def test_openai_user_engine_reads_the_key_from_the_named_variable(
    chat_server: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = UserConfig(type="llm", model=ModelConfig(path="user-model", make_tiny_if_missing=False),
                     inference=InferenceConfig(backend="openai", base_url=chat_server,
                                               api_key_env="CAST_TEST_USER_KEY", max_new_tokens=7))
    monkeypatch.delenv("CAST_TEST_USER_KEY", raising=False)
    with pytest.raises(ValueError, match="CAST_TEST_USER_KEY .*is not set"):
        user_engine(cfg)
    monkeypatch.setenv("CAST_TEST_USER_KEY", "sk-secret-123")
    engine, complete = user_engine(cfg)
    assert complete is not None
    user = LLMUser(complete, timeout_s=30)
    with caplog.at_level("DEBUG"):
        assert asyncio.run(user.reset(TASK, None)) == "Hello there!"
    auth, body = _ChatHandler.seen[-1]
    assert auth == "Bearer sk-secret-123"
    assert body["model"] == "user-model" and body["max_tokens"] == 7
    assert body["messages"][1] == {"role": "user", "content": OPENING}
    assert "sk-secret-123" not in caplog.text


def test_build_user(chat_server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    assert isinstance(build_user(UserConfig()), ScriptedUser)
    engine = FakeEngine("hi")
    user = build_user(UserConfig(type="llm", timeout_s=7.0), complete=engine)
    assert isinstance(user, LLMUser) and user.timeout_s == 7.0
    with pytest.raises(ValueError, match="needs an engine"):
        build_user(UserConfig(type="llm"))
    monkeypatch.setenv("CAST_TEST_USER_KEY", "k")
    cfg = UserConfig(type="llm", inference=InferenceConfig(
        backend="openai", base_url=chat_server, api_key_env="CAST_TEST_USER_KEY"))
    assert asyncio.run(build_user(cfg).reset(TASK, None)) == "Hello there!"
