"""The GPU path end to end on a CUDA machine, as one JSON line (called by ``bench/gpu_check.sh``).

Run (from the repo root, with the GPU extra installed)::

    python bench/gpu_check.py

On the local Ray over this machine's GPUs: a tiny offline Qwen3 served by one rollout worker's
vLLM engine on a GPU (``policy.dtype=bfloat16``), a one-rank FSDP2 learner computing in bf16 over
fp32 master weights on a GPU, one step that teaches the learner a different first answer token,
and one collective weight sync from the learner into the engine -- NCCL when the learner and the
engine have a GPU each (two or more GPUs: NCCL cannot put two ranks on one device), gloo from a
CPU learner otherwise (reported as ``sync_backend``).  The greedy answer must change to the
taught token.  On a machine without CUDA it prints that and exits 0.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main() -> int:
    if not torch.cuda.is_available():
        print(json.dumps({"gpu_check": "skipped", "reason": "no CUDA device"}))
        return 0
    import ray
    from transformers import AutoTokenizer

    from actors.learner import LearnerGroup
    from actors.rollout_group import RolloutGroup
    from cast_rl.config import load_config
    from cast_rl.envs.generate import write_retail
    from cast_rl.learner.sample import Sample
    from cast_rl.models.tiny import make_tiny_model

    gpus = torch.cuda.device_count()
    tmp = Path(tempfile.mkdtemp(prefix="cast-gpu-check-"))
    model = make_tiny_model(tmp / "policy", seed=0)
    write_retail(tmp / "retail", seed=0, num_tasks=4)
    learner_gpus = 1 if gpus >= 2 else 0
    cfg = load_config(None, [
        f"policy.path={model}", "policy.dtype=bfloat16", f"env.data_dir={tmp / 'retail'}", f"run_dir={tmp / 'run'}",
        "logging.mode=disabled", "inference.max_model_len=1024", "inference.gpu_memory_utilization=0.3",
        "rollout.num_workers=1", "rollout.num_gpus_per_worker=1", "rollout.weight_sync=collective",
        "learner.num_workers=1", f"learner.num_gpus_per_worker={learner_gpus}", "learner.micro_batch_size=4",
        "learner.global_batch_size=4", "learner.lr=0.05", "learner.checkpoint_every=null",
    ])
    ray.init(num_cpus=4, num_gpus=gpus, include_dashboard=False, runtime_env={"env_vars": {"PYTHONPATH": str(REPO)}})
    out: dict = {"gpus": gpus, "gpu": torch.cuda.get_device_name(0)}
    group = learner = None
    try:
        t0 = time.perf_counter()
        group = RolloutGroup(cfg)
        out["engine_start_s"] = round(time.perf_counter() - t0, 1)
        learner = LearnerGroup(cfg)
        worker = group.workers[0]
        tok = AutoTokenizer.from_pretrained(model)
        prompt = tok(tok.apply_chat_template([{"role": "user", "content": "Please cancel order #W1001."}],
                                             tokenize=False, add_generation_prompt=True), add_special_tokens=False).input_ids
        before = ray.get(worker.greedy_answer.remote(prompt, 8))
        target = 100 if before[0] != 100 else 101
        ids = prompt + [target] * 8
        metrics = learner.train_step([Sample(f"g{i}", "supervised", ids, [0] * len(prompt) + [1] * 8, [0.0] * len(ids))
                                      for i in range(4)])
        out["bf16_step"] = {"loss": round(metrics["supervised_loss"], 4), "grad_norm": round(metrics["grad_norm"], 4),
                            "learner_device": "cuda" if learner_gpus else "cpu"}
        t0 = time.perf_counter()
        versions = group.update_weights(*learner.publish_weights())
        out["sync_s"] = round(time.perf_counter() - t0, 3)
        out["sync_backend"] = "nccl" if learner_gpus else "gloo"
        after = ray.get(worker.greedy_answer.remote(prompt, 8))
        out["greedy_changed"] = after != before and after[0] == target
        out["versions"] = versions
    finally:
        for part in (learner, group):
            if part is not None:
                part.shutdown()
        ray.shutdown()
    out["ok"] = bool(out.get("greedy_changed")) and out["bf16_step"]["grad_norm"] > 0
    print(json.dumps(out))
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
