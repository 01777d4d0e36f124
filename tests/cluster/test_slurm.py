"""The Slurm batch scripts on a real Slurm (slurm-wlm + munge from Debian's packages) with two
nodes on this one machine.

A session fixture installs the packages when they are missing (root and apt-get needed, else
the tests skip), starts munged, slurmctld and two slurmd (nodes n1 and n2, both on this host)
with slurm/ci/setup_slurm.sh and stops what it started with slurm/ci/teardown_slurm.sh. The
single-node script runs on one node; the multi-node script runs a Ray head on n1 and a Ray worker
on n2, each in its own srun step with its own temp dir. About 3.5 minutes.

    .venv/bin/python -m pytest tests/cluster/test_slurm.py -m slow
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SETUP = REPO / "slurm" / "ci" / "setup_slurm.sh"
TEARDOWN = REPO / "slurm" / "ci" / "teardown_slurm.sh"
SKIP_EXIT = 77  # setup_slurm.sh: Slurm cannot be set up on this machine


@pytest.fixture(scope="session")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A running Slurm for the session; stops only what it started."""
    if os.geteuid() != 0:
        pytest.skip("a real Slurm needs root (it installs slurm-wlm and munge and starts daemons)")
    if shutil.which("slurmctld") is None and shutil.which("apt-get") is None:
        pytest.skip("slurm-wlm is not installed and there is no apt-get to install it")
    state = tmp_path_factory.mktemp("slurm") / "started"
    setup = subprocess.run(["bash", str(SETUP), str(state)], capture_output=True, text=True, timeout=900)
    if setup.returncode == SKIP_EXIT:
        pytest.skip(f"Slurm cannot be set up here: {setup.stdout.strip()[-500:]}")
    try:
        assert setup.returncode == 0, f"setup_slurm.sh failed:\n{setup.stdout}\n{setup.stderr}"
        yield
    finally:
        subprocess.run(["bash", str(TEARDOWN), str(state)], capture_output=True, timeout=120)


@dataclass(frozen=True)
class SlurmJob:
    job_id: str
    state: str
    exit_code: str
    log: str


def run_batch(script: str, env: dict[str, str], log_dir: Path, *sbatch_args: str, timeout_s: float = 900) -> SlurmJob:
    """sbatch --parsable, then poll squeue (bounded) until the job has left the queue.

    (`sbatch --wait` polls with growing intervals: a 12 s job took 42 s to return.)"""
    submitted = subprocess.run(
        ["sbatch", "--parsable", "--time=20", f"--output={log_dir}/slurm-%j.out", *sbatch_args, str(REPO / script)],
        env=env, cwd=REPO, capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    job_id = submitted.stdout.strip().split(";")[0]
    deadline = time.monotonic() + timeout_s
    while subprocess.run(["squeue", "-h", "-j", job_id], capture_output=True, text=True).stdout.strip():
        if time.monotonic() > deadline:
            subprocess.run(["scancel", job_id])
            pytest.fail(f"slurm job {job_id} still queued or running after {timeout_s}s")
        time.sleep(1)
    info = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True, check=True).stdout
    log = (log_dir / f"slurm-{job_id}.out").read_text()
    return SlurmJob(job_id, _field(info, "JobState"), _field(info, "ExitCode"), log)


def _field(scontrol_output: str, key: str) -> str:
    match = re.search(rf"\b{key}=(\S+)", scontrol_output)
    assert match, f"no {key} in: {scontrol_output}"
    return match.group(1)


@pytest.fixture
def script_env(cluster_env, free_ports, ray_temp_dir: Path, tmp_path: Path):  # noqa: ANN001, ANN201
    """Variables for the batch scripts: the tiny job's entry point, private ports and temp dirs.

    Every Slurm node is this machine, so each Ray node gets its own temp dir (`%n`: the node's
    name) and the worker its own dashboard agent port. RAY_STOP_ON_EXIT=0: `ray stop` would stop
    every Ray on this machine, other tests' too; the scripts then end the srun steps instead,
    which Slurm kills with every process in them."""
    gcs, dashboard, client, agent, worker_agent = free_ports(5)
    return cluster_env(
        CAST_REPO=str(REPO),
        CAST_VENV=sys.prefix,
        CAST_ENTRY="launchers.pipeline",
        CAST_CONFIG="configs/quickstart.yaml",
        CAST_RUN_DIR=str(tmp_path / "run"),
        CAST_LOG_DIR=str(tmp_path / "logs"),
        RAY_PORT=str(gcs),
        DASHBOARD_PORT=str(dashboard),
        RAY_HEAD_EXTRA_ARGS=f"--ray-client-server-port={client} --dashboard-agent-listen-port={agent}",
        RAY_WORKER_EXTRA_ARGS=f"--dashboard-agent-listen-port={worker_agent}",
        RAY_TMP_DIR=f"{ray_temp_dir}/%n",
        RAY_STOP_ON_EXIT="0",
        WAIT_TIMEOUT_S="240",
    )


