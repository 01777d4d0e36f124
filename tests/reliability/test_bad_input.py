"""Bad input everywhere: file lines, configs, resource requests, model outputs, tool calls.

Every bad input either becomes data the run records (a malformed turn, an error observation) or
stops the run before anything starts with one line naming the file and line or the config key.

    .venv/bin/python -m pytest tests/reliability/test_bad_input.py -q
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cast_rl.config import ConfigError, load_config
from cast_rl.config.schema import DOMAIN_NAMES
from cast_rl.critique.datasets import LabelFormatError, read_labels
from cast_rl.inference.base import Completion, Sampling
from cast_rl.models.chat import TOOL_CALL_RE, ParsedTurn, parse_assistant
from cast_rl.records import (
    Trajectory,
    TrajectoryFormatError,
    read_trajectories,
    write_trajectories,
)
from launchers.cluster import Capacity, check_resources

REPO = Path(__file__).resolve().parents[2]
DEEP = "[" * 100_000 + "]" * 100_000  # valid JSON nesting deeper than the parser's recursion

# ------------------------------------------------------------------ trajectory and label lines

GOOD_TRAJ = Trajectory("retail", "test", 0, 0, 1.0, 0, [{"role": "user", "content": "hi"}]).to_json()
GOOD_LABEL = {"trajectory_index": 0, "message_index": 2, "action": {"name": "respond", "kwargs": {}},
              "verdict": "valid", "error_type": "none", "rationale": None}

BAD_TRAJECTORY_LINES = {
    "truncated": (json.dumps(GOOD_TRAJ)[:40], "not a trajectory"),
    "not_an_object": ("[1, 2, 3]", "must be a JSON object"),
    "wrong_type": (json.dumps(GOOD_TRAJ | {"task_index": "3"}), "task_index must be int, got str"),
    "unknown_key": (json.dumps(GOOD_TRAJ | {"extra": 1}), "unknown keys: extra"),
    "bad_role": (json.dumps(GOOD_TRAJ | {"messages": [{"role": "robot"}]}), r"messages\[0\] must be"),
    "bad_mask": (json.dumps(GOOD_TRAJ | {"token_ids": [1], "loss_mask": [2], "logprobs": [0.0]}),
                 "loss_mask entries must be 0 or 1"),
    "deep_nesting": (DEEP, "not a trajectory"),
    "not_utf8": (b'{"domain": "\xff\xfe"}'.decode("latin-1"), "not a trajectory"),
}


@pytest.mark.parametrize("case", sorted(BAD_TRAJECTORY_LINES))
def test_malformed_trajectory_line_names_file_and_line(case: str, tmp_path: Path) -> None:
    line, expected = BAD_TRAJECTORY_LINES[case]
    path = tmp_path / "t.jsonl"
    write_trajectories(path, [Trajectory.from_json(GOOD_TRAJ)] * 2)
    with path.open("ab") as f:
        f.write((line.encode("latin-1") if case == "not_utf8" else line.encode()) + b"\n")
    with pytest.raises(TrajectoryFormatError, match=rf"t\.jsonl:3: .*{expected}") as info:
        read_trajectories(path)
    assert "\n" not in str(info.value)


BAD_LABEL_LINES = {
    "truncated": ('{"trajectory_index": 0, "messa', "not a label"),
    "missing_key": (json.dumps({k: v for k, v in GOOD_LABEL.items() if k != "verdict"}), "missing keys: verdict"),
    "bool_index": (json.dumps(GOOD_LABEL | {"message_index": True}), "message_index must be an integer"),
    "bad_verdict": (json.dumps(GOOD_LABEL | {"verdict": "maybe"}), "verdict must be valid or invalid"),
    "bad_rationale": (json.dumps(GOOD_LABEL | {"rationale": "text"}), "rationale must be an object or null"),
    "deep_nesting": (DEEP, "not a label"),
}


@pytest.mark.parametrize("case", sorted(BAD_LABEL_LINES))
def test_malformed_label_line_names_file_and_line(case: str, tmp_path: Path) -> None:
    line, expected = BAD_LABEL_LINES[case]
    path = tmp_path / "labels.jsonl"
    path.write_text(json.dumps(GOOD_LABEL) + "\n\n" + line + "\n")
    with pytest.raises(LabelFormatError, match=rf"labels\.jsonl:3: .*{expected}"):
        read_labels(path)


# ------------------------------------------------------------------ configs and resources


@pytest.mark.parametrize(
    ("yaml_text", "expected"),
    [
        ("rollout:\n  num_workers: [1, 2]\n", "rollout.num_workers"),
        ("rollout:\n  num_workers: two\n", "rollout.num_workers='two' is not allowed; expected int"),
        ("critic:\n  service: maybe\n", "critic.service='maybe' is not allowed; expected bool"),
        ("env: retail\n", "env='retail' is not allowed; expected a mapping with keys domain,"),
        ("env:\n  task_indices: 3\n", "env.task_indices=3 is not allowed; expected list"),
        ("env:\n  max_stepz: 3\n", "unknown key 'env.max_stepz'"),
        ("critic:\n  timeout_s: 0\n", "critic.timeout_s=0.0 is not allowed; it must be > 0"),
        ("- just\n- a list\n", "must hold a mapping"),
        ("rollout: {num_workers: 1\n", "is not valid YAML"),
    ],
)
def test_config_with_wrong_types_or_unknown_keys_fails_in_one_line(
    yaml_text: str, expected: str, tmp_path: Path
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml_text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert expected in str(info.value)
    assert "\n" not in str(info.value)


CPU_ONLY = Capacity({"CPU": 2.0, "GPU": 0.0}, {"CPU": 2.0, "GPU": 0.0}, "the test cluster")


@pytest.mark.parametrize(
    ("overrides", "parts", "expected"),
    [
        (["rollout.num_gpus_per_worker=1"], ("rollout",),
         "rollout.num_gpus_per_worker=1 cannot be placed: the largest node of the test cluster has 0 GPUs; "
         "set rollout.num_gpus_per_worker=0"),
        (["learner.num_gpus_per_worker=0.5"], ("rollout", "learner"), "learner.num_gpus_per_worker=0.5"),
        (["rollout.num_cpus_per_worker=4"], ("rollout",), "rollout.num_cpus_per_worker=4 cannot be placed"),
        (["rollout.num_workers=2", "learner.num_workers=2"], ("rollout", "learner"),
         "rollout.num_workers=2 x rollout.num_cpus_per_worker=1 + learner.num_workers=2 x "
         "learner.num_cpus_per_worker=1 need 4 CPUs at once, but the test cluster has 2"),
        (["critic.backend=model", "critic.num_replicas=3", "rollout.num_workers=1"], ("rollout", "critic"),
         "critic.num_replicas=3"),
        (["critic.backend=trained", "pipeline.critic_train_steps=1", "critic.num_gpus_per_replica=1"],
         ("rollout", "critic"),
         "critic.num_gpus_per_replica=1 cannot be placed: the largest node of the test cluster has 0 GPUs"),
    ],
)
def test_impossible_resource_requests_name_the_key(
    overrides: list[str], parts: tuple[str, ...], expected: str
) -> None:
    cfg = load_config(None, overrides)
    with pytest.raises(ConfigError) as info:
        check_resources(cfg, parts, capacity=CPU_ONLY)
    assert expected in str(info.value) and "\n" not in str(info.value)


def test_possible_requests_pass_the_check() -> None:
    check_resources(load_config(None, ["rollout.num_workers=2"]), ("rollout", "critic"), capacity=CPU_ONLY)
    check_resources(load_config(None, ["rollout.num_workers=1", "learner.num_workers=1"]),
                    ("rollout", "learner"), capacity=CPU_ONLY)
    quickstart = load_config(REPO / "configs" / "quickstart.yaml")
    # The local Ray the quickstart starts has cluster.num_cpus logical CPUs (whatever Ray this
    # test session happens to run).
    own = {"CPU": float(quickstart.cluster.num_cpus), "GPU": 0.0}
    check_resources(quickstart, ("rollout", "learner", "critic"), capacity=Capacity(own, own, "local"))


def test_cli_stops_an_impossible_rollout_before_ray_starts(
    tmp_path: Path, tiny_model_dir: Path, retail_data_dir: Path
) -> None:
    """``cast-rl rollout`` with a GPU per worker on this CPU machine: one line, exit 2, no Ray."""
    out = tmp_path / "t.jsonl"
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "cast_rl.cli", "--log-level", "WARNING", "rollout", "default",
         f"policy.path={tiny_model_dir}", f"env.data_dir={retail_data_dir}", f"run_dir={run_dir}",
         "rollout.num_gpus_per_worker=1", "--out", str(out)],
        capture_output=True, text=True, cwd=REPO, timeout=300,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines[-1].startswith("config error: rollout.num_gpus_per_worker=1 cannot be placed")
    assert "Started a local Ray instance" not in proc.stderr
    assert not out.exists()


# ------------------------------------------------------------------ model outputs


def _reference_parse(text: str) -> ParsedTurn:
    """The regex formulation ``parse_assistant`` must agree with (quadratic on some inputs)."""
    calls: list[dict[str, Any]] = []
    errors: list[str] = []
    from cast_rl.models.chat import _parse_call

    for match in TOOL_CALL_RE.finditer(text):
        _parse_call(match.group(1).strip(), calls, errors)
    content = TOOL_CALL_RE.sub("", text)
    if "<tool_call>" in content:
        errors.append("unterminated <tool_call> block")
        content = content[: content.index("<tool_call>")]
    return ParsedTurn(content=content.strip(), tool_calls=calls, errors=errors)


_PIECES = st.sampled_from([
    "<tool_call>", "</tool_call>", "<tool_", "call>", '{"name": "get_user_details"', ', "arguments": ',
    '{"user_id": "u1"}', "}", "[", "]", '"', "\n", " ", "hello", "\ufffd", "\x00", "é", "{", "null",
])


@settings(max_examples=400, deadline=None)
@given(st.lists(_PIECES, max_size=30).map("".join))
def test_parse_assistant_matches_the_regex_formulation(text: str) -> None:
    assert parse_assistant(text) == _reference_parse(text)


@pytest.mark.parametrize(
    ("text", "calls", "error"),
    [
        ("", 0, None),
        ("x" * 100_000, 0, None),
        ("<tool_call>" * 10_000, 0, "unterminated <tool_call> block"),  # linear, not quadratic
        ('<tool_call>{"name": "a", "arguments": {}}</tool_call>' * 2_000, 2_000, None),
        (f'<tool_call>{{"name": "a", "arguments": {DEEP}}}</tool_call>', 0, "not valid JSON"),
        ('<tool_call>{"name": "a", "arguments": "' + DEEP + '"}</tool_call>', 0, "not valid JSON"),
        ("\ufffd\ufffd<tool_call>\ufffd</tool_call>", 0, "not valid JSON"),
    ],
    ids=["empty", "100k_plain", "10k_open_tags", "2k_calls", "deep_json", "deep_string_args", "replacement_chars"],
)
def test_parse_assistant_survives_huge_empty_and_garbled_outputs(text: str, calls: int, error: str | None) -> None:
    parsed = parse_assistant(text)
    assert len(parsed.tool_calls) == calls
    if error is None:
        assert parsed.errors == []
    else:
        assert any(error in e for e in parsed.errors)


class RawEngine:
    """Returns fixed token ids for every turn (what a misbehaving model could emit)."""

    def __init__(self, tokenizer: Any, ids: list[int]) -> None:
        self.tokenizer, self.ids = tokenizer, ids

    async def generate(self, prompt_ids: list[int], sampling: Sampling) -> Completion:
        return Completion(text="", token_ids=list(self.ids), logprobs=[-1.0] * len(self.ids))


def _broken_utf8_ids(tok: Any) -> list[int]:
    """Ids of the first two bytes of a four-byte character: they decode to replacement chars."""
    ids: list[int] = []
    for ch in "\U0001f600\U0001f9ea\u20ac":
        ids += [i for i in tok(ch, add_special_tokens=False).input_ids]
    for n in range(1, len(ids)):
        if "\ufffd" in tok.decode(ids[:n]):
            return ids[:n]
    pytest.fail("the tokenizer merges every multi-byte character into whole tokens")


@pytest.fixture(scope="module")
def runner_setup(tiny_model_dir: Path, retail_data_dir: Path):  # noqa: ANN201
    from transformers import AutoTokenizer

    from cast_rl.envs.core import load_domain_data

    return AutoTokenizer.from_pretrained(tiny_model_dir), load_domain_data("retail", retail_data_dir)


@pytest.mark.parametrize("kind", ["empty", "eos_only", "not_utf8", "huge"])
def test_runner_records_huge_empty_and_non_utf8_completions(kind: str, runner_setup, tmp_path: Path) -> None:  # noqa: ANN001
    from cast_rl.rollout.runner import EpisodeRunner, EpisodeSpec

    tok, data = runner_setup
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    ids = {
        "empty": [],
        "eos_only": [eos],
        "not_utf8": _broken_utf8_ids(tok) + [eos],
        "huge": tok("<tool_call>" * 4_000 + "x" * 56_000, add_special_tokens=False).input_ids,
    }[kind]
    cfg = load_config(None, [f"env.data_dir={data.data_dir}", "env.split=train", "env.max_steps=3",
                             "inference.max_model_len=16384"])
    runner = EpisodeRunner(cfg, data, RawEngine(tok, ids))
    (traj,) = asyncio.run(runner.run_many([EpisodeSpec("train", 0, 0)]))
    policy_turns = [m for m in traj.messages if m["role"] == "assistant"]
    assert policy_turns, "the policy's turn is kept as data"
    if kind == "huge":  # a 60k-character turn fills the context: the episode ends, recorded
        assert traj.info["termination"] == "context_overflow"
    elif kind == "not_utf8":  # replacement characters are text: a message to the user
        assert "\ufffd" in policy_turns[0]["content"]
        assert [m["role"] for m in traj.messages[:4]] == ["system", "user", "assistant", "user"]
        assert traj.malformed_calls == 0
    else:  # each empty turn is an error observation the policy can learn from
        assert traj.info["termination"] == "max_steps"
        assert traj.malformed_calls == 3
    assert sum(traj.loss_mask) == traj.policy_tokens
    path = tmp_path / "t.jsonl"
    write_trajectories(path, [traj])  # survives the file format
    assert read_trajectories(path)[0].to_json() == traj.to_json()


# ------------------------------------------------------------------ tool calls, every domain


def _domain_data(domain: str, retail_data_dir: Path) -> Any:
    """The domain's real data where it exists here; else its tools over an empty database."""
    from cast_rl.envs.core import DomainData, load_domain_data
    from cast_rl.envs.db import Database
    from cast_rl.envs.domain import get_domain

    if domain == "retail":
        return load_domain_data("retail", retail_data_dir)
    bench = REPO.parent / "shared" / "benchmarks" / domain
    if (bench / "db").is_dir():
        return load_domain_data(domain, bench)
    spec = get_domain(domain)
    tables = {"users": {}, "orders": {}, "products": {}, "flights": {}, "reservations": {}}
    return DomainData(domain, spec, Path("."), Database(tables), "policy", [])


