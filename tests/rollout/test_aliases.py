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
from cast_rl.inference.base import Completion, Sampling
from cast_rl.learner.critique_samples import distill_cut
from cast_rl.models.aliases import EntityAliases, alias_tokens
from cast_rl.rollout.noisy_expert import NoisyExpertEngine
from cast_rl.rollout.runner import EpisodeRunner, EpisodeSpec
from cast_rl.rollout.tokens import ConversationTokens

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
    assert aliases.to_policy(table, "#W1000001 and #W5000005") == "[order_2] and [order_3]"
    assert alias_tokens(["order"])[:2] == ["[order_1]", "[order_2]"] and len(alias_tokens(["a", "b"])) == 16


def test_config_names_a_bad_alias_pattern() -> None:
    with pytest.raises(ValueError, match=r"policy.entity_aliases.order: '\(' is not a regular expression"):
        load_config(None, ["policy.entity_aliases={order: '('}"])
    with pytest.raises(ValueError, match="critic.model.entity_aliases is not allowed"):
        load_config(None, ["critic.model.entity_aliases={order: 'x'}"])


@pytest.fixture(scope="module")
def setup(compact_cancel):  # noqa: ANN001, ANN201
    cfg, data, tok = compact_cancel(5, 10)
    return dataclasses.replace(cfg, policy=dataclasses.replace(cfg.policy, entity_aliases=PATTERNS)), data, tok


def _teacher_episode(setup, task: int, error: str | None, critic: bool):  # noqa: ANN001, ANN202
    cfg, data, tok = setup
    cfg = dataclasses.replace(cfg, critic=dataclasses.replace(cfg.critic, verification_budget=1 if critic else 0))
    engine = NoisyExpertEngine(tok, data.task("train", task), data.spec.write_tools, error)
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
    assert not ORDER.search(seen) and "[order_1]" in seen and "[user_1]" in seen
    order_id = data.task("train", 0).actions[-1].kwargs["order_id"]
    assert order_id in traj.messages[1]["content"]  # the transcript keeps the real ids
    calls = [t.action for t in traj.turns if t.action and t.action["name"] == "get_order_details"]
    assert calls and calls[-1]["kwargs"]["order_id"] == order_id
    if error == "fabricated_id":  # the teacher's fabricated id reaches the policy's tokens as an
        # alias the conversation never introduced; recorded as written, it names no order
        assert "[order_2]" in seen and calls[0]["kwargs"]["order_id"] == "[order_2]"
    if critic:  # the distilled sample re-renders to the aliased conversation without the critique
        ids, _ = distill_cut(traj)
        (rejected,) = [t for t in traj.turns if not t.executed]
        kept = [m for i, m in enumerate(traj.messages) if i not in {rejected.message_index, rejected.message_index + 1}]
        shown, _ = EntityAliases(PATTERNS).apply(kept)
        assert ids == tok(tok.apply_chat_template(shown, tools=data.tools, tokenize=False), add_special_tokens=False).input_ids


class _AliasWriter:
    """A 'model' that writes aliases: looks up the order, then names an alias never introduced."""

    def __init__(self, tokenizer) -> None:  # noqa: ANN001
        self.tokenizer = tokenizer
        self.turns = ['<tool_call>\n{"name": "get_order_details", "arguments": {"order_id": "[order_1]"}}\n</tool_call>',
                      '<tool_call>\n{"name": "get_order_details", "arguments": {"order_id": "[order_7]"}}\n</tool_call>']
        self.prompts: list[str] = []

    async def generate(self, prompt_ids: list[int], sampling: Sampling) -> Completion:
        self.prompts.append(self.tokenizer.decode(prompt_ids))
        text = self.turns[min(len(self.prompts), 2) - 1]
        ids = [*self.tokenizer(text, add_special_tokens=False).input_ids, self.tokenizer.convert_tokens_to_ids("<|im_end|>")]
        return Completion(text=text, token_ids=ids, logprobs=[0.0] * len(ids))


def test_a_policy_writing_aliases_acts_on_the_real_ids(setup) -> None:  # noqa: ANN001
    cfg, data, tok = setup
    cfg = dataclasses.replace(cfg, env=dataclasses.replace(cfg.env, max_steps=2))
    engine = _AliasWriter(tok)
    traj = asyncio.run(EpisodeRunner(cfg, data, engine).run(EpisodeSpec("train", 0, 0)))
    order_id = data.task("train", 0).actions[-1].kwargs["order_id"]
    assert not any(ORDER.search(p) for p in engine.prompts)
    first, second = traj.turns
    assert first.action["kwargs"]["order_id"] == order_id and second.action["kwargs"]["order_id"] == "[order_7]"
    details, missing = (m["content"] for m in traj.messages if m["role"] == "tool")
    assert json.loads(details)["order_id"] == order_id  # the tool ran on the real id
    assert "not found" in missing.lower()  # an alias never introduced names nothing
    assert traj.info["tokens_consistent"]
    # without aliases the same turn names no order at all
    plain = dataclasses.replace(cfg, policy=dataclasses.replace(cfg.policy, entity_aliases={}))
    traj = asyncio.run(EpisodeRunner(plain, data, _AliasWriter(tok)).run(EpisodeSpec("train", 0, 0)))
    assert "not found" in next(m["content"] for m in traj.messages if m["role"] == "tool").lower()


def test_conversation_without_aliases_is_unchanged(setup) -> None:  # noqa: ANN001
    _, data, tok = setup
    conv = ConversationTokens(tok, data.tools)
    conv.add_context([{"role": "user", "content": "cancel #W1234567"}])
    assert "#W1234567" in tok.decode(conv.token_ids) and conv.policy_text("#W1") == "#W1"
    assert conv.env_prompt_ids() == conv.token_ids
