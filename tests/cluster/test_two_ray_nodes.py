"""Two Ray nodes on one machine: the learner on one, the rollout worker on the other.

A head (``ray start --head``, custom resource ``learner_node``) and a second node joining it
(``ray start --address``, its own ``--temp-dir`` and ports, custom resource ``rollout_node``), each
with one CPU.  ``learner.ray_resources`` and ``rollout.ray_resources`` place the FSDP learner on
the head and the rollout worker (vLLM engine + environments) on the second node; a training slice
runs across them (collect on one node, one supervised learner step on the other, the new weights
back over the gloo weight-sync group with ``rollout.weight_sync=collective``, collect again).  Both nodes are ours (private temp
dirs and ports) and are stopped through their own process groups, never with ``ray stop``.
Takes about 3 minutes.

    .venv/bin/python -m pytest tests/cluster/test_two_ray_nodes.py -m slow
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
RAY = str(Path(sys.executable).parent / "ray")

# Runs the training slice as a driver on the two-node cluster, then reports where each actor
# ran (the state API keeps ended actors) and which node offers which custom resource.
DRIVER_PY = """
import json, logging, sys
import ray
from ray.util.state import list_actors
from actors.learner import LearnerGroup
from cast_rl.config import load_config
from cast_rl.learner.sample import Sample
from actors.rollout_group import RolloutGroup
from launchers.cluster import init_ray

cfg = load_config(None, sys.argv[2:])
logging.basicConfig(level=logging.INFO)
init_ray(cfg, parts=("rollout", "learner"))
group, learner = RolloutGroup(cfg), LearnerGroup(cfg)
try:
    units = [("test", 0, 0), ("test", 1, 0)]
    before = group.collect(units)
    samples = [Sample(f"t{i}", "supervised", t.token_ids, t.loss_mask, t.logprobs) for i, t in enumerate(before)]
    assert all(sum(t.loss_mask) for t in before), "episodes without policy tokens"
    learner.train_step(samples)
    versions = group.update_weights(*learner.publish_weights())
    after = group.collect(units)
finally:
    learner.shutdown()
    group.shutdown()
nodes = {n["NodeID"]: sorted(k for k in n["Resources"] if k.endswith("_node")) for n in ray.nodes() if n["Alive"]}
placed = {}
for actor in list_actors(address=sys.argv[1], limit=1000, detail=True):
    if actor.class_name in ("LearnerWorkerActor", "RolloutWorkerActor"):
        placed.setdefault(actor.class_name, set()).update(nodes.get(actor.node_id, ["gone"]))
print(json.dumps({"versions": versions, "after": [t.policy_version for t in after],
                  "placed": {k: sorted(v) for k, v in placed.items()}}))