@pytest.mark.parametrize("domain", DOMAIN_NAMES)
def test_fuzzed_tool_calls_never_raise_nor_touch_the_pristine_db(domain: str, retail_data_dir: Path) -> None:
    """Raw model text -> parse_assistant -> parse_tool_call -> call_tool, for every domain's tools."""
    from cast_rl.envs.core import call_tool, parse_tool_call
    from cast_rl.envs.types import Action

    data = _domain_data(domain, retail_data_dir)
    before = data.db.source_hash()
    names = sorted(data.tool_map)
    ids = [k for t in ("users", "orders", "reservations") if t in data.db for k in list(data.db[t])[:5]]
    scalar = (st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20)
              | st.sampled_from(ids or ["x"]) | st.just("x" * 200_000))
    value = st.recursive(scalar, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                         max_leaves=12)
    params = st.sampled_from(["user_id", "order_id", "reservation_id", "item_ids", "payment_method_id",
                              "data", "reason", "email", "first_name", "zip", "new_item_ids", ""])
    arguments = (st.dictionaries(params, value, max_size=5).map(json.dumps)
                 | st.text(max_size=40) | st.just(DEEP) | value.map(json.dumps) | st.none())
    name = st.sampled_from(names) | st.text(max_size=12) | st.integers() | st.none()
    checked = {"calls": 0, "actions": 0}

    def check(name: Any, raw: str | None, wrap: bool) -> None:
        if wrap and isinstance(name, str) and raw is not None:  # through the model-text parser
            text = "<tool_call>" + json.dumps({"name": name, "arguments": raw}) + "</tool_call>"
            parsed = parse_assistant(text)
            if not parsed.tool_calls:
                assert parsed.errors
                return
            name, raw = parsed.tool_calls[0]["name"], parsed.tool_calls[0]["arguments"]
        action = parse_tool_call(name, raw)
        checked["calls"] += 1
        if isinstance(action, str):
            assert action.startswith("Error:")
            return
        assert isinstance(action, Action)
        checked["actions"] += 1
        observation = call_tool(data, data.db.fork(), action, timeout_s=10.0)
        assert isinstance(observation, str)

    # Certain coverage, whatever the fuzzer draws: every tool runs with no arguments, with an id of
    # the database and with garbage, so each tool's own argument checks are reached.
    for tool in names:
        for raw in ("{}", json.dumps({"user_id": ids[0] if ids else "x", "order_id": "#W0"}), json.dumps({"x": [1]})):
            check(tool, raw, wrap=True)
    assert checked["actions"] == 3 * len(names)

    @settings(max_examples=300, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(name=name, raw=arguments, wrap=st.booleans())
    def run(name: Any, raw: str | None, wrap: bool) -> None:
        check(name, raw, wrap)

    run()
    assert checked["calls"] > 3 * len(names)  # the fuzzer's calls came on top
    assert data.db.source_hash() == before