def test_single_node_script_runs_a_small_pipeline(
    slurm, script_env, pipeline_overrides, tmp_path: Path, ray_temp_dir: Path,  # noqa: ANN001
    check_pipeline_output, wait_until_gone,  # noqa: ANN001
) -> None:  # fmt: skip
    script_env["CAST_ARGS"] = " ".join(pipeline_overrides)
    job = run_batch("slurm/cast_single_node.sbatch", script_env, tmp_path)
    assert (job.state, job.exit_code) == ("COMPLETED", "0:0"), job.log[-6000:]
    assert f"job cast-{job.job_id}: SUCCEEDED, exit code 0" in job.log
    check_pipeline_output(tmp_path / "run")
    assert not wait_until_gone(str(ray_temp_dir)), "Ray processes outlived the Slurm job"


def test_multinode_script_passes_on_the_job_exit_code(
    slurm, script_env, tmp_path: Path, ray_temp_dir: Path, wait_until_gone,  # noqa: ANN001
) -> None:  # fmt: skip
    # One node: head only. A bad override: the config loader exits 2.
    script_env["CAST_ARGS"] = "learner.lr=fast"
    # No token anywhere: the script makes one for the job and keeps it for clients.
    script_env["RAY_AUTH_TOKEN_PATH"] = str(tmp_path / "no-such-token")
    script_env.pop("RAY_AUTH_TOKEN", None)
    job = run_batch("slurm/cast_multinode.sbatch", script_env, tmp_path, "--nodes=1")
    assert (job.state, job.exit_code) == ("FAILED", "2:0"), job.log[-6000:]
    token = tmp_path / "logs" / "ray_auth_token"
    assert len(token.read_text().strip()) == 64 and token.stat().st_mode & 0o777 == 0o600
    assert "learner.lr='fast' is not allowed; expected float" in job.log
    assert f"job cast-{job.job_id}: FAILED, exit code 2" in job.log
    assert not wait_until_gone(str(ray_temp_dir)), "Ray processes outlived the Slurm job"


def test_multinode_script_runs_a_small_pipeline_on_two_nodes(
    slurm, script_env, pipeline_overrides, tmp_path: Path, ray_temp_dir: Path,  # noqa: ANN001
    check_pipeline_output, wait_until_gone,  # noqa: ANN001
) -> None:  # fmt: skip
    nodes = subprocess.run(["sinfo", "-h", "-N", "-o", "%N"], capture_output=True, text=True, check=True).stdout
    if len(set(nodes.split())) < 2:
        pytest.skip(f"this Slurm has fewer than two nodes: {nodes.split()}")
    # The rollout worker may only run on the Ray worker's node, so the pipeline needs both.
    script_env["RAY_WORKER_EXTRA_ARGS"] += ' --resources={"rollout_node":1}'
    script_env["CAST_ARGS"] = " ".join([*pipeline_overrides, 'rollout.ray_resources={"rollout_node":1}'])
    job = run_batch("slurm/cast_multinode.sbatch", script_env, tmp_path, "--nodes=2", "--cpus-per-task=1")
    assert (job.state, job.exit_code) == ("COMPLETED", "0:0"), job.log[-6000:]
    head = re.search(rf"slurm job {job.job_id}: 2 nodes, head (\S+) ", job.log)
    worker = re.search(r"ray worker on (\S+) -> ", job.log)
    assert head and worker and head.group(1) != worker.group(1), job.log[-6000:]
    assert "ray cluster up: 2/2 nodes" in job.log
    assert f"job cast-{job.job_id}: SUCCEEDED, exit code 0" in job.log
    check_pipeline_output(tmp_path / "run")
    # The rollout worker ran in the Ray node that the srun step on the second Slurm node started.
    worker_logs = (ray_temp_dir / worker.group(1)).glob("session_*/logs/worker-*")
    assert any(":actor_name:RolloutWorkerActor" in f.read_text(errors="replace") for f in worker_logs)
    head_logs = (ray_temp_dir / head.group(1)).glob("session_*/logs/worker-*")
    assert not any(":actor_name:RolloutWorkerActor" in f.read_text(errors="replace") for f in head_logs)
    assert not wait_until_gone(str(ray_temp_dir)), "Ray processes outlived the Slurm job"
