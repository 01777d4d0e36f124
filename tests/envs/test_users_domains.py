"""Scripted users on all four benchmark domains, with the expert policy through the real runner.

Needs the public benchmark data at ``../shared/benchmarks`` (relative to the repo root); skips
with the reason when it is absent.  The expert needs only a tokenizer: a tiny one is built once.

Run: .venv/bin/python -m pytest tests/envs/test_users_domains.py -q
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from cast_rl.config import load_config
from cast_rl.config.schema import DOMAIN_NAMES as DOMAINS
from cast_rl.config.schema import CastConfig
from cast_rl.envs.core import DomainData, Episode, load_domain_data
from cast_rl.envs.types import RESPOND, STOP_TOKEN, Action
from cast_rl.envs.users import ScriptedUser, Trait, build_user
from cast_rl.envs.users.goals import domain_of, gold_effects, identity_line
from cast_rl.rollout.expert import (
    ExpertPolicy,
    ExpertTokenizer,
    ExpertTurn,
    expert_plan,
    is_affirmative,
)
from cast_rl.rollout.runner import EpisodeRunner, EpisodeSpec

BENCHMARKS = Path(__file__).resolve().parents[2].parent / "shared" / "benchmarks"
pytestmark = pytest.mark.skipif(
    not BENCHMARKS.is_dir(), reason=f"benchmark data not found at {BENCHMARKS} (../shared/benchmarks)"
)


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    from cast_rl.models.tiny import make_tiny_model

    out = tmp_path_factory.mktemp("tiny") / "tiny"
    make_tiny_model(out, seed=0)
    return str(out)


def _data(domain: str) -> DomainData:
    return load_domain_data(domain, BENCHMARKS / domain)


def _cfg(domain: str, *overrides: str) -> CastConfig:
    return load_config(None, [
        f"env.domain={domain}", f"env.data_dir={BENCHMARKS / domain}", "env.max_steps=8",
        "inference.backend=expert", "inference.max_model_len=512", *overrides,
    ])


def _expert_run(domain: str, tokenizer_dir: str, *overrides: str, indices: list[int] | None = None):
    cfg = _cfg(domain, *overrides)
    data = _data(domain)
    runner = EpisodeRunner(cfg, data, ExpertTokenizer(tokenizer_dir))
    indices = indices if indices is not None else list(range(len(data.tasks("test"))))
    return asyncio.run(runner.run_many([EpisodeSpec("test", i, 0) for i in indices]))


@pytest.mark.parametrize("domain", DOMAINS)
def test_expert_solves_every_test_task(domain: str, tokenizer_dir: str) -> None:
    """Users, environments and reward agree: the expert earns 1.0 on every task, and the scripted
    user ends each conversation itself (no step limit; env.max_steps=8 does not bind the expert)."""
    trajectories = _expert_run(domain, tokenizer_dir)
    failed = [(t.task_index, t.info["termination"]) for t in trajectories if t.reward != 1.0]
    assert not failed
    endings = {t.info["termination"] for t in trajectories}
    assert endings <= {"user_stop", "terminate_tool"}, endings
    assert all(t.info["tokens_consistent"] for t in trajectories)


def test_identity_reveals_only_what_the_instruction_states() -> None:
    data = _data("telehealth")
    task = data.task("test", 0)  # "You are Sarah Johnson, born March 15, 1985."
    name, answer, email = identity_line("telehealth", data.db, task)
    assert name == "Sarah Johnson" and "1985-03-15" in answer and email == ""
    airline = _data("airline")
    task = airline.task("test", 0)  # "Your user id is mia_li_3668 ... do not prefer to provide [the birthday]"
    _, answer, _ = identity_line("airline", airline.db, task)
    assert "mia_li_3668" in answer and "1990-04-05" not in answer
    assert [domain_of(_data(d).db) for d in DOMAINS] == list(DOMAINS)


def test_vacuous_requests_come_from_failing_gold_writes() -> None:
    """Retail test task 64 exchanges an order that is not delivered: the write changes nothing."""
    data = _data("retail")
    effects = gold_effects("retail", data.db, data.task("test", 64))
    assert effects[0] == {} and effects[1]  # the failing exchange, then a write that works
    effects = gold_effects("retail", data.db, data.task("test", 0))
    assert len(effects) == 1 and ("orders", "#W2378156") in effects[0]


def _say(text: str) -> Action:
    return Action(RESPOND, {"content": text})


def test_generic_user_confirms_only_its_request_and_stops_after_the_write() -> None:
    data = _data("telehealth")
    task = data.task("test", 0)
    gold = task.actions[0]
    episode = Episode(data, "test", 0, ScriptedUser(), max_steps=None)
    opening = asyncio.run(episode.reset())
    assert opening.startswith("Hi! I'd like to schedule appointment") and "2025-09-23" in opening
    wrong = dict(gold.kwargs, time="11:00")
    reply = asyncio.run(episode.step(_say(f"Shall I schedule_appointment with {json.dumps(wrong)}? Please confirm.")))
    assert reply.observation.startswith("No, that is not what I want.") and "10:00" in reply.observation
    reply = asyncio.run(episode.step(_say("What date would you like?")))
    assert reply.observation == "The date is 2025-09-23."
    reply = asyncio.run(episode.step(_say(f"Shall I schedule_appointment with {json.dumps(gold.kwargs)}? Please confirm.")))
    assert reply.observation == "Yes, please go ahead."
    assert asyncio.run(episode.step(_say("All done!"))).observation != STOP_TOKEN  # not in the DB yet
    asyncio.run(episode.step(gold))
    result = asyncio.run(episode.step(_say("Your appointment is booked.")))
    assert result.observation == STOP_TOKEN and result.reward == 1.0


def test_user_waits_for_required_outputs() -> None:
    data = _data("telecom")
    index = next(i for i, t in enumerate(data.tasks("test")) if t.outputs)
    task = data.task("test", index)
    user = ScriptedUser()
    episode = Episode(data, "test", index, user, max_steps=None)
    asyncio.run(episode.reset())
    for action in task.actions:  # every write done, no output said yet
        if action.name in data.spec.write_tools:
            asyncio.run(episode.step(action))
    assert asyncio.run(episode.step(_say("Done. Anything else?"))).observation != STOP_TOKEN
    said = "Here you go: " + "; ".join(task.outputs)
    assert asyncio.run(episode.step(_say(said))).observation == STOP_TOKEN


def test_fork_branches_the_user_state() -> None:
    data = _data("airline")
    index = next(i for i, t in enumerate(data.tasks("test")) if sum(a.name in data.spec.write_tools for a in t.actions) >= 1)
    user = ScriptedUser(trait=Trait("incoherence", "high"), seed=7)
    episode = Episode(data, "test", index, user, max_steps=None)
    asyncio.run(episode.reset())
    asyncio.run(episode.step(_say("How can I help?")))
    child = user.fork()
    branch = episode.env.fork()
    child.observe_db(branch.db)
    for action in data.task("test", index).actions:
        if action.name in data.spec.write_tools:
            branch.step(action)
    # the same next message: the parent and a fresh copy of the fork's state agree until the
    # databases differ; the fork sees its branch's writes and the parent does not
    twin = child.fork()
    assert asyncio.run(child.step("Anything else?")) == asyncio.run(twin.step("Anything else?"))
    assert asyncio.run(user.step("Anything else?")) != STOP_TOKEN
    assert child.events[: len(user.events) - 1] == user.events[:-1]


def test_scripted_user_is_deterministic_per_seed_with_a_trait(tokenizer_dir: str) -> None:
    def replies(seed: str) -> list[list[str]]:
        trajectories = _expert_run("airline", tokenizer_dir, "user.trait=incoherence", "user.trait_level=high", seed, indices=[0, 1, 2, 3])
        return [[m["content"] for m in t.messages if m["role"] == "user"] for t in trajectories]

    assert replies("seed=0") == replies("seed=0")
    assert replies("seed=0") != replies("seed=1")


@pytest.mark.parametrize("trait", ["impatience", "confusion", "skepticism", "incoherence"])
def test_each_trait_shows_in_the_conversation(trait: str, tokenizer_dir: str) -> None:
    trajectories = _expert_run("retail", tokenizer_dir, f"user.trait={trait}", "user.trait_level=high", indices=list(range(12)))
    replies = [m["content"] for t in trajectories for m in t.messages if m["role"] == "user"]
    marks = {
        "impatience": "I don't have all day", "confusion": "I'm confused",
        "skepticism": "double-check", "incoherence": "what was the question",
    }
    hurried = [r for r in replies if any(h in r for h in ("speed this up", "be quick", "all day"))]
    assert any(marks[trait] in r for r in replies) or (trait == "impatience" and hurried)
    baseline = _expert_run("retail", tokenizer_dir, indices=list(range(12)))
    assert sum(t.reward for t in trajectories) <= sum(t.reward for t in baseline) == 12.0


def test_impatient_user_leaves_a_long_conversation() -> None:
    trait = Trait("impatience", "high")
    assert not trait.gives_up(6) and trait.gives_up(7)
    with pytest.raises(ValueError, match="user.trait="):
        Trait("grumpy")


def test_expert_asks_again_then_skips_a_refused_write(tokenizer_dir: str) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    plan = [ExpertTurn("say", "Who are you?"), ExpertTurn("confirm", "Shall I? (yes/no)"),
            ExpertTurn("call", "<tool_call>x</tool_call>"), ExpertTurn("say", "Done. Anything else?"),
            ExpertTurn("say", "Goodbye.")]
    expert = ExpertPolicy(tok, plan, max_asks=2)
    assert expert.next_turn("") == "Who are you?"
    assert expert.next_turn("") == "Shall I? (yes/no)"
    assert expert.next_turn("Hmm, what?") == "Shall I? (yes/no)"
    assert expert.next_turn("No, wait.") == "I understand; I will not make that change."
    assert expert.next_turn("ok") == "Goodbye." and expert.skipped_writes == 1
    expert = ExpertPolicy(tok, plan)
    expert.next_turn(""), expert.next_turn("")
    assert expert.next_turn("Yes, please go ahead.") == "<tool_call>x</tool_call>"
    assert is_affirmative("Sure, go ahead") and not is_affirmative("Yes... no, wait.")
    assert not is_affirmative("Are you sure that is right? Please double-check it before I agree.")


def test_expert_says_outputs_before_a_transfer() -> None:
    data = _data("telehealth")
    task = data.task("test", 13)  # transfers at action 18 of 21
    plan = expert_plan(task, data.spec.write_tools, data.spec.terminate_tools)
    transfer = next(i for i, t in enumerate(plan) if "transfer_to_human_support" in t.text)
    if task.outputs:
        assert any(o in plan[transfer - 1].text for o in task.outputs)
    with pytest.raises(ValueError, match="user.inference.backend='expert'"):
        load_config(None, ["user.inference.backend=expert"])
    assert build_user(_cfg("airline").user, seed=3).seed == 3  # type: ignore[attr-defined]
