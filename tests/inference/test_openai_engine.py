"""``inference.backend=openai``: :class:`OpenAIEngine` against a local OpenAI-compatible stub
server (stdlib HTTP on 127.0.0.1, both endpoints, every request recorded), and the LLM user
simulator, the teacher and a model critic each making a call through it.  The slow test serves
the tiny model with vLLM's own OpenAI server.

    .venv/bin/python -m pytest tests/inference/test_openai_engine.py -q
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from cast_rl.config.schema import (
    CriticConfig,
    InferenceConfig,
    ModelConfig,
    TeacherConfig,
    UserConfig,
)
from cast_rl.inference import GenerationTimeout, Sampling, build_engine
from cast_rl.inference.openai_engine import OpenAIEndpointError, OpenAIEngine

KEY_ENV = "CAST_TEST_OPENAI_KEY"
KEY = "sk-cast-test-9f3e1b"


class _Stub(BaseHTTPRequestHandler):
    """``/v1/chat/completions`` answers ``chat_reply``; ``/v1/completions`` answers the ids
    ``GEN_IDS`` in the form ``ids_mode`` names (``field``: vLLM's ``token_ids``; ``tokens``:
    logprob tokens ``token_id:<id>``; ``none``: text only).  ``delay_s`` stalls every answer."""

    requests: list[tuple[str, str, dict[str, Any]]] = []
    chat_reply = "Hello there!"
    ids_mode = "field"
    delay_s = 0.0
    GEN_IDS = [11, 12, 13]
    GEN_LOGPROBS = [-0.5, -1.25, -0.125]

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _Stub.requests.append((self.path, self.headers.get("Authorization", ""), body))
        if _Stub.delay_s:
            time.sleep(_Stub.delay_s)
        usage = {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
        if self.path.endswith("/chat/completions"):
            reply = {
                "id": "c", "object": "chat.completion", "created": 0, "model": body["model"],
                "choices": [{"index": 0, "finish_reason": "length",
                             "message": {"role": "assistant", "content": _Stub.chat_reply}}],
                "usage": usage,
            }
        elif self.path.endswith("/completions"):
            choice: dict[str, Any] = {"index": 0, "text": "abc", "finish_reason": "stop"}
            if _Stub.ids_mode == "field":
                choice["token_ids"] = _Stub.GEN_IDS
            tokens = [f"token_id:{i}" for i in _Stub.GEN_IDS] if _Stub.ids_mode == "tokens" else ["a", "b", "c"]
            if body.get("logprobs") is not None:
                choice["logprobs"] = {"tokens": tokens, "token_logprobs": _Stub.GEN_LOGPROBS,
                                      "text_offset": [0, 1, 2], "top_logprobs": None}
            reply = {"id": "g", "object": "text_completion", "created": 0, "model": body["model"],
                     "choices": [choice], "usage": usage}
        else:
            self.send_error(404)
            return
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        with contextlib.suppress(BrokenPipeError):  # the client gave up (the timeout test)
            self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture()
def stub(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Stub)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Stub.requests, _Stub.chat_reply, _Stub.ids_mode, _Stub.delay_s = [], "Hello there!", "field", 0.0
    monkeypatch.setenv(KEY_ENV, KEY)
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def _cfg(base_url: str, **kw: Any) -> InferenceConfig:
    return InferenceConfig(backend="openai", base_url=base_url, api_key_env=KEY_ENV, **kw)


def _run(engine: OpenAIEngine, call: Any) -> Any:
    async def go() -> Any:
        try:
            return await call
        finally:
            await engine.close()

    return asyncio.run(go())


def test_chat_returns_the_text_and_sends_sampling_tools_and_the_key(stub: str) -> None:
    engine = build_engine("served-model", _cfg(stub))
    assert isinstance(engine, OpenAIEngine) and engine.tokenizer is None  # not a local directory
    tools = [{"type": "function", "function": {"name": "find_user", "parameters": {"type": "object"}}}]
    sampling = Sampling(max_new_tokens=9, temperature=0.3, top_p=0.8, seed=7, stop=("###",))
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    completion = _run(engine, engine.chat(messages, sampling, tools))
    assert (completion.text, completion.finish_reason, completion.prompt_tokens) == ("Hello there!", "length", 5)
    assert completion.token_ids == [] and completion.logprobs == []
    ((path, auth, body),) = _Stub.requests
    assert path == "/v1/chat/completions" and auth == f"Bearer {KEY}"
    assert body["model"] == "served-model" and body["messages"] == messages and body["tools"] == tools
    assert (body["max_tokens"], body["temperature"], body["top_p"], body["seed"], body["stop"]) == (
        9, 0.3, 0.8, 7, ["###"])


@pytest.mark.parametrize("mode", ["field", "tokens"])
def test_generate_sends_token_ids_and_returns_ids_and_logprobs(stub: str, mode: str) -> None:
    _Stub.ids_mode = mode
    engine = build_engine("served-model", _cfg(stub))
    completion = _run(engine, engine.generate([1, 2, 3, 4, 5], Sampling(max_new_tokens=3, temperature=0.0)))
    assert completion.token_ids == _Stub.GEN_IDS and completion.logprobs == _Stub.GEN_LOGPROBS
    assert (completion.text, completion.finish_reason, completion.prompt_tokens) == ("abc", "stop", 5)
    ((path, _, body),) = _Stub.requests
    assert path == "/v1/completions" and body["prompt"] == [1, 2, 3, 4, 5]
    assert body["logprobs"] == 0 and body["return_token_ids"] and body["return_tokens_as_token_ids"]
    assert body["max_tokens"] == 3 and body["temperature"] == 0.0 and "seed" not in body


def test_generate_without_ids_from_the_server_is_a_clear_error(stub: str) -> None:
    _Stub.ids_mode = "none"
    engine = build_engine("served-model", _cfg(stub))
    with pytest.raises(OpenAIEndpointError, match="a policy needs the exact generated ids"):
        _run(engine, engine.generate([1, 2], Sampling()))


def test_training_cannot_update_an_endpoints_weights(stub: str) -> None:
    engine = build_engine("served-model", _cfg(stub))
    with pytest.raises(OpenAIEndpointError, match="train the policy with inference.backend=vllm"):
        _run(engine, engine.load_weights({}))
    assert _Stub.requests == []


def test_a_slow_answer_becomes_a_generation_timeout(stub: str) -> None:
    _Stub.delay_s = 1.5
    engine = build_engine("served-model", _cfg(stub, request_timeout_s=0.3))
    start = time.monotonic()
    with pytest.raises(GenerationTimeout, match="request_timeout_s=0.3"):
        _run(engine, engine.chat([{"role": "user", "content": "hi"}], Sampling()))
    assert time.monotonic() - start < 1.2  # the engine's own bound, not the server's pace


def test_the_key_comes_from_the_named_variable_and_is_never_shown(
    stub: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv(KEY_ENV)
    with pytest.raises(ValueError, match=f"{KEY_ENV}.*is not set"):
        build_engine("served-model", _cfg(stub))
    monkeypatch.setenv(KEY_ENV, KEY)
    caplog.set_level(logging.DEBUG)  # the HTTP client's debug records too
    engine = build_engine("served-model", _cfg(stub))
    _run(engine, engine.chat([{"role": "user", "content": "hi"}], Sampling()))
    assert _Stub.requests[-1][1] == f"Bearer {KEY}"
    assert caplog.records and KEY not in caplog.text
    assert KEY not in repr(engine) and KEY not in str(vars(engine).get("cfg"))


def test_the_tokenizer_is_the_local_model_directorys(stub: str, tiny_model_dir: Path) -> None:
    engine = build_engine(str(tiny_model_dir), _cfg(stub))
    text = engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi there"}], tokenize=False, add_generation_prompt=True)
    assert "hi there" in text and engine.tokenizer(text).input_ids


def test_the_user_simulator_runs_through_backend_openai(stub: str) -> None:
    from cast_rl.envs.types import Task
    from cast_rl.envs.users import LLMUser, build_user, user_engine

    task = Task(user_id="u", instruction="You want your order status.", actions=())
    cfg = UserConfig(type="llm", model=ModelConfig(path="user-model", make_tiny_if_missing=False),
                     inference=_cfg(stub, max_new_tokens=11))
    engine, complete = user_engine(cfg)
    assert isinstance(engine, OpenAIEngine) and complete is not None
    user = build_user(cfg, complete)
    assert isinstance(user, LLMUser)
    assert _run(engine, user.reset(task, None)) == "Hello there!"
    assert isinstance(build_user(cfg), LLMUser)  # no engine given: it opens the endpoint itself
    ((_, auth, body),) = _Stub.requests
    assert auth == f"Bearer {KEY}" and body["model"] == "user-model" and body["max_tokens"] == 11
    assert body["messages"][0]["role"] == "system" and "order status" in body["messages"][0]["content"]


def test_the_teacher_runs_through_backend_openai(stub: str, retail_data_dir: Path) -> None:
    from cast_rl.critique.inject import inject
    from cast_rl.critique.labeller import Labeller, teacher_items
    from cast_rl.critique.teacher import rewrite_labels
    from cast_rl.envs.core import load_domain_data

    data = load_domain_data("retail", retail_data_dir)
    injected = inject("missing_confirmation", data, "train", 0)
    assert injected is not None
    labels = Labeller(data).label(injected.trajectory, 0)
    items = teacher_items(data, labels, [injected.trajectory])
    ((pos, (rationale, _, action, _)),) = [
        (p, it) for p, it in items if labels[p].message_index == injected.message_index]
    order = action.kwargs.get("order_id") or next(iter(action.kwargs.values()))
    _Stub.chat_reply = (
        f"VERDICT: invalid\nERROR: policy_violation\nCLAUSE: {rationale.policy_clause}\n"
        f"EXPLANATION: The agent went ahead with {action.name} on {order} before the customer "
        "had said yes to the listed details.\nFIX: Describe the change and wait for a yes.")
    cfg = TeacherConfig(enabled=True, model=ModelConfig(path="teacher-model", make_tiny_if_missing=False),
                        inference=_cfg(stub, temperature=0.0, max_new_tokens=64))
    stats = asyncio.run(rewrite_labels(cfg, data, labels, [injected.trajectory]))
    assert stats["label/teacher_rewritten"] >= 1
    assert stats["label/teacher_rewritten"] + stats["label/teacher_discarded"] == len(items) == len(_Stub.requests)
    assert "went ahead" in labels[pos].rationale["explanation"]
    assert {body["model"] for _, _, body in _Stub.requests} == {"teacher-model"}


def test_a_model_critic_runs_through_backend_openai(stub: str) -> None:
    from cast_rl.critique.service import build_verifier
    from cast_rl.critique.verifier import ModelVerifier, VerifyRequest

    _Stub.chat_reply = "VERDICT: invalid\nERROR: hallucination\nEXPLANATION: made up."
    cfg = CriticConfig(backend="model", model=ModelConfig(path="critic-model", make_tiny_if_missing=False),
                       inference=_cfg(stub, temperature=0.0))
    verifier = build_verifier(cfg)
    assert isinstance(verifier, ModelVerifier) and isinstance(verifier.engine, OpenAIEngine)
    request = VerifyRequest("retail", "policy", [{"role": "user", "content": "hi"}],
                            {"name": "respond", "kwargs": {"content": "hello"}})

    async def go() -> Any:
        try:
            return await verifier.verify([request])
        finally:
            await verifier.close()

    (critique,) = asyncio.run(go())
    assert (critique.verdict, critique.error_type, critique.critic) == ("invalid", "hallucination", "critic-model")
    ((path, _, body),) = _Stub.requests
    assert path == "/v1/chat/completions" and body["model"] == "critic-model" and body["temperature"] == 0.0


@pytest.mark.slow
def test_the_user_simulator_through_a_real_vllm_openai_server(tiny_model_dir: Path, tmp_path: Path) -> None:
    """``vllm serve`` of the tiny model on 127.0.0.1: the LLM user chats through it and a policy
    generate returns ids with logprobs (skipped when the server is not up within 120 s)."""
    from cast_rl.envs.types import Task
    from cast_rl.envs.users import build_user, user_engine
    from launchers.rehearse import vllm_server

    log = tmp_path / "vllm.log"
    with contextlib.ExitStack() as stack:
        try:
            base_url = stack.enter_context(vllm_server(str(tiny_model_dir), 1024, log, timeout_s=120, api_key=KEY))
        except TimeoutError:
            pytest.skip(f"vllm serve did not come up in 120 s (see {log})")
        stack.callback(os.environ.pop, KEY_ENV, None)
        os.environ[KEY_ENV] = KEY
        inference = _cfg(base_url, max_new_tokens=8, temperature=0.0)
        cfg = UserConfig(type="llm", model=ModelConfig(path=str(tiny_model_dir)), inference=inference)
        engine, complete = user_engine(cfg)

        async def go() -> tuple[str, Any]:
            try:
                reply = await build_user(cfg, complete).reset(Task(user_id="u", instruction="status", actions=()), None)
                ids = engine.tokenizer("hello there", add_special_tokens=False).input_ids
                return reply, await engine.generate(ids, Sampling(max_new_tokens=4, temperature=0.0))
            finally:
                await engine.close()

        reply, completion = asyncio.run(go())
        assert isinstance(reply, str)
        assert 1 <= len(completion.token_ids) <= 4 and len(completion.logprobs) == len(completion.token_ids)
        assert all(lp <= 0.0 for lp in completion.logprobs)
