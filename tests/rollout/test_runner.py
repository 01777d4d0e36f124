"""Episode runner logic with a scripted engine (a fake, for pure bookkeeping logic).

The scripted engine answers with the canonical tokens of scripted turns, so the conversation's
token ids must equal re-tokenising the final conversation with the chat template exactly.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from cast_rl.config import load_config
from cast_rl.envs.core import load_domain_data
from cast_rl.inference.base import Completion, Sampling
from cast_rl.records import (
    PolicyTurn,
    Trajectory,
    TrajectoryFormatError,
    VerificationRound,
    read_trajectories,
    write_trajectories,
)
from cast_rl.rollout.runner import EpisodeRunner, EpisodeSpec


class ScriptedEngine:
    """Returns the n-th scripted turn for a prompt with n assistant turns in it (canonical ids)."""

    def __init__(self, tokenizer, turns: list[str]) -> None:  # noqa: ANN001
        self.tokenizer = tokenizer
        self.turns = turns
        self.prompts: list[list[int]] = []

    async def generate(self, prompt_ids: list[int], sampling: Sampling) -> Completion:
        self.prompts.append(list(prompt_ids))
        text = self.tokenizer.decode(prompt_ids, skip_special_tokens=False)
        n = text.count("<|im_start|>assistant\n") - 1
        body = self.turns[min(n, len(self.turns) - 1)]
        ids = self.tokenizer(body, add_special_tokens=False).input_ids
        ids.append(self.tokenizer.convert_tokens_to_ids("<|im_end|>"))
        await asyncio.sleep(0)  # yield like a real engine
        return Completion(text=body, token_ids=ids, logprobs=[-0.5] * len(ids))


def _call(name: str, **kwargs) -> str:  # noqa: ANN003
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": kwargs}) + "\n</tool_call>"


@pytest.fixture(scope="module")
def setup(tiny_model_dir: Path, retail_data_dir: Path):  # noqa: ANN201
    from transformers import AutoTokenizer

    cfg = load_config(None, [f"env.data_dir={retail_data_dir}", "env.max_steps=6", "env.split=train"])
    return cfg, load_domain_data("retail", retail_data_dir), AutoTokenizer.from_pretrained(tiny_model_dir)


def _run(cfg, data, engine, specs):  # noqa: ANN001, ANN202
    runner = EpisodeRunner(cfg, data, engine)
    return runner, asyncio.run(runner.run_many(specs, concurrency=4))


def test_tokens_equal_retokenised_conversation(setup) -> None:  # noqa: ANN001
    cfg, data, tok = setup
    task = data.task("train", 0)
    email_or_name = task.actions[0]
    turns = [
        "Hello! Please give me your email.",
        _call(email_or_name.name, **email_or_name.kwargs),
        "Thanks. Let me look at that.\n" + _call("get_user_details", user_id=task.user_id),
        _call("not_a_tool", x=1),
        '<tool_call>\n{"name": broken}\n</tool_call>',
        "Goodbye.",
    ]
    engine = ScriptedEngine(tok, turns)
    _, (traj,) = _run(cfg, data, engine, [EpisodeSpec("train", 0, 0)])
    rendered = tok.apply_chat_template(traj.messages, tools=data.tools, tokenize=False)
    assert traj.token_ids == tok(rendered, add_special_tokens=False).input_ids
    assert traj.info["tokens_consistent"] is True
    # The loss mask covers exactly the generated ids (each turn's body plus its <|im_end|>).
    generated = sum(len(tok(t, add_special_tokens=False).input_ids) + 1 for t in turns)
    assert sum(traj.loss_mask) == generated
    policy_logprobs = [lp for lp, m in zip(traj.logprobs, traj.loss_mask) if m]
    assert policy_logprobs == [-0.5] * generated
    assert all(lp == 0.0 for lp, m in zip(traj.logprobs, traj.loss_mask) if not m)
    # Every prompt the engine saw is a prefix of the final ids: nothing was re-tokenised.
    for prompt in engine.prompts:
        assert traj.token_ids[: len(prompt)] == prompt
    roles = [m["role"] for m in traj.messages]
    assert roles[:3] == ["system", "user", "assistant"]
    assert traj.malformed_calls == 1
    assert traj.info["termination"] == "max_steps"
    unknown = next(m for m in traj.messages if m.get("name") == "not_a_tool")
    assert unknown["content"] == "Unknown action not_a_tool"
    malformed = [m for m in traj.messages if m["role"] == "tool" and m["tool_call_id"] == "invalid"]
    assert len(malformed) == 1 and "malformed tool call" in malformed[0]["content"]


def test_many_episodes_each_once_and_jsonl_roundtrip(setup, tmp_path: Path) -> None:  # noqa: ANN001
    cfg, data, tok = setup
    engine = ScriptedEngine(tok, ["How can I help?", "Bye."])
    specs = [EpisodeSpec("train", i, t) for i in range(5) for t in range(3)]
    runner, trajs = _run(cfg, data, engine, specs)
    assert [(t.split, t.task_index, t.trial) for t in trajs] == [s.key for s in specs]
    assert runner.stats.episodes == 15
    path = tmp_path / "t.jsonl"
    write_trajectories(path, trajs)
    back = read_trajectories(path)
    assert [b.to_json() for b in back] == [t.to_json() for t in trajs]
    assert all(isinstance(turn, PolicyTurn) for b in back for turn in b.turns)
    # the runner's counters are the sums of what its trajectories record
    assert runner.stats.policy_tokens == sum(t.policy_tokens for t in back) == sum(sum(t.loss_mask) for t in back)
    assert runner.stats.prompt_tokens == sum(t.prompt_tokens for t in back) > 0


def test_turn_records_load_typed_and_bad_or_old_ones_are_named(tmp_path: Path) -> None:
    """turns and verification_rounds are records; an unknown field names its place; a line
    written before turns were recorded loads and reads its counts from info."""
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x"}]
    turn = {"message_index": 1, "start": 0, "end": 2, "action": None, "error": "Error: empty"}
    rnd = {"message_index": 1, "proposal": {"name": "respond", "kwargs": {}}, "critique": {"verdict": "invalid"}}
    good = Trajectory("retail", "test", 0, 0, 0.0, 0, messages, token_ids=[5, 6], loss_mask=[1, 1],
                      logprobs=[0.0, 0.0], turns=[turn], verification_rounds=[rnd])
    assert isinstance(good.turns[0], PolicyTurn) and isinstance(good.verification_rounds[0], VerificationRound)
    assert (good.policy_tokens, good.malformed_calls, good.verification_rounds[0].revision) == (2, 1, None)
    path = tmp_path / "t.jsonl"
    write_trajectories(path, [good])
    assert json.loads(path.read_text())["turns"][0] == turn | {
        "verdict": None, "error_type": None, "executed": True, "substituted": False, "prompt_tokens": 0, "dropped_calls": 0}
    for bad, message in ((good.to_json() | {"turns": [turn | {"span": 3}]}, r"turns\[0\]: unknown keys: span"),
                         (good.to_json() | {"verification_rounds": [{"message_index": 1}]},
                          r"verification_rounds\[0\]: missing keys: proposal, critique"),
                         (good.to_json() | {"turns": [7]}, r"turns\[0\] must be an object")):
        path.write_text(json.dumps(bad) + "\n")
        with pytest.raises(TrajectoryFormatError, match=message):
            read_trajectories(path)
    old = Trajectory("retail", "test", 0, 0, 0.0, 0, messages, info={"policy_tokens": 9, "malformed_calls": 2})
    assert (old.policy_tokens, old.malformed_calls, old.prompt_tokens) == (9, 2, 0)


def test_gold_policy_solves_task_with_reward_one(setup) -> None:  # noqa: ANN001
    """A policy that asks for confirmation and runs the gold actions earns the source's reward 1."""
    cfg, data, tok = setup
    task = data.task("train", 1)
    turns = []
    for action in task.actions:
        if action.name in data.spec.write_tools:
            turns.append("I will " + action.name.replace("_", " ") + " with " + json.dumps(action.kwargs) + ". Do you confirm (yes/no)?")
        turns.append(_call(action.name, **action.kwargs))
    turns.append("All done. Anything else?")
    cfg2 = load_config(None, [f"env.data_dir={data.data_dir}", "env.split=train", "env.max_steps=30", "inference.max_model_len=16384"])
    _, (traj,) = _run(cfg2, data, ScriptedEngine(tok, turns), [EpisodeSpec("train", 1, 0)])
    assert traj.info["tokens_consistent"]
    assert traj.info["termination"] == "user_stop"
    assert traj.reward == 1.0
    rendered = tok.apply_chat_template(traj.messages, tools=data.tools, tokenize=False)
    assert traj.token_ids == tok(rendered, add_special_tokens=False).input_ids


