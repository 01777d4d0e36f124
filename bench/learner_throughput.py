"""Learner throughput and weight-sync cost, each against a plain baseline.

Run (from the repo root)::

    .venv/bin/python bench/learner_throughput.py [--workers 2] [--hidden 256] [--layers 4]
        [--batches 6] [--batch-size 16] [--micro-batch-size 4] [--min-len 64] [--max-len 128]
        [--sync-reps 3] [--logits-batches 4] [--logits-batch-size N] [--logits-threads 2]
        [--critic-batches 6]

    # smoke test (tests/bench): the JSON keys, not the figures
    .venv/bin/python bench/learner_throughput.py --workers 1 --hidden 64 --layers 1 --batches 2 \
        --batch-size 2 --micro-batch-size 2 --min-len 16 --max-len 32 --sync-reps 1 \
        --logits-batches 2 --logits-batch-size 1 --critic-batches 2

Measured on the same randomly generated batches (a small offline Qwen3 built on the spot):

* ``fsdp_vs_plain_loop``: tokens/s of the FSDP learner group (``--workers`` Ray actors, FSDP2
  over gloo, one torch thread each, called through Ray like the driver loop does) divided by the
  tokens/s of a plain single-process PyTorch loop (one thread: the same model, the same
  micro-batches with dynamic padding, masked cross-entropy, gradient accumulation, clipping,
  AdamW).  The first batch of each is a warm-up and is not timed.
* ``sync_vs_memcpy``: one weight sync (full-weight gather on every rank, the state dict stored
  once in the object store, and a reader actor's ``ray.get`` of it, with checksum) divided by
  one in-memory copy of the same number of bytes (best of 5); both medians of ``--sync-reps``.
* ``loss_token_logits_speedup``: tokens/s of one in-process learner rank with
  ``learner.logits=loss_tokens`` divided by the same rank with ``learner.logits=all``, on the
  embedded default's shapes: the quickstart's policy (``configs/quickstart.yaml``: 0.8M
  parameters, its tokenizer trained on the generated retail data, vocabulary ~4.1k), 16
  conversations (``--logits-batch-size``, default the quickstart's batch) of ~1.6k tokens per step of which ~16% are the policy's turns (the loss), in
  the quickstart's micro-batches, ``--logits-threads`` torch threads.  Steps alternate between the two
  engines (same batches, same order), and the first step of each is a warm-up.
* ``critic_packing_speedup``: tokens/s of the same rank training the quickstart's critic
  (``pipeline.critic_micro_batch_size`` examples per pass within
  ``learner.max_tokens_per_micro_batch`` padded tokens) divided by one example per pass, on
  critic-shaped batches: 16 examples of 200-580 tokens (the conversation's end and the proposed
  action) whose loss is the answer's last 5-150 tokens.  Steps alternate as above.

The last line of stdout is one JSON object with the numbers.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def make_batches(n: int, size: int, min_len: int, max_len: int, vocab: int, seed: int = 0) -> list:
    from cast_rl.learner.sample import Sample

    g = torch.Generator().manual_seed(seed)
    batches = []
    for b in range(n):
        batch = []
        for i in range(size):
            length = int(torch.randint(min_len, max_len + 1, (1,), generator=g))
            ids = torch.randint(3, vocab, (length,), generator=g).tolist()
            half = length // 2
            batch.append(Sample(f"b{b}-{i}", "supervised", ids, [0] * half + [1] * (length - half), [0.0] * length))
        batches.append(batch)
    return batches


def conversation_batches(n: int, size: int, vocab: int, seed: int = 0) -> list:
    """Batches shaped like the quickstart's: ~1.6k-token conversations whose loss is on 4-6
    policy turns of 40-60 tokens (~16% of the tokens)."""
    from cast_rl.learner.sample import Sample

    g = torch.Generator().manual_seed(seed)
    batches = []
    for b in range(n):
        batch = []
        for i in range(size):
            length = int(torch.randint(1400, 1800, (1,), generator=g))
            ids = torch.randint(3, vocab, (length,), generator=g).tolist()
            mask = [0] * length
            turns = int(torch.randint(4, 7, (1,), generator=g))
            for t in range(turns):
                start = 600 + t * (length - 700) // turns
                for j in range(start, start + int(torch.randint(40, 61, (1,), generator=g))):
                    mask[j] = 1
            batch.append(Sample(f"c{b}-{i}", "supervised", ids, mask, [0.0] * length))
        batches.append(batch)
    return batches


def critic_batches(n: int, size: int, vocab: int, seed: int = 0) -> list:
    """Batches shaped like the quickstart's critic data: 200-580 tokens (the conversation's last
    600 characters and the proposed action) with the loss on the answer's last 5-150 tokens."""
    from cast_rl.learner.sample import Sample

    g = torch.Generator().manual_seed(seed)
    batches = []
    for b in range(n):
        batch = []
        for i in range(size):
            length = int(torch.randint(200, 581, (1,), generator=g))
            answer = int(torch.randint(5, 151, (1,), generator=g))
            ids = torch.randint(3, vocab, (length,), generator=g).tolist()
            batch.append(Sample(f"k{b}-{i}", "supervised", ids, [0] * (length - answer) + [1] * answer, [0.0] * length))
        batches.append(batch)
    return batches


