"""Policies above the engine: the runner picks one policy, scripted policies read messages.

The scripted policies (gold-plan expert, noisy teacher, fixed script) decide from the episode's
messages, read turn by turn as the chat template writes them (:func:`chat_turns`); these tests
pin that reading to the template's own rendering, so that it decides exactly as reading the
rendered prompt did.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re

import pytest

from cast_rl.critique.verifier import RuleVerifier
from cast_rl.envs.types import Action
from cast_rl.rollout.expert import ExpertTokenizer, GoldExpert, ScriptPolicy, expert_limits
from cast_rl.rollout.noisy_expert import NoisyExpertPolicy
from cast_rl.rollout.policy import ModelPolicy, action_text, chat_turns, tool_call_text
from cast_rl.rollout.runner import EpisodeRunner, EpisodeSpec, Policy, build_policy

_TURN = re.compile(r"<\|im_start\|>(\w+)\n(.*?)<\|im_end\|>", re.S)


@pytest.fixture(scope="module")
def setup(compact_cancel):  # noqa: ANN001, ANN201
    return compact_cancel(5, 4)


@pytest.mark.parametrize(("error", "critic"), [(None, False), ("wrong_argument", True), ("fabricated_id", False)])
def test_chat_turns_read_the_messages_as_the_template_writes_them(setup, error, critic) -> None:  # noqa: ANN001
    cfg, data, tok = setup
    if critic:
        cfg = dataclasses.replace(cfg, critic=dataclasses.replace(cfg.critic, verification_budget=1))
    policy = NoisyExpertPolicy(tok, data.task("train", 0), data.spec.write_tools, error)
    runner = EpisodeRunner(cfg, data, policy, RuleVerifier({"retail": data.tools}) if critic else None)
    traj = asyncio.run(runner.run(EpisodeSpec("train", 0, 0)))
    assert traj.reward == 1.0 or not critic and error
    assert any(m["role"] == "tool" for m in traj.messages) and any(m.get("name") == "critic" for m in traj.messages) == critic
    for end in range(2, len(traj.messages) + 1):
        messages = traj.messages[:end]
        rendered = tok.apply_chat_template(messages, tools=data.tools, tokenize=False)
        blocks = _TURN.findall(rendered)[1:]  # the system turn also lists the tools
        assert [(role, text) for role, text, _ in chat_turns(messages)][1:] == blocks


def test_build_policy_maps_the_backend_once(setup) -> None:  # noqa: ANN001
    cfg, data, tok = setup

    class Engine:
        tokenizer = tok

        async def generate(self, prompt_ids, sampling):  # noqa: ANN001, ANN202
            raise AssertionError("not called")

    engine = Engine()
    assert isinstance(build_policy(cfg, engine), ModelPolicy) and build_policy(cfg, engine).engine is engine
    script = ScriptPolicy(tok, ["Goodbye."])
    assert isinstance(script, Policy) and build_policy(cfg, script) is script and not isinstance(engine, Policy)
    expert_cfg = dataclasses.replace(cfg, inference=dataclasses.replace(cfg.inference, backend="expert"))
    gold = build_policy(expert_cfg, engine)
    assert isinstance(gold, GoldExpert) and gold.tokenizer is tok
    assert not hasattr(ExpertTokenizer, "generate")  # the backend's placeholder carries a tokenizer only
    runner = EpisodeRunner(expert_cfg, data, engine)
    assert runner.cfg == expert_limits(expert_cfg)  # the gold expert lifts the limits, no one else
    assert EpisodeRunner(cfg, data, engine).cfg == cfg
    first = gold.for_episode(data, EpisodeSpec("train", 0, 0))
    assert first is not gold.for_episode(data, EpisodeSpec("train", 0, 0))  # a fresh expert per episode


def test_a_substituted_action_is_the_turn_a_scripted_policy_writes(setup) -> None:  # noqa: ANN001
    cfg, data, tok = setup
    call = Action(name="get_order_details", kwargs={"order_id": "#W0000001"})
    assert action_text(call) == tool_call_text(call.name, call.kwargs)
    assert action_text(Action(name="respond", kwargs={"content": "Hi."})) == "Hi."
    runner = EpisodeRunner(cfg, data, ScriptPolicy(tok, [action_text(call), "Goodbye."]))
    snapshots = {}
    played = asyncio.run(runner.run(EpisodeSpec("train", 0, 0),
                                    on_decision=lambda s: snapshots.setdefault(s.message_index, s.fork())))
    substituted = asyncio.run(runner.continue_from(snapshots[2], action=call))
    assert substituted.messages == played.messages and substituted.token_ids == played.token_ids
    assert substituted.turns[0].substituted and substituted.loss_mask != played.loss_mask
