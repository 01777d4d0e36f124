"""Secrets stay in the environment; services we start listen on the loopback interface.

A canary API key is planted in ``OPENAI_API_KEY``.  A small flow then touches everything that
could leak it: an LLM user simulator and a teacher talking to an OpenAI-compatible endpoint (a
stub server on 127.0.0.1 that fails the first request, so the client's retry path logs too),
the W&B metrics logger in offline mode with the whole config logged, trajectory files and the
evaluation report.  Every file under the run directory (the ``.wandb`` binary included), the
captured stdout/stderr and every log record (DEBUG and up, the HTTP client's included) must be
free of the key, while the stub server must have received it.

    .venv/bin/python -m pytest tests/reliability/test_secrets.py -q
"""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from reliability_helpers import ScriptedPolicy

from cast_rl.config import load_config, to_dict

REPO = Path(__file__).resolve().parents[2]


class _StubChat(BaseHTTPRequestHandler):
    """/v1/chat/completions: a 500 on the first request, then the customer's lines."""

    authorizations: list[str] = []
    replies = ["I want to know my order status.", "###STOP###"]

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _StubChat.authorizations.append(self.headers.get("Authorization", ""))
        if len(_StubChat.authorizations) == 1:
            self._send(500, {"error": {"message": "temporarily overloaded", "type": "server_error"}})
            return
        turn = sum(m["role"] == "assistant" for m in body["messages"])
        content = self.replies[min(turn, len(self.replies) - 1)]
        self._send(200, {
            "id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}],
        })

    def _send(self, status: int, obj: dict[str, Any]) -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture()
def stub_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _StubChat)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _StubChat.authorizations = []
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def test_planted_api_key_appears_in_no_file_stream_or_log_record(
    stub_server: str, tiny_model_dir: Path, retail_data_dir: Path, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str],
) -> None:
    from transformers import AutoTokenizer

    from cast_rl.config.schema import InferenceConfig, ModelConfig, TeacherConfig
    from cast_rl.critique.teacher import build_teacher_engine
    from cast_rl.envs.core import load_domain_data
    from cast_rl.eval.report import EvalRun, build_report, write_report
    from cast_rl.inference.base import Sampling
    from cast_rl.records import write_trajectories
    from cast_rl.rollout.runner import EpisodeRunner, EpisodeSpec
    from cast_rl.telemetry.metrics import MetricsLogger

    canary = f"sk-cast-rl-canary-{uuid.uuid4().hex}"
    monkeypatch.setenv("OPENAI_API_KEY", canary)
    monkeypatch.delenv("WANDB_MODE", raising=False)  # logging.mode=offline decides
    run_dir = tmp_path / "run"
    cfg = load_config(None, [
        f"run_dir={run_dir}", f"env.data_dir={retail_data_dir}", "env.split=train", "env.max_steps=4",
        "user.type=llm", "user.inference.backend=openai", f"user.inference.base_url={stub_server}",
        "user.model.path=stub-user", "logging.mode=offline", "logging.run_name=secrets-canary",
    ])
    caplog.set_level(logging.DEBUG)  # the HTTP client's debug records too
    data = load_domain_data("retail", retail_data_dir)
    policy = ScriptedPolicy(AutoTokenizer.from_pretrained(tiny_model_dir),
                            ["Hello! How can I help you today?", "Let me look that up for you."])
    runner = EpisodeRunner(cfg, data, policy)
    trajectories = asyncio.run(runner.run_many([EpisodeSpec("train", i, 0) for i in range(2)]))
    assert [t.info["termination"] for t in trajectories] == ["user_stop", "user_stop"]

    async def teach() -> str:
        teacher = build_teacher_engine(TeacherConfig(
            model=ModelConfig(path="stub-teacher", make_tiny_if_missing=False),
            inference=InferenceConfig(backend="openai", base_url=stub_server)))
        try:
            return (await teacher.chat([{"role": "user", "content": "rewrite"}], Sampling(max_new_tokens=8))).text
        finally:
            await teacher.close()

    assert asyncio.run(teach())

    write_trajectories(run_dir / "trajectories" / "no_critic.jsonl", trajectories)
    written = write_report(build_report([EvalRun(0, trajectories)]), run_dir / "eval")
    with MetricsLogger(cfg.logging, cfg.run_dir, config=to_dict(cfg), job_type="secrets") as metrics:
        metrics.log({"rollout/episodes": len(trajectories), "eval/pass_1": 0.0})
        metrics.log_table("eval/samples", ["messages"], [[json.dumps(t.messages)] for t in trajectories])
        wandb_dir = metrics.run_path
    logging.getLogger("cast_rl").info("config: %s", to_dict(cfg))  # what a launcher might log

    # The key did reach the endpoint (so the flow really used it) ...
    assert _StubChat.authorizations and set(_StubChat.authorizations) == {f"Bearer {canary}"}
    # ... and nothing else holds it.
    files = [p for p in run_dir.rglob("*") if p.is_file()]
    assert wandb_dir is not None and list(wandb_dir.glob("*.wandb")), "the W&B binary log was written"
    assert written["report"].is_file() and (run_dir / "trajectories" / "no_critic.jsonl").is_file()
    leaking = [str(p) for p in files if canary.encode() in p.read_bytes()]
    assert leaking == []
    captured = capfd.readouterr()
    assert canary not in captured.out and canary not in captured.err
    assert caplog.records, "log records were captured"
    assert canary not in caplog.text
    assert not [r for r in caplog.records if canary in r.getMessage()]
    assert len(files) >= 8  # trajectories, report, summary, plots, W&B run files


def test_services_we_start_listen_on_loopback_by_default(tmp_path: Path) -> None:
    """Config defaults point at 127.0.0.1; a local Ray from ``init_ray`` starts no dashboard.

    Ray's own gRPC servers (GCS, raylet, core workers) listen on every interface whatever
    ``ray.init`` is given; they are Ray's, guarded by its token authentication, and reported by
    this test rather than asserted.
    """
    from cast_rl.config.schema import ClusterConfig, InferenceConfig, LearnerConfig

    assert ClusterConfig().dashboard_host == "127.0.0.1"
    assert LearnerConfig().master_addr == "127.0.0.1"
    assert InferenceConfig().base_url == ""  # no endpoint unless configured
    script = f"""
import json, psutil, ray
from cast_rl.config import load_config
from launchers.cluster import init_ray
init_ray(load_config(None, ["cluster.num_cpus=1", "rollout.num_workers=1", "run_dir={tmp_path / 'run'}"]), parts=("rollout",))
me = psutil.Process()
pids = {{p.pid: p.name() for p in [me, *me.children(recursive=True)]}}
listening = sorted({{(pids[c.pid], c.laddr.ip, c.laddr.port) for c in psutil.net_connections("inet")
                   if c.status == psutil.CONN_LISTEN and c.pid in pids}})
info = ray._private.worker.global_worker.node.address_info
print(json.dumps({{"listening": listening, "webui_url": info.get("webui_url")}}))
ray.shutdown()
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO,
                          timeout=300, env={**_env(), "RAY_USAGE_STATS_ENABLED": "0"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not report["webui_url"]  # no dashboard HTTP server
    ports = {port for _, _, port in report["listening"]}
    assert 8265 not in ports
    print("listening sockets of a local Ray:", report["listening"])


def _env() -> dict[str, str]:
    import os

    return dict(os.environ)