"""


def _group_signal(proc: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)


def _stop(proc: subprocess.Popen) -> None:
    _group_signal(proc, signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        _group_signal(proc, signal.SIGKILL)
        proc.wait(timeout=30)


@pytest.fixture
def two_nodes(free_ports, cluster_env, wait_until_gone) -> Iterator[tuple[str, str, dict[str, str]]]:  # noqa: ANN001
    """(GCS address, dashboard URL, environment) of a head and a second node, both ours."""
    dirs = [Path(tempfile.mkdtemp(prefix=f"cast-ray{i}-", dir="/tmp")) for i in range(2)]
    ports = free_ports(14)
    env = cluster_env(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32),
                      RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S="0")
    gcs = ports[0]
    common = ["--block", "--disable-usage-stats", "--num-cpus=1"]

    def node_ports(p: list[int]) -> list[str]:
        return [f"--node-manager-port={p[0]}", f"--object-manager-port={p[1]}",
                f"--dashboard-agent-listen-port={p[2]}", f"--dashboard-agent-grpc-port={p[3]}",
                f"--metrics-export-port={p[4]}", f"--runtime-env-agent-port={p[5]}"]

    head = [RAY, "start", "--head", *common, f"--port={gcs}", "--dashboard-host=127.0.0.1",
            f"--dashboard-port={ports[1]}", "--resources", json.dumps({"learner_node": 1}),
            f"--temp-dir={dirs[0]}", *node_ports(ports[2:8])]
    worker = [RAY, "start", f"--address=127.0.0.1:{gcs}", *common, "--resources", json.dumps({"rollout_node": 1}),
              f"--temp-dir={dirs[1]}", *node_ports(ports[8:14])]
    logs = [d / "node.log" for d in dirs]
    procs: list[subprocess.Popen] = []
    try:
        for cmd, log in ((head, logs[0]), (worker, logs[1])):
            with log.open("w") as out:
                procs.append(subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True))
            _wait_nodes(f"127.0.0.1:{gcs}", env, len(procs), procs, logs)
        yield f"127.0.0.1:{gcs}", f"http://127.0.0.1:{ports[1]}", env
    finally:
        for proc in reversed(procs):
            _stop(proc)
        left = [pid for d in dirs for pid in wait_until_gone(str(d))]
        for pid in left:  # ours beyond doubt: they name our private temp dirs
            os.kill(pid, signal.SIGKILL)
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)
        assert not left, f"Ray processes outlived their nodes: {left}"


ALIVE_PY = """
import sys, ray
ray.init(address=sys.argv[1], logging_level="ERROR")
print(sum(n["Alive"] for n in ray.nodes()))
"""


def _wait_nodes(address: str, env: dict[str, str], n: int, procs: list, logs: list[Path], timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    seen = ""
    while time.monotonic() < deadline:
        for proc, log in zip(procs, logs):
            assert proc.poll() is None, f"ray start exited {proc.returncode}:\n{log.read_text()[-3000:]}"
        seen = subprocess.run([sys.executable, "-c", ALIVE_PY, address], env=env, capture_output=True,
                              text=True, timeout=90).stdout.strip()
        if seen.splitlines() and seen.splitlines()[-1] == str(n):
            return
        time.sleep(1)
    pytest.fail(f"{n} Ray node(s) not alive after {timeout_s}s: {seen}\n{logs[-1].read_text()[-3000:]}")


def test_learner_and_rollout_worker_on_two_nodes_train_together(
    two_nodes, tiny_model_dir: Path, retail_data_dir: Path, tmp_path: Path  # noqa: ANN001
) -> None:
    address, dashboard, env = two_nodes
    overrides = [
        f"cluster.address={address}", f"policy.path={tiny_model_dir}", f"env.data_dir={retail_data_dir}",
        "env.split=test", "env.task_indices=[0,1]", "env.max_steps=2", f"run_dir={tmp_path / 'run'}",
        "logging.mode=disabled", "inference.max_new_tokens=16",
        "rollout.num_workers=1", "rollout.num_cpus_per_worker=1", "rollout.trials_per_task=2",
        "rollout.ray_resources={rollout_node: 1}", "rollout.weight_sync=collective",
        "learner.num_workers=1", "learner.num_cpus_per_worker=1", "learner.ray_resources={learner_node: 1}",
        "learner.master_addr=auto", "learner.micro_batch_size=2", "learner.global_batch_size=2",
        "learner.checkpoint_every=null",
    ]
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-c", DRIVER_PY, dashboard, *overrides], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=900)
    driver_lines = "\n".join(line for line in result.stderr.splitlines() if "pid=" not in line)
    assert result.returncode == 0, f"{result.stdout[-3000:]}\n{driver_lines[-6000:]}"
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    assert lines, f"no summary line:\n{result.stdout[-3000:]}\n{driver_lines[-3000:]}"
    out = json.loads(lines[-1])
    assert out["versions"] == [1] and out["after"] == [1, 1]  # trained on one node, served on the other
    assert out["placed"] == {"LearnerWorkerActor": ["learner_node"], "RolloutWorkerActor": ["rollout_node"]}
    assert "weight-sync group formed" in result.stderr
    print(f"two-node training slice in {time.monotonic() - started:.0f}s")
