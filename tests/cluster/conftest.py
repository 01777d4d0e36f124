"""Shared parts of the cluster-launch tests: the tiny pipeline job, free ports, a private Ray
temp dir and the environment the Ray processes get."""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cast_rl.records import read_trajectories

PIPELINE_STAGES = "[collect,label,critic_data,eval_after]"


@pytest.fixture
def pipeline_overrides(tiny_model_dir: Path, retail_data_dir: Path) -> list[str]:
    """Overrides that make `launchers.pipeline` a small job on the tiny model: collect two
    training tasks, label them (with verified blame: one continuation per invalid label, through
    the rollout worker), build critic data, and evaluate two test tasks (n=2) without and with the
    rule critic."""
    return [
        f"policy.path={tiny_model_dir}",
        f"env.data_dir={retail_data_dir}",
        f"pipeline.stages={PIPELINE_STAGES}",
        "pipeline.train_tasks=2",
        "pipeline.collect_trials=1",
        "pipeline.blame_k=1",
        "rollout.num_workers=1",
        "rollout.num_cpus_per_worker=1",
        "env.max_steps=2",
        "inference.max_new_tokens=16",
        "env.task_indices=[0,1]",
        "eval.trials=2",
        "eval.verification_budgets=[0,1]",
        "eval.unseen_seeds=[]",  # benchmark-shaped data, not the generated default
        "critic.backend=rule",  # no train_critic among these stages
    ]


def _check_pipeline_output(run_dir: Path) -> None:
    """The tiny pipeline's outputs: every stage done, trajectories, labels, a pass^k report."""
    summary = json.loads((run_dir / "pipeline.json").read_text())
    assert list(summary["stages"]) == ["collect", "label", "critic_data", "eval_after"]
    trajectories = read_trajectories(run_dir / "02_collect" / "trajectories.jsonl")
    assert sorted((t.task_index, t.trial) for t in trajectories) == [(0, 0), (1, 0)]
    for traj in trajectories:
        assert traj.domain == "retail" and traj.policy_version == 0
        assert len(traj.token_ids) == len(traj.loss_mask) == len(traj.logprobs) > 0
    assert (run_dir / "03_label" / "labels.jsonl").read_text().strip()
    # verified blame ran in the label stage on the rollout worker: one record per invalid label
    # of an executed action (every collected episode failed), each replayed and continued once
    labels = [json.loads(line) for line in (run_dir / "03_label" / "labels.jsonl").read_text().splitlines()]
    blame = [json.loads(line) for line in (run_dir / "03_label" / "blame.jsonl").read_text().splitlines()]
    executed = {(i, t.message_index) for i, traj in enumerate(trajectories) for t in traj.turns if t.executed}
    expected = {(lab["trajectory_index"], lab["message_index"]) for lab in labels if lab["verdict"] == "invalid"} & executed
    assert blame and {(r["trajectory_index"], r["message_index"]) for r in blame} == expected
    assert all(r["k"] == 1 for r in blame if r["correction"]) and summary["stages"]["label"]["blame"]["labels"] == len(blame)
    report = json.loads((run_dir / "report" / "report.json").read_text())
    labels = [c["label"] for c in report["configurations"]]
    assert labels == ["after: no critic", "after: critic B=1 (rule)"]  # which critic it had
    for config in report["configurations"]:
        assert set(config["groups"]["retail/test"]["pass^k"]) == {"pass^1", "pass^2"}


def _free_ports(n: int) -> list[int]:
    """n distinct ports free right now (held open together so they differ)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _pids_using(marker: str) -> list[int]:
    """Processes whose command line mentions marker (our private Ray temp dir)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline:
            pids.append(int(proc.name))
    return pids


def _wait_until_gone(marker: str, timeout_s: float = 60.0) -> list[int]:
    """Poll (bounded) until no process mentions marker; returns the ones left."""
    deadline = time.monotonic() + timeout_s
    while (left := _pids_using(marker)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


@pytest.fixture
def check_pipeline_output() -> Callable[[Path], None]:
    return _check_pipeline_output


@pytest.fixture
def free_ports() -> Callable[[int], list[int]]:
    return _free_ports


@pytest.fixture
def wait_until_gone() -> Callable[..., list[int]]:
    return _wait_until_gone


@pytest.fixture
def ray_temp_dir() -> Iterator[Path]:
    """A private Ray --temp-dir, short because Ray's socket paths must stay under 107 bytes.

    Its unique path also tells our Ray processes apart from any other Ray on the machine."""
    path = Path(tempfile.mkdtemp(prefix="cast-ray-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def cluster_env() -> Callable[..., dict[str, str]]:
    """The environment for `ray`/`sbatch` subprocesses: this venv first on PATH, no inherited
    Ray address, plus the given variables."""

    def make(**extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS")}
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        env["RAY_USAGE_STATS_ENABLED"] = "0"
        env.update(extra)
        return env

    return make
