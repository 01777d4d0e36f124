"""Qwen3 thinking mode (``inference.thinking``) at rollout and at training, checked on token ids.

A scripted engine (a fake, for bookkeeping logic) writes each turn with a leading
``<think>...</think>`` block, as Qwen3 does in thinking mode.  For ``keep`` and ``strip`` the ids a
learner sample carries must be exactly the ids the engine was prompted with and sampled: its
prompt before each turn is the trajectory's prefix, its generated ids sit at the loss-masked span,
and the trajectory's messages re-render (tiny model's chat template) to the same ids.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from cast_rl.config import load_config
from cast_rl.envs.core import load_domain_data
from cast_rl.inference.base import Completion, Sampling
from cast_rl.models.chat import split_thought, template_kwargs, thought_body
from cast_rl.rollout.runner import EpisodeRunner, EpisodeSpec
from cast_rl.samples.builders import build_samples


class ThinkingEngine:
    """Answers the n-th policy turn with ``turns[n]``; records each prompt and each answer's ids."""

    def __init__(self, tokenizer, turns: list[str]) -> None:  # noqa: ANN001
        self.tokenizer, self.turns = tokenizer, turns
        self.prompts: list[list[int]] = []
        self.sampled: list[list[int]] = []

    async def generate(self, prompt_ids: list[int], sampling: Sampling) -> Completion:
        body = self.turns[min(len(self.prompts), len(self.turns) - 1)]
        self.prompts.append(list(prompt_ids))
        ids = [*self.tokenizer(body, add_special_tokens=False).input_ids, self.tokenizer.convert_tokens_to_ids("<|im_end|>")]
        self.sampled.append(ids)
        return Completion(text=body, token_ids=ids, logprobs=[-0.25] * len(ids))


def _call(name: str, **kwargs: object) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": kwargs}) + "\n</tool_call>"


@pytest.fixture(scope="module")
def setup(tiny_model_dir: Path, retail_data_dir: Path):  # noqa: ANN201
    from transformers import AutoTokenizer

    return retail_data_dir, load_domain_data("retail", retail_data_dir), AutoTokenizer.from_pretrained(tiny_model_dir)


def test_split_thought_and_template_kwargs() -> None:
    assert split_thought("<think>\nplan\n</think>\n\nHi") == ("<think>\nplan\n</think>\n\n", "Hi")
    assert split_thought("Hi <think>x</think>") == ("", "Hi <think>x</think>")
    assert thought_body("<think>\nplan\n</think>\n\n") == "plan"
    assert template_kwargs("off") == {"enable_thinking": False}
    assert template_kwargs("keep") == template_kwargs("strip") == {"enable_thinking": True}


@pytest.mark.parametrize("thinking", ["keep", "strip"])
def test_trained_ids_are_the_sampled_and_prompted_ids(setup, thinking: str) -> None:  # noqa: ANN001
    data_dir, data, tok = setup
    task = data.task("train", 0)
    turns = [
        "<think>\nI need the user's identity first.\n</think>\n\nCould you give me your email?",
        # a call written inside the thought must not run: only the answer after it is parsed
        "<think>\nLook the user up; not " + _call("cancel_pending_order", order_id="#W0") + "\n</think>\n\n"
        + _call("get_user_details", user_id=task.user_id),
        "<think>\nDone here.\n</think>\n\nThank you. Goodbye.",
    ]
    cfg = load_config(None, [f"env.data_dir={data_dir}", "env.max_steps=3", "env.split=train",
                             f"inference.thinking={thinking}", "algorithm.samples=[outcome_groups]",
                             "algorithm.filter_zero_variance_groups=false"])
    engine = ThinkingEngine(tok, turns)
    traj = asyncio.run(EpisodeRunner(cfg, data, engine).run(EpisodeSpec("train", 0, 0)))

    policy_turns = [t for t in traj.turns if t.start < t.end]
    assert len(policy_turns) == len(engine.sampled) == 3
    for turn, prompt, sampled in zip(policy_turns, engine.prompts, engine.sampled):
        assert traj.token_ids[: turn.start] == prompt  # prompted with exactly the trajectory's prefix
        assert traj.token_ids[turn.start: turn.end] == sampled  # the thought's ids included
        assert traj.loss_mask[turn.start: turn.end] == [1] * len(sampled)
    assert sum(traj.loss_mask) == sum(len(s) for s in engine.sampled)

    (sample,) = build_samples([traj], cfg, "r0")  # what the learner trains on
    assert sample.token_ids == traj.token_ids
    trained = [i for i, m in enumerate(sample.loss_mask) if m]
    assert [sample.token_ids[i] for i in trained] == [i for s in engine.sampled for i in s]

    # the messages re-render (the template writes a stripped thought back) to the same ids
    rendered = tok.apply_chat_template(traj.messages, tools=data.tools, tokenize=False, **template_kwargs(thinking))
    assert tok(rendered, add_special_tokens=False).input_ids == traj.token_ids
    assert traj.info["tokens_consistent"]

    assistant = [m for m in traj.messages if m["role"] == "assistant"]
    if thinking == "keep":
        assert assistant[0]["content"].startswith("<think>\nI need") and "reasoning_content" not in assistant[0]
    else:  # the thought is out of what the environment, critic and labeller read
        assert assistant[0]["content"] == "Could you give me your email?"
        assert assistant[0]["reasoning_content"] == "I need the user's identity first."
        assert assistant[1]["content"] == "" and assistant[1]["reasoning_content"].startswith("Look the user up")
    # the call inside the thought did not run; the one after it did
    actions = [t.action["name"] for t in traj.turns if t.action]
    assert "cancel_pending_order" not in actions and "get_user_details" in actions
