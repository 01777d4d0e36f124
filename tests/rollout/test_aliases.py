"""Identifier aliases (policy.entity_aliases): the policy sees and writes ``[order_1]``, everything
else keeps the real identifiers, and the token bookkeeping stays exact."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re

import pytest

from cast_rl.config import load_config
from cast_rl.critique.verifier import RuleVerifier
from cast_rl.envs.core import ToolEnv
from cast_rl.envs.types import Action
from cast_rl.inference.base import Completion, Sampling
from cast_rl.models.aliases import EntityAliases, alias_tokens
from cast_rl.rollout.noisy_expert import NoisyExpertPolicy
from cast_rl.rollout.runner import EpisodeRunner, EpisodeSpec
from cast_rl.rollout.tokens import ConversationTokens
from cast_rl.samples.builders import distill_cut

PATTERNS = {"order": r"#W\d{7}", "user": r"\b[a-z]+_[a-z]+_\d{4}\b", "email": r"[a-z0-9._]+@example\.com"}
ORDER = re.compile(r"#W\d{7}")


def test_aliases_number_identifiers_by_first_appearance_and_map_back() -> None:
    aliases = EntityAliases(PATTERNS)
    call = {"id": "c", "type": "function",
            "function": {"name": "get_order_details", "arguments": json.dumps({"order_id": "#W2000002"})}}
    messages = [
        {"role": "user", "content": "Cancel #W2000002, not #W1000001. I am ann.lee1234@example.com."},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": '{"order_id": "#W2000002", "user_id": "ann_lee_1234"}'},
    ]
    shown, table = aliases.apply(messages)
    assert shown[0]["content"] == "Cancel [order_1], not [order_2]. I am [email_1]."
    assert json.loads(shown[1]["tool_calls"][0]["function"]["arguments"]) == {"order_id": "[order_1]"}
    assert shown[2]["content"] == '{"order_id": "[order_1]", "user_id": "[user_1]"}'
    assert messages[0]["content"].startswith("Cancel #W2000002")  # the input is not modified
    # a longer conversation never renumbers its prefix
    longer, _ = aliases.apply([{"role": "user", "content": "#W3000003 too"}, *messages])
    assert longer[1]["content"] == "Cancel [order_2], not [order_3]. I am [email_1]."
    assert aliases.to_real(table, '{"order_id": "[order_2]", "x": "[order_9]"}') == '{"order_id": "#W1000001", "x": "[order_9]"}'
    assert aliases.unmapped(table, '{"order_id": "[order_2]", "x": "[order_9]", "y": "[order_9]"}') == ["[order_9]"]
    # only identifiers the conversation has shown get an alias; another one stays real
    assert aliases.to_policy(table, "#W1000001 and #W5000005") == "[order_2] and #W5000005"
    assert "#W5000005" not in table.to_alias
    assert alias_tokens(["order"])[:2] == ["[order_1]", "[order_2]"] and len(alias_tokens(["a", "b"])) == 16


def test_an_identifier_the_policy_names_first_is_not_aliased_until_the_conversation_shows_it() -> None:
    aliases = EntityAliases(PATTERNS)
    call = {"id": "c", "type": "function",
            "function": {"name": "get_order_details", "arguments": json.dumps({"order_id": "#W2000002"})}}
    messages = [
        {"role": "user", "content": "Cancel my order please."},
        {"role": "assistant", "content": "Looking at #W2000002.", "tool_calls": [call]},
        {"role": "tool", "content": '{"order_id": "#W2000002"}'},
        {"role": "assistant", "content": "#W2000002 is pending."},
    ]
    shown, table = aliases.apply(messages)
    # the assistant's own turn writes the real id (an expert that knows the gold plan); the tool
    # shows it, and from then on it is [order_1], which maps back
    assert shown[1]["content"] == "Looking at #W2000002."
    assert json.loads(shown[1]["tool_calls"][0]["function"]["arguments"]) == {"order_id": "#W2000002"}
    assert shown[2]["content"] == '{"order_id": "[order_1]"}' and shown[3]["content"] == "[order_1] is pending."
    assert table.to_real == {"[order_1]": "#W2000002"}
    assert aliases.apply(messages[:2])[0][1] == shown[1]  # a prefix renders as in the longer one


def test_config_names_a_bad_alias_pattern() -> None:
    with pytest.raises(ValueError, match=r"policy.entity_aliases.order: '\(' is not a regular expression"):
        load_config(None, ["policy.entity_aliases={order: '('}"])
    with pytest.raises(ValueError, match="labeller.model.entity_aliases is not allowed"):
        load_config(None, ["labeller.model.entity_aliases={order: 'x'}"])


@pytest.fixture(scope="module")
def setup(compact_cancel):  # noqa: ANN001, ANN201
    cfg, data, tok = compact_cancel(5, 10)
    return dataclasses.replace(cfg, policy=dataclasses.replace(cfg.policy, entity_aliases=PATTERNS)), data, tok


def _teacher_episode(setup, task: int, error: str | None, critic: bool):  # noqa: ANN001, ANN202
    cfg, data, tok = setup
    cfg = dataclasses.replace(cfg, critic=dataclasses.replace(cfg.critic, verification_budget=1 if critic else 0))
    engine = NoisyExpertPolicy(tok, data.task("train", task), data.spec.write_tools, error)
    verifier = RuleVerifier({"retail": data.tools}) if critic else None
    return asyncio.run(EpisodeRunner(cfg, data, engine, verifier).run(EpisodeSpec("train", task, 0)))


@pytest.mark.parametrize(("error", "critic", "reward"), [
    (None, False, 1.0), ("wrong_argument", False, 0.0), ("wrong_argument", True, 1.0), ("fabricated_id", True, 1.0),
])
def test_the_teacher_plays_through_aliases_and_only_the_tokens_change(setup, error, critic, reward) -> None:  # noqa: ANN001
    cfg, data, tok = setup
    traj = _teacher_episode(setup, 0, error, critic)
    assert traj.reward == reward and traj.info["tokens_consistent"]
    seen = tok.decode(traj.token_ids)
    order_id = data.task("train", 0).actions[-1].kwargs["order_id"]
    calls = [t.action for t in traj.turns if t.action and t.action["name"] == "get_order_details"]
    assert calls and calls[-1]["kwargs"]["order_id"] == order_id
    fabricated = {calls[0]["kwargs"]["order_id"]} if error == "fabricated_id" else set()
    # the policy's tokens hold no real order id but the fabricated one: no alias names an order
    # the conversation never showed, so the teacher's own turn writes it as it is
    assert set(ORDER.findall(seen)) == fabricated and "[order_1]" in seen and "[user_1]" in seen
    assert order_id in traj.messages[1]["content"]  # the transcript keeps the real ids
    if error == "fabricated_id":  # recorded as written, it names no order
        assert fabricated != {order_id}
    if critic:  # the distilled sample re-renders to the aliased conversation without the critique
        ids, _ = distill_cut(traj)
        (rejected,) = [t for t in traj.turns if not t.executed]
        kept = [m for i, m in enumerate(traj.messages) if i not in {rejected.message_index, rejected.message_index + 1}]
        shown, _ = EntityAliases(PATTERNS).apply(kept)
        assert ids == tok(tok.apply_chat_template(shown, tools=data.tools, tokenize=False), add_special_tokens=False).input_ids


class _AliasWriter:
    """A 'model' that writes aliases: looks up the order, then writes ``then`` (by default a call
    on an alias never introduced)."""

    def __init__(self, tokenizer, then: str = "") -> None:  # noqa: ANN001
        self.tokenizer = tokenizer
        self.turns = ['<tool_call>\n{"name": "get_order_details", "arguments": {"order_id": "[order_1]"}}\n</tool_call>',
                      then or '<tool_call>\n{"name": "get_order_details", "arguments": {"order_id": "[order_7]"}}\n</tool_call>']
        self.prompts: list[str] = []

    async def generate(self, prompt_ids: list[int], sampling: Sampling) -> Completion:
        self.prompts.append(self.tokenizer.decode(prompt_ids))
        text = self.turns[min(len(self.prompts), 2) - 1]
        ids = [*self.tokenizer(text, add_special_tokens=False).input_ids, self.tokenizer.convert_tokens_to_ids("<|im_end|>")]
        return Completion(text=text, token_ids=ids, logprobs=[0.0] * len(ids))


@pytest.fixture()
def env_actions(monkeypatch: pytest.MonkeyPatch) -> list[Action]:
    """Every action that reaches an environment (tool calls and replies to the user); the test
    fails at once when one carries an alias."""
    seen: list[Action] = []
    apply = ToolEnv.apply
    written = re.compile(r"\[(order|user|email)_\d+\]")

    def spy(self: ToolEnv, action: Action):  # noqa: ANN202
        seen.append(action)
        assert not written.search(json.dumps(action.kwargs)), f"an alias reached the environment: {action}"
        return apply(self, action)

    monkeypatch.setattr(ToolEnv, "apply", spy)
    return seen


@pytest.mark.parametrize("then", [
    "",  # a call on [order_7]
    "Your order [order_1] and [order_3] are cancelled.",  # a reply to the user naming one
])
def test_an_alias_the_table_cannot_map_back_is_an_error_observation(setup, env_actions, then) -> None:  # noqa: ANN001
    cfg, data, tok = setup
    cfg = dataclasses.replace(cfg, env=dataclasses.replace(cfg.env, max_steps=2))
    engine = _AliasWriter(tok, then)
    runner = EpisodeRunner(cfg, data, engine)
    traj = asyncio.run(runner.run(EpisodeSpec("train", 0, 0)))
    order_id = data.task("train", 0).actions[-1].kwargs["order_id"]
    assert not any(ORDER.search(p) for p in engine.prompts)
    first, second = traj.turns
    assert first.action["kwargs"]["order_id"] == order_id  # the known alias ran on the real id
    assert [a.kwargs for a in env_actions] == [{"order_id": order_id}]  # the second turn ran nothing
    alias = "[order_3]" if then else "[order_7]"
    assert second.action is None and second.error.startswith("Error: malformed") and alias in second.error
    assert traj.malformed_calls == 1 and runner.stats.malformed_calls == 1
    details, error = traj.messages[first.message_index + 1], traj.messages[second.message_index + 1]
    assert json.loads(details["content"])["order_id"] == order_id
    assert error == {"role": "tool", "tool_call_id": "invalid", "content": second.error}
    # the turn is kept as text: the labeller reads it as a malformed call, not one that ran
    turn = traj.messages[second.message_index]
    assert "tool_calls" not in turn and turn["content"] == (then.replace("[order_1]", order_id) or engine.turns[1])
    assert traj.info["tokens_consistent"]


def test_without_aliases_the_same_turn_names_no_order(setup, env_actions) -> None:  # noqa: ANN001
    cfg, data, tok = setup
    plain = dataclasses.replace(cfg, policy=dataclasses.replace(cfg.policy, entity_aliases={}),
                                env=dataclasses.replace(cfg.env, max_steps=2))
    with pytest.raises(AssertionError, match="an alias reached the environment"):  # the spy works
        asyncio.run(EpisodeRunner(plain, data, _AliasWriter(tok)).run(EpisodeSpec("train", 0, 0)))


def test_conversation_without_aliases_is_unchanged(setup) -> None:  # noqa: ANN001
    _, data, tok = setup
    conv = ConversationTokens(tok, data.tools)
    conv.add_context([{"role": "user", "content": "cancel #W1234567"}])
    assert "#W1234567" in tok.decode(conv.token_ids) and conv.policy_text("#W1") == "#W1"
    assert conv.env_prompt_ids() == conv.token_ids
