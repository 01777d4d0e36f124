"""Environment throughput: gold replay with reward of the retail test tasks, and fork() cost.

Run (from the repo root; the benchmark data lives beside the repo)::

    .venv/bin/python bench/env_throughput.py [--data-dir ../shared/benchmarks/retail]
        [--min-seconds 2] [--source-tasks 115]

Measured side by side in one process:

* ``episodes_per_s``: episodes of gold replay plus reward (``ToolEnv`` steps over a fork, then
  ``reward()``) per second over all 115 test tasks, after one cold pass that fills the gold-state
  cache (the cold rate is printed too);
* ``fork_vs_deepcopy_speedup``: ``copy.deepcopy`` of the plain database state divided by
  ``Database.fork()`` of a database that already holds a few writes;
* ``vs_source_speedup`` (only when ``CAST_RL_TAU_BENCH_SRC`` names a tau-bench clone): the same episodes through the
  source's own ``Env`` (``reset`` reloads the JSON files, gold actions through ``step``,
  ``calculate_reward`` re-hashes and re-replays), extracted to a temporary directory outside
  the repo with its LLM user module stubbed.

The last line of stdout is one JSON object with the numbers.
"""

from __future__ import annotations

import argparse
import copy
import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from cast_rl.envs.core import DomainData, ToolEnv, call_tool, load_domain_data  # noqa: E402
from cast_rl.envs.types import Action  # noqa: E402

SOURCE_ENV = "CAST_RL_TAU_BENCH_SRC"
"""A git clone of sierra-research/tau-bench, for the comparison with its own env (optional)."""


def gold_episode(data: DomainData, index: int) -> float:
    env = ToolEnv(data, "test", index)
    for action in env.task.actions:
        if env.step(action).done:
            return env.last_reward
    return env.reward()[0]


def episodes_per_second(run: Callable[[int], Any], count: int, min_seconds: float) -> float:
    done, start = 0, time.perf_counter()
    while True:
        for index in range(count):
            run(index)
        done += count
        elapsed = time.perf_counter() - start
        if elapsed >= min_seconds:
            return done / elapsed


def median_seconds(fn: Callable[[], Any], repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def source_env(root: Path) -> Any:
    """tau-bench's MockRetailDomainEnv with the litellm user module replaced by a silent stub."""

    class SilentUser:
        def reset(self, instruction: str | None = None) -> str:
            return ""

        def step(self, content: str) -> str:
            return ""

        def get_total_cost(self) -> float:
            return 0.0

    user = types.ModuleType("tau_bench.envs.user")
    user.UserStrategy = type("UserStrategy", (), {"LLM": "llm"})  # type: ignore[attr-defined]
    user.load_user = lambda **kwargs: SilentUser()  # type: ignore[attr-defined]
    package = types.ModuleType("tau_bench")
    package.__path__ = [str(root / "tau_bench")]  # skip tau_bench/__init__ (imports the agents)
    sys.modules.update({"tau_bench": package, "tau_bench.envs.user": user})
    from tau_bench.envs.retail import MockRetailDomainEnv  # type: ignore[import-not-found]

    return MockRetailDomainEnv(
        user_strategy="stub", user_model="stub", task_split="test", task_index=0
    )


def source_episode(env: Any, index: int) -> float:
    env.reset(task_index=index)
    for action in env.task.actions:
        response = env.step(action)
        if response.done:
            return response.reward
    return env.calculate_reward().reward


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=str(REPO.parent / "shared" / "benchmarks" / "retail"))
    parser.add_argument("--min-seconds", type=float, default=2.0)
    parser.add_argument("--source-tasks", type=int, default=115, help="0 skips the source")
    args = parser.parse_args()

    data = load_domain_data("retail", args.data_dir)
    count = len(data.tasks("test"))
    start = time.perf_counter()
    rewards = [gold_episode(data, index) for index in range(count)]
    cold = count / (time.perf_counter() - start)
    warm = episodes_per_second(lambda i: gold_episode(data, i), count, args.min_seconds)
    print(
        f"ours: {warm:,.0f} episodes/s warm, {cold:,.0f} cold; "
        f"mean reward {sum(rewards) / count:.3f}"
    )

    written = data.db.fork()
    cancel = Action("cancel_pending_order", {"order_id": "#W5918442", "reason": "no longer needed"})
    call_tool(data, written, cancel)
    for key in list(data.db["orders"])[:20]:
        written["orders"].mutable(key)
    state = written.to_dict()
    fork_s = median_seconds(lambda: [written.fork() for _ in range(1000)], 7) / 1000
    deepcopy_s = median_seconds(lambda: copy.deepcopy(state), 5)
    print(f"fork: {fork_s * 1e6:.1f} us; deepcopy of the state: {deepcopy_s * 1e3:.1f} ms")
    result: dict[str, Any] = {
        "episodes_per_s": round(warm, 1),
        "episodes_per_s_cold": round(cold, 1),
        "fork_us": round(fork_s * 1e6, 2),
        "deepcopy_ms": round(deepcopy_s * 1e3, 2),
        "fork_vs_deepcopy_speedup": round(deepcopy_s / fork_s, 1),
    }

    source = Path(os.environ.get(SOURCE_ENV, "")) if os.environ.get(SOURCE_ENV) else None
    if args.source_tasks and source is not None and source.is_dir():
        with tempfile.TemporaryDirectory(prefix="tau_bench_src_") as tmp:
            archive = subprocess.run(
                ["git", "-C", str(source), "archive", "HEAD", "tau_bench"],
                check=True,
                capture_output=True,
            ).stdout
            with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
                tar.extractall(tmp, filter="data")
            env = source_env(Path(tmp))
            n = min(args.source_tasks, count)
            start = time.perf_counter()
            source_rewards = [source_episode(env, index) for index in range(n)]
            source_rate = n / (time.perf_counter() - start)
        assert source_rewards == rewards[:n], "the source's rewards differ from ours"
        print(f"source: {source_rate:.2f} episodes/s over {n} tasks (same rewards)")
        result["source_episodes_per_s"] = round(source_rate, 2)
        result["vs_source_speedup"] = round(warm / source_rate, 1)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