def test_malformed_line_names_file_and_line(tmp_path: Path) -> None:
    good = Trajectory("retail", "test", 0, 0, 1.0, 0, [{"role": "user", "content": "hi"}])
    path = tmp_path / "t.jsonl"
    write_trajectories(path, [good])
    with path.open("a") as f:
        f.write('{"domain": "retail"}\n')
    with pytest.raises(TrajectoryFormatError, match=r"t\.jsonl:2: not a trajectory: missing keys"):
        read_trajectories(path)
    path.write_bytes(b'\xff\xfe{"x": 1}\n')
    with pytest.raises(TrajectoryFormatError, match=r"t\.jsonl:1"):
        read_trajectories(path)
    bad_mask = good.to_json() | {"token_ids": [1, 2], "loss_mask": [1], "logprobs": [0.0, 0.0]}
    path.write_text(json.dumps(bad_mask) + "\n")
    with pytest.raises(TrajectoryFormatError, match="loss_mask has 1 entries, token_ids has 2"):
        read_trajectories(path)


def test_hung_tool_and_user_become_recorded_failures(setup, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    import threading

    from cast_rl.envs.core import ToolEnv

    cfg, data, tok = setup
    cfg = load_config(None, [f"env.data_dir={data.data_dir}", "env.split=train", "env.tool_timeout_s=0.2", "user.timeout_s=0.2"])
    release = threading.Event()
    original = ToolEnv.step

    def hung_step(self, action):  # noqa: ANN001, ANN202
        release.wait(30)  # a tool stuck on pathological input (released at the end of the test)
        return original(self, action)

    monkeypatch.setattr(ToolEnv, "step", hung_step)
    try:
        _, (traj,) = _run(cfg, data, ScriptedEngine(tok, [_call("list_all_product_types")]), [EpisodeSpec("train", 0, 0)])
    finally:
        release.set()
    assert traj.info["termination"] == "tool_timeout"
    assert traj.reward == 0.0

    class SlowUser:
        async def reset(self, task, db):  # noqa: ANN001, ANN202
            return "hi"

        async def step(self, message):  # noqa: ANN001, ANN202
            await asyncio.sleep(30)

    monkeypatch.setattr("cast_rl.rollout.runner.build_user", lambda *a, **kw: SlowUser())
    _, (traj,) = _run(cfg, data, ScriptedEngine(tok, ["Hello"]), [EpisodeSpec("train", 0, 0)])
    assert traj.info["termination"] == "user_timeout"


def test_context_overflow_ends_episode_with_consistent_tokens(setup) -> None:  # noqa: ANN001
    cfg, data, tok = setup
    cfg = load_config(None, [f"env.data_dir={data.data_dir}", "env.split=train", "inference.max_model_len=3300", "inference.max_new_tokens=256"])
    _, (traj,) = _run(cfg, data, ScriptedEngine(tok, ["Please tell me more. " * 20]), [EpisodeSpec("train", 0, 0)])
    assert traj.info["termination"] == "context_overflow"
    rendered = tok.apply_chat_template(traj.messages, tools=data.tools, tokenize=False)
    assert traj.token_ids == tok(rendered, add_special_tokens=False).input_ids


def test_context_encoding_cut_at_special_tokens_equals_whole_text(setup) -> None:  # noqa: ANN001
    """encode_context cuts at special tokens and caches long pieces: same ids as one encode."""
    from cast_rl.models.chat import render
    from cast_rl.rollout.tokens import _special_split, encode_context

    _, data, tok = setup
    assert _special_split(tok) is not None, "the tiny tokenizer's special tokens should allow cuts"
    task = data.task("train", 0)
    messages = [
        {"role": "system", "content": data.policy},
        {"role": "user", "content": task.instruction + " <|im_end|>x<|im_start|>"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "find_user_id_by_email", "arguments": '{"email": "a@b.c"}'}}]},
        {"role": "tool", "content": '{"error": "not found"}\n\n  spaced ', "tool_call_id": "c0"},
    ]
    text = render(tok, messages, tools=data.tools, add_generation_prompt=True)
    for piece in (text, text[5:], "\n" + text, "<|im_end|>\n<|im_start|>user\nhi", "  <|im_end|>  "):
        whole = tok(piece, add_special_tokens=False).input_ids
        assert encode_context(tok, piece) == whole
        assert encode_context(tok, piece) == whole  # the cached long pieces give the same ids
