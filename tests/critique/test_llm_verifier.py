"""The LLM verifier's orchestration (scripted engine: logic only; the real model runs in
``bench/llm_verifier.py`` and its slow test).

A scripted engine answers each role by the schema it is asked under, and records the prompts:
privileged information reaches the checkers and never the final verdict, a rationale naming a
gold-only value is dropped and counted, hybrid keeps the rules' verdict where a rule fires, and
the labels are today's format.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cast_rl.config.schema import InferenceConfig, LabellerConfig, ModelConfig
from cast_rl.critique import llm_roles as roles
from cast_rl.critique.gold import gold_trajectory
from cast_rl.critique.inject import inject
from cast_rl.critique.labeller import Labeller
from cast_rl.critique.llm_verifier import (
    PRIVILEGED_HEADER,
    LLMVerifier,
    label_trajectories,
    state_difference,
)
from cast_rl.critique.rationale import Rationale
from cast_rl.envs.core import DomainData, load_domain_data
from cast_rl.inference.base import Completion, Sampling

ROLE_KEYS = {"rules": "rule_extractor", "tools": "tool_extractor", "ungrounded": "hallucination",
             "violation": "domain_violation", "wrong_tool_usage": "tool_call", "label": "final_verdict"}


def role_of(schema: dict[str, Any]) -> str:
    return next(role for key, role in ROLE_KEYS.items() if key in schema["properties"])


class Scripted:
    """Answers each role with ``answer(role, schema, user prompt)`` and records every call."""

    def __init__(self, answer: Callable[[str, dict[str, Any], str], Any]) -> None:
        self.answer = answer
        self.calls: list[tuple[str, list[dict[str, str]]]] = []

    async def chat(self, messages: list[dict[str, str]], sampling: Sampling, tools: Any = None) -> Completion:
        assert sampling.json_schema is not None  # every role is decoded under its schema
        role = role_of(sampling.json_schema)
        self.calls.append((role, messages))
        out = self.answer(role, sampling.json_schema, messages[-1]["content"])
        text = out if isinstance(out, str) else json.dumps(out)
        return Completion(text=text, token_ids=[1] * 5, prompt_tokens=100)


def valid_everywhere(role: str, schema: dict[str, Any], user: str) -> dict[str, Any]:
    return {
        "rule_extractor": lambda: {"rules": schema["properties"]["rules"]["items"]["enum"][:1]},
        "tool_extractor": lambda: {"tools": []},
        "hallucination": lambda: {"ungrounded": [], "hallucination": False},
        "domain_violation": lambda: {"rule": "none", "violation": False},
        "tool_call": lambda: {"problem": "", "wrong_tool_usage": False},
        "final_verdict": lambda: {"label": schema["properties"]["label"]["enum"][0], "evidence": [],
                                  "clause": "none", "explanation": "The call follows the request.", "fix": ""},
    }[role]()


@pytest.fixture(scope="module")
def data(retail_data_dir: Path) -> DomainData:
    return load_domain_data("retail", retail_data_dir)


def _run(verifier: LLMVerifier, trajectories: list) -> list:
    return asyncio.run(verifier.label(trajectories))


def test_privileged_information_reaches_the_checkers_and_never_the_rationale(data: DomainData) -> None:
    trajectory = gold_trajectory(data, "train", 0)
    gold = data.task("train", 0).actions
    secret = "#W9999999"  # a value only a leaking verdict would write

    def answer(role: str, schema: dict[str, Any], user: str) -> Any:
        if role == "final_verdict":
            return {"label": "valid", "evidence": [], "clause": "none",
                    "explanation": f"Fine, unlike order {secret}.", "fix": ""}
        return valid_everywhere(role, schema, user)

    engine = Scripted(answer)
    verifier = LLMVerifier(engine, data)
    labels = _run(verifier, [trajectory])
    write = next(a for a in gold if a.name != "respond" and a.kwargs)
    gold_text = json.dumps(write.kwargs, ensure_ascii=False)
    checker_prompts = [m[-1]["content"] for role, m in engine.calls if role in roles.CHECKERS]
    verdict_prompts = [m[-1]["content"] for role, m in engine.calls if role == "final_verdict"]
    assert checker_prompts and all(PRIVILEGED_HEADER in p and gold_text in p and "Outcome:" in p
                                   for p in checker_prompts)
    assert all("Final state against the gold final state: the same" in p for p in checker_prompts)
    assert verdict_prompts and not any(PRIVILEGED_HEADER in p or "Gold actions" in p for p in verdict_prompts)
    # every rationale named the secret: each is dropped, the verdicts stand, the leaks counted
    assert labels and all(lab.verdict == "valid" and lab.rationale is None for lab in labels)
    assert verifier.counts.leaks == verifier.counts.rationales == len(labels)
    assert verifier.stats.leakage_drops == len(labels)
    assert verifier.metrics()["label/verifier_leakage_rate"] == 1.0


def test_final_verdict_writes_todays_label_format(data: DomainData) -> None:
    injected = inject("fabricated_id", data, "train", 0)
    assert injected is not None

    def answer(role: str, schema: dict[str, Any], user: str) -> Any:
        if role == "hallucination" and f"# Action (message {injected.message_index})" in user:
            return {"ungrounded": ["an order id"], "hallucination": True}
        if role == "final_verdict" and f"# Action (message {injected.message_index})" in user:
            first_user = 1
            quote = injected.trajectory.messages[first_user]["content"][:20]
            return {"label": "hallucination", "evidence": [{"message": first_user, "quote": quote}],
                    "clause": "none", "explanation": "The id in the call appears nowhere in the conversation.",
                    "fix": "Ask the customer for the order id."}
        return valid_everywhere(role, schema, user)

    verifier = LLMVerifier(Scripted(answer), data)
    labels = _run(verifier, [injected.trajectory])
    rules = Labeller(data).label(injected.trajectory, 0)
    assert [(lab.message_index, lab.call_index) for lab in labels] == [(r.message_index, r.call_index) for r in rules]
    (target,) = [lab for lab in labels if lab.message_index == injected.message_index]
    assert (target.verdict, target.error_type, target.source) == ("invalid", "hallucination", "llm:hallucination")
    row = target.to_json()
    assert set(row) >= {"trajectory_index", "message_index", "action", "verdict", "error_type", "rationale", "source"}
    rationale = Rationale.from_json(row["rationale"])
    assert rationale.verdict == "invalid" and rationale.evidence[0].message_index == 1
    assert target.decisive  # the failed trajectory's first invalid action that ran
    assert verifier.stats.failed == 1 and verifier.stats.decisive_types["hallucination"] == 1
    metrics = verifier.metrics()
    assert metrics["label/verifier_parse_rate"] == 1.0
    assert metrics["label/verifier_calls"] == sum(verifier.counts.calls.values()) > 0


def test_hybrid_keeps_the_rules_verdict_where_a_rule_fires(data: DomainData) -> None:
    injected = inject("missing_confirmation", data, "train", 0)
    assert injected is not None
    rules = Labeller(data).label(injected.trajectory, 0)
    (ruled,) = [r for r in rules if r.message_index == injected.message_index]
    assert ruled.verdict == "invalid"

    def answer(role: str, schema: dict[str, Any], user: str) -> Any:
        if role == "final_verdict":
            # the explainer of a rule-decided action may only choose the rule's label
            if f"# Action (message {injected.message_index})" in user:
                assert schema["properties"]["label"]["enum"] == [ruled.error_type]
            return {"label": schema["properties"]["label"]["enum"][-1], "evidence": [], "clause": "none",
                    "explanation": "The agent made the change with #W0000000.", "fix": ""}
        return valid_everywhere(role, schema, user)

    engine = Scripted(answer)
    verifier = LLMVerifier(engine, data, backend="hybrid")
    labels = _run(verifier, [injected.trajectory])
    (target,) = [lab for lab in labels if lab.message_index == injected.message_index]
    assert (target.verdict, target.error_type, target.source) == (ruled.verdict, ruled.error_type, ruled.source)
    assert target.rationale == ruled.rationale  # the LLM's leaked (#W0000000), so the rules' explains it
    assert verifier.counts.rule_decided == sum(r.verdict == "invalid" for r in rules) >= 1
    assert verifier.counts.fallbacks >= 1
    # a rule decided there: no checker was asked about that action
    asked = [m[-1]["content"] for role, m in engine.calls if role in roles.CHECKERS]
    assert not any(f"# Action (message {injected.message_index})" in p for p in asked)
    # where no rule fires, the LLM decides (here: wrong_tool_usage on every action the rules call valid)
    others = [lab for lab in labels if lab.message_index != injected.message_index]
    assert others and all(lab.error_type == "wrong_tool_usage" and lab.source == "llm:tool_call" for lab in others
                          if lab.action["name"] != "respond")


def test_unparsable_answers_are_counted_and_the_checkers_decide(data: DomainData) -> None:
    injected = inject("fabricated_id", data, "train", 0)
    assert injected is not None

    def answer(role: str, schema: dict[str, Any], user: str) -> Any:
        if role == "final_verdict":
            return '{"label": "valid", "evid'  # a truncated answer
        if role == "hallucination":
            return {"ungrounded": ["x"], "hallucination": True}
        return valid_everywhere(role, schema, user)

    verifier = LLMVerifier(Scripted(answer), data)
    labels = _run(verifier, [injected.trajectory])
    assert all(lab.error_type == "hallucination" and lab.source == "llm:checkers" and lab.rationale is None
               for lab in labels)
    assert verifier.counts.parse_failures["final_verdict"] == len(labels)
    assert verifier.metrics()["label/verifier_parse_rate"] < 1.0


def test_label_trajectories_uses_the_given_engine(data: DomainData) -> None:
    cfg = LabellerConfig(backend="llm", model=ModelConfig(path="unused", make_tiny_if_missing=False))
    labels, stats, metrics = asyncio.run(label_trajectories(cfg, data, [gold_trajectory(data, "train", 1)],
                                                            engine=Scripted(valid_everywhere)))
    assert labels and stats.trajectories == 1 and metrics["label/verifier_parse_rate"] == 1.0


def test_state_difference_names_the_records() -> None:
    assert state_difference({}, {}) == "the same"
    text = state_difference({("orders", "#W1"): {"status": "cancelled"}}, {("orders", "#W2"): {"status": "x"}})
    assert "orders #W1: changed, but the gold leaves it unchanged" in text
    assert "orders #W2: unchanged, but the gold changes it" in text


def test_decode_reads_each_role_and_refuses_the_rest() -> None:
    assert roles.decode("tool_call", '{"problem": "", "wrong_tool_usage": false}') == roles.ToolCallAnswer("", False)
    assert roles.decode("tool_call", '{"problem": "", "wrong_tool_usage": "no"}') is None
    assert roles.decode("final_verdict", '{"label": "maybe", "evidence": [], "clause": "none", '
                        '"explanation": "", "fix": ""}') is None
    assert roles.decode("hallucination", "not json") is None


def test_labeller_config_validation() -> None:
    assert LabellerConfig().backend == "rules"
    with pytest.raises(ValueError, match="labeller.backend='oracle'"):
        LabellerConfig(backend="oracle")
    with pytest.raises(ValueError, match="labeller.model.path='' is not allowed with labeller.backend=llm"):
        LabellerConfig(backend="llm")
    with pytest.raises(ValueError, match="labeller.inference.backend='expert'"):
        LabellerConfig(backend="hybrid", model=ModelConfig(path="m", make_tiny_if_missing=False),
                       inference=InferenceConfig(backend="expert"))
    with pytest.raises(ValueError, match="labeller.num_gpus"):
        LabellerConfig(num_gpus=-1)
    with pytest.raises(ValueError, match="regex and json_schema"):
        Sampling(regex="a", json_schema={"type": "object"})


def test_vllm_requests_carry_the_json_schema() -> None:
    from cast_rl.inference.vllm_engine import _structured

    class Params:
        def __init__(self, **kwargs: Any) -> None:
            self.kwargs = kwargs

    schema = {"type": "object"}
    assert _structured(Sampling(json_schema=schema), Params).kwargs == {"json": schema}
    assert _structured(Sampling(regex="a+"), Params).kwargs == {"regex": "a+"}
    assert _structured(Sampling(), Params) is None


def test_verifier_engine_builds_its_tiny_model_when_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``labeller.model.make_tiny_if_missing`` is honoured as the user's and the critic's is: the
    CPU rehearsal (configs/paper/rehearsal_cpu.yaml) points the verifier at a directory that does
    not exist yet; before, the engine was started on it and failed."""
    from cast_rl.critique import llm_verifier

    started: list[str] = []
    monkeypatch.setattr(llm_verifier, "build_engine", lambda path, cfg, seed=0, dtype=None: started.append(path) or "engine")
    cfg = LabellerConfig(backend="llm", model=ModelConfig(path=str(tmp_path / "tiny-verifier"), make_tiny_if_missing=True))
    assert llm_verifier.build_verifier_engine(cfg) == "engine"
    assert started == [str(tmp_path / "tiny-verifier")] and (tmp_path / "tiny-verifier" / "config.json").exists()
    missing = LabellerConfig(backend="llm", model=ModelConfig(path=str(tmp_path / "absent"), make_tiny_if_missing=False))
    with pytest.raises(FileNotFoundError, match="absent"):
        llm_verifier.build_verifier_engine(missing)
    endpoint = LabellerConfig(backend="llm", model=ModelConfig(path="a-served-name", make_tiny_if_missing=False),
                              inference=InferenceConfig(backend="openai", base_url="http://127.0.0.1:1/v1"))
    llm_verifier.build_verifier_engine(endpoint)  # an endpoint's model is a name, not a directory
    assert started[-1] == "a-served-name"