def quickstart_engines(threads: int, variants: dict[str, list[str]]) -> tuple[dict, Any]:
    """One in-process learner rank per variant (overrides of configs/quickstart.yaml) on the
    quickstart's policy model, and the quickstart's config."""
    from cast_rl.config import load_config
    from cast_rl.envs.setup import load_env_data
    from cast_rl.learner.engine import LearnerEngine
    from cast_rl.models.setup import ensure_policy_model

    torch.set_num_threads(threads)
    tmp = Path(tempfile.mkdtemp(prefix="quickstart-learner-bench-"))
    base = load_config(REPO / "configs" / "quickstart.yaml",
                       [f"run_dir={tmp}", f"policy.path={tmp / 'policy'}", "logging.mode=disabled"])
    model_dir = ensure_policy_model(base, load_env_data(base))
    engines = {name: LearnerEngine(load_config(REPO / "configs" / "quickstart.yaml", [
        f"run_dir={tmp}", f"policy.path={model_dir}", "logging.mode=disabled", "learner.checkpoint_every=null",
        *overrides])) for name, overrides in variants.items()}
    return engines, base


def alternating_tokens_per_s(engines: dict, batches: list) -> dict[str, float]:
    """Tokens/s of each engine over the same batches, steps alternating between the engines
    (their order flipped every batch); the first batch is a warm-up."""
    seconds = {name: 0.0 for name in engines}
    timed_tokens = 0
    for i, batch in enumerate(batches):
        for name in (list(engines) if i % 2 else list(engines)[::-1]):
            t0 = time.perf_counter()
            engines[name].train_step(batch)
            if i:
                seconds[name] += time.perf_counter() - t0
        if i:
            timed_tokens += sum(len(s.token_ids) for s in batch)
    return {name: timed_tokens / s for name, s in seconds.items()}


def logits_speedup(batches_n: int, threads: int, batch_size: int | None = None) -> dict[str, float]:
    """(tokens/s with learner.logits=all, with loss_tokens, loss-token share) on the
    quickstart's model and conversation shapes (module doc)."""
    engines, base = quickstart_engines(threads, {mode: [f"learner.logits={mode}"] for mode in ("all", "loss_tokens")})
    vocab = engines["all"].model.config.vocab_size
    batches = conversation_batches(batches_n, batch_size or base.learner.global_batch_size, vocab)
    share = sum(s.num_loss_tokens for b in batches for s in b) / sum(len(s.token_ids) for b in batches for s in b)
    return {**alternating_tokens_per_s(engines, batches), "share": share, "vocab": vocab}


