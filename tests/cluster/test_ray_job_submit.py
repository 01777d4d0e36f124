"""`ray job submit` of a small pipeline job to a Ray head started with `ray start --head`.

The job joins the running cluster (cluster.address=auto) from an uploaded copy of the
repository, as on a real cluster. Takes about 2 minutes (Ray head, then vLLM in a Ray actor).

    .venv/bin/python -m pytest tests/cluster/test_ray_job_submit.py -m slow
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
RAY = str(Path(sys.executable).parent / "ray")
UPLOAD_EXCLUDES = [".git", ".venv", "runs", "wandb", "**/__pycache__", ".pytest_cache",
                   ".ruff_cache", ".mypy_cache", ".hypothesis", "*.egg-info", "build", "dist"]

# Polls the dashboard the way `ray job submit` will use it: the job API answers (with our
# token) and the head node is ALIVE. Prints the ALIVE count, 0 while not up yet.
READY_PY = """
import sys
from ray.job_submission import JobSubmissionClient
from ray.util.state import list_nodes
try:
    JobSubmissionClient(sys.argv[1]).list_jobs()
    print(len(list_nodes(address=sys.argv[1], filters=[("state", "=", "ALIVE")])))
except Exception as exc:
    print(0, exc)
"""

STATUS_PY = """
import sys
from ray.job_submission import JobSubmissionClient
info = JobSubmissionClient(sys.argv[1]).get_job_info(sys.argv[2])
print(info.status.value, info.driver_exit_code)
"""


@dataclass(frozen=True)
class Head:
    url: str
    env: dict[str, str]
    log: Path


def _wait_ready(head: Head, proc: subprocess.Popen, timeout_s: float = 240.0) -> None:
    deadline = time.monotonic() + timeout_s
    seen = ""
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"ray start exited {proc.returncode}:\n{head.log.read_text()[-3000:]}"
        seen = subprocess.run(
            [sys.executable, "-c", READY_PY, head.url], env=head.env, capture_output=True, text=True, timeout=60
        ).stdout.strip()
        if seen.split(" ")[0] == "1":
            return
        time.sleep(1)
    pytest.fail(f"Ray head at {head.url} not ready after {timeout_s}s: {seen}\n{head.log.read_text()[-3000:]}")


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # the whole group has ended already
        os.killpg(pgid, sig)


@pytest.fixture
def ray_head(ray_temp_dir: Path, free_ports, cluster_env, wait_until_gone) -> Iterator[Head]:  # noqa: ANN001
    """A Ray head of our own: private ports, temp dir and auth token.

    `ray stop` would stop every Ray on this machine (other tests' local clusters too), so the
    head runs as `ray start --block` in its own session and is ended through that process group.
    """
    gcs, dashboard, client, agent = free_ports(4)
    env = cluster_env(
        RAY_AUTH_MODE="token",
        RAY_AUTH_TOKEN=secrets.token_hex(32),
        RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S="0",  # stop at once on SIGTERM (nothing to drain)
    )
    head = Head(url=f"http://127.0.0.1:{dashboard}", env=env, log=ray_temp_dir / "head.log")
    cmd = [
        RAY, "start", "--head", "--block", "--disable-usage-stats", "--num-cpus=2",
        f"--port={gcs}", "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard}",
        f"--ray-client-server-port={client}", f"--dashboard-agent-listen-port={agent}",
        f"--temp-dir={ray_temp_dir}",
    ]  # fmt: skip
    with head.log.open("w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_ready(head, proc)
        yield head
    finally:
        _signal_group(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            _signal_group(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        left = wait_until_gone(str(ray_temp_dir))
        for pid in left:  # ours beyond doubt: they name our private temp dir
            os.kill(pid, signal.SIGKILL)
        assert not left, f"Ray processes outlived the head: {left}"


def test_ray_job_submit_runs_a_small_pipeline(
    ray_head: Head, pipeline_overrides: list[str], tmp_path: Path, check_pipeline_output  # noqa: ANN001
) -> None:
    submission_id = "cast-test-submit"
    submit = [
        RAY, "job", "submit", "--address", ray_head.url, "--submission-id", submission_id,
        "--working-dir", str(REPO), "--runtime-env-json", json.dumps({"excludes": UPLOAD_EXCLUDES}),
        "--", "python", "-m", "launchers.pipeline", "configs/quickstart.yaml", "cluster.address=auto",
        f"run_dir={tmp_path / 'run'}", *pipeline_overrides,
    ]  # fmt: skip
    started = time.monotonic()
    result = subprocess.run(submit, env=ray_head.env, capture_output=True, text=True, timeout=900)
    took = time.monotonic() - started
    assert result.returncode == 0, f"ray job submit exited {result.returncode}:\n{result.stdout[-5000:]}\n{result.stderr[-3000:]}"
    # `ray job submit` also exits 0 for a STOPPED job: ask for the status itself.
    status = subprocess.run(
        [sys.executable, "-c", STATUS_PY, ray_head.url, submission_id],
        env=ray_head.env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert status.stdout.split() == ["SUCCEEDED", "0"], status.stdout + status.stderr
    assert "pass^k" in result.stdout
    check_pipeline_output(tmp_path / "run")
    print(f"job submitted and finished in {took:.0f}s")