def critic_packing_speedup(batches_n: int, threads: int) -> dict[str, float]:
    """(tokens/s at one critic example per pass, at the quickstart's critic micro-batch) on the
    quickstart's model and critic shapes (module doc)."""
    from cast_rl.config import load_config

    qs = load_config(REPO / "configs" / "quickstart.yaml", [])
    packed = qs.learner.with_micro_batch(qs.pipeline.critic_micro_batch_size or qs.learner.micro_batch_size)
    engines, base = quickstart_engines(threads, {
        "one": ["learner.micro_batch_size=1"],
        "packed": [f"learner.micro_batch_size={packed.micro_batch_size}"],
    })
    batches = critic_batches(batches_n, base.learner.global_batch_size, engines["one"].model.config.vocab_size)
    return {**alternating_tokens_per_s(engines, batches), "micro_batch_size": packed.micro_batch_size,
            "max_tokens": packed.max_tokens_per_micro_batch}


def plain_loop(model_dir: Path, batches: list, micro: int, lr: float) -> float:
    """Tokens/s of an ordinary single-process training loop on the same batches."""
    from transformers import AutoModelForCausalLM

    from cast_rl.learner.batch import collate, split_micro_batches

    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    timed_tokens, timed_s = 0, 0.0
    for i, batch in enumerate(batches):
        t0 = time.perf_counter()
        total = sum(s.num_loss_tokens - s.loss_mask[0] for s in batch)
        for group in split_micro_batches(batch, micro):
            mb = collate(group, pad_id=0)
            logits = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask).logits[:, :-1]
            ce = torch.nn.functional.cross_entropy(logits.float().transpose(1, 2), mb.targets, reduction="none")
            ((ce * mb.loss_mask).sum() / total).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i:  # the first batch warms up
            timed_s += time.perf_counter() - t0
            timed_tokens += sum(len(s.token_ids) for s in batch)
    return timed_tokens / timed_s


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batches", type=int, default=6)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--micro-batch-size", type=int, default=4)
    p.add_argument("--min-len", type=int, default=64)
    p.add_argument("--max-len", type=int, default=128)
    p.add_argument("--sync-reps", type=int, default=3)
    p.add_argument("--logits-batches", type=int, default=4, help="steps per engine, the first a warm-up")
    p.add_argument("--logits-batch-size", type=int, default=None,
                   help="conversations per step (default: the quickstart's learner.global_batch_size)")
    p.add_argument("--logits-threads", type=int, default=2)
    p.add_argument("--critic-batches", type=int, default=6, help="critic-shaped steps per engine, the first a warm-up")
    args = p.parse_args(argv)
    if args.batches < 2 or args.logits_batches < 2 or args.critic_batches < 2:
        p.error("--batches, --logits-batches and --critic-batches must be >= 2 (the first batch is a warm-up)")

    logits = logits_speedup(args.logits_batches, args.logits_threads, args.logits_batch_size)
    print(f"quickstart shapes (vocab {logits['vocab']}, loss on {logits['share']:.0%} of tokens): "
          f"learner.logits=all {logits['all']:,.0f} tokens/s, loss_tokens {logits['loss_tokens']:,.0f} tokens/s")
    packing = critic_packing_speedup(args.critic_batches, args.logits_threads)
    print(f"quickstart critic shapes: one example per pass {packing['one']:,.0f} tokens/s, up to "
          f"{packing['micro_batch_size']} per pass within {packing['max_tokens']} tokens {packing['packed']:,.0f} tokens/s")

    import ray

    from actors.learner import LearnerGroup
    from cast_rl.config import load_config
    from cast_rl.inference.weight_sync import state_checksum
    from cast_rl.models.tiny import TinyModelSpec, make_tiny_model

    tmp = Path(tempfile.mkdtemp(prefix="learner-bench-"))
    spec = TinyModelSpec(hidden_size=args.hidden, intermediate_size=2 * args.hidden, num_layers=args.layers,
                         num_heads=max(1, args.hidden // 64), num_kv_heads=1)
    model_dir = make_tiny_model(tmp / "model", spec, seed=0)
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(model_dir)
    vocab = reference.config.vocab_size
    n_params = sum(p.numel() for p in reference.parameters())
    del reference
    batches = make_batches(args.batches, args.batch_size, args.min_len, args.max_len, vocab)
    print(f"model: {n_params / 1e6:.2f}M parameters, vocab {vocab}; {args.batches} batches of {args.batch_size}")

    plain_tps = plain_loop(model_dir, batches, args.micro_batch_size, 1e-4)
    print(f"plain single-process loop: {plain_tps:,.0f} tokens/s")

    cfg = load_config(None, [
        f"policy.path={model_dir}", f"run_dir={tmp / 'run'}", f"learner.num_workers={args.workers}",
        f"learner.micro_batch_size={args.micro_batch_size}",
        f"learner.global_batch_size={args.batch_size}", "learner.lr=1e-4", "learner.num_cpus_per_worker=1",
        "logging.mode=disabled",
    ])
    ray.init(num_cpus=max(2, args.workers), include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}})
    group = LearnerGroup(cfg)
    timed_tokens, timed_s = 0, 0.0
    for i, batch in enumerate(batches):
        t0 = time.perf_counter()
        group.train_step(batch)
        if i:
            timed_s += time.perf_counter() - t0
            timed_tokens += sum(len(s.token_ids) for s in batch)
    fsdp_tps = timed_tokens / timed_s
    print(f"FSDP learner ({args.workers} gloo workers via Ray): {fsdp_tps:,.0f} tokens/s")

    @ray.remote(num_cpus=0)
    def reader(state: dict, checksum: str) -> int:
        if state_checksum(state) != checksum:
            raise RuntimeError("checksum mismatch")
        return sum(t.numel() * t.element_size() for t in state.values())

    sync_s, copy_s = [], []
    ray.get(reader.remote(*group.publish_weights()[1:]))  # warm-up
    for _ in range(args.sync_reps):
        t0 = time.perf_counter()
        _, ref, checksum = group.publish_weights()
        nbytes = ray.get(reader.remote(ref, checksum))
        sync_s.append(time.perf_counter() - t0)
        src = torch.empty(nbytes, dtype=torch.uint8).random_()
        dst = torch.empty_like(src)
        best = float("inf")
        for _ in range(5):
            t1 = time.perf_counter()
            dst.copy_(src)
            best = min(best, time.perf_counter() - t1)
        copy_s.append(best)
    sync, mem = statistics.median(sync_s), statistics.median(copy_s)
    print(f"weight sync of {nbytes / 1e6:.1f} MB: {sync * 1e3:.1f} ms (gather + put + reader get + checksum); "
          f"memcpy {mem * 1e3:.3f} ms")
    group.shutdown()
    ray.shutdown()
    print(json.dumps({
        "loss_token_logits_speedup": round(logits["loss_tokens"] / logits["all"], 3),
        "loss_tokens_tokens_per_s": round(logits["loss_tokens"], 1),
        "all_logits_tokens_per_s": round(logits["all"], 1),
        "critic_packing_speedup": round(packing["packed"] / packing["one"], 3),
        "critic_packed_tokens_per_s": round(packing["packed"], 1),
        "critic_one_per_pass_tokens_per_s": round(packing["one"], 1),
        "fsdp_vs_plain_loop": round(fsdp_tps / plain_tps, 3),
        "sync_vs_memcpy": round(sync / mem, 1),
        "fsdp_tokens_per_s": round(fsdp_tps, 1),
        "plain_tokens_per_s": round(plain_tps, 1),
        "sync_ms": round(sync * 1e3, 2),
        "memcpy_ms": round(mem * 1e3, 4),
        "weights_mb": round(nbytes / 1e6, 2),
        "workers": args.workers,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
