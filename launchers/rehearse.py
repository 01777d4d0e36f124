"""CPU rehearsal of the GPU layouts in ``configs/paper/``: every stage of each, at tiny sizes.

    make rehearse                                    # every layout in configs/paper/
    python -m launchers.rehearse configs/paper/qwen3_4b_1x8gpu.yaml [LAYOUT ...] [key=value ...]

For each layout: the layout with the overlay ``configs/paper/rehearsal_cpu.yaml`` (sizes only:
tiny models built offline, no GPUs, a few tasks per domain, one or two steps per stage) and the
overrides, into ``runs/rehearsal/<layout>`` (``--run-root``).  The layouts' simulated user is an
LLM behind an OpenAI-compatible endpoint, so this builds the tiny user model, starts a real
``vllm serve`` on it on 127.0.0.1 (a free port; its log in ``<run_dir>/user_server.log``), waits
until it lists the model, runs ``cast-rl pipeline LAYOUT OVERLAY ... user.inference.base_url=...``
in a child process and stops the server (its process group, by the PID started here).  Then it
checks what a finished rehearsal has: every stage's ``DONE.json`` and a report whose groups name
every evaluated domain.  Exits 1 when a layout fails either.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cast_rl.config import load_config
from cast_rl.config.schema import STAGE_DIRS, CastConfig
from cast_rl.models.setup import ensure_model, training_corpus

logger = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[1]
OVERLAY = REPO / "configs" / "paper" / "rehearsal_cpu.yaml"
LAYOUTS = tuple(sorted((REPO / "configs" / "paper").glob("qwen3_*.yaml")))
"""The GPU layouts: every ``configs/paper/qwen3_*.yaml``."""
SERVER_START_TIMEOUT_S = 900.0
"""How long ``vllm serve`` may take to list its model (about 40 s on a quiet 2-core machine)."""


def rehearsal_config(layout: str | Path, overrides: list[str]) -> CastConfig:
    """The layout with the rehearsal overlay and ``overrides`` (which name run_dir)."""
    return load_config([layout, OVERLAY], overrides)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the server binds it a moment later)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def vllm_server(model: str, max_model_len: int, log_path: Path, seed: int = 0,
                timeout_s: float = SERVER_START_TIMEOUT_S, api_key: str | None = None) -> Iterator[str]:
    """A real ``vllm serve`` of ``model`` (served under that same name) on 127.0.0.1; yields its
    ``/v1`` base URL once ``/v1/models`` answers, and stops it (its whole process group) after.
    With ``api_key`` the server requires it (and the readiness check sends it)."""
    port = free_port()
    cmd = [*_serve_command(model), "--served-model-name", model, "--host", "127.0.0.1", "--port", str(port),
           "--dtype", "float32", "--enforce-eager", "--gpu-memory-utilization", "0.1",
           "--max-model-len", str(max_model_len), "--seed", str(seed), *(["--api-key", api_key] if api_key else [])]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    base_url = f"http://127.0.0.1:{port}/v1"
    try:
        _wait_until_listed(proc, base_url, model, log_path, timeout_s, api_key)
        logger.info("vllm serve %s on %s (pid %d)", model, base_url, proc.pid)
        yield base_url
    finally:
        _stop(proc)


def _serve_command(model: str) -> list[str]:
    """``vllm serve MODEL``; where the ``vllm`` script cannot start, the module it runs the same
    server from (vllm-cpu 0.32's script dies reading the version of a distribution named ``vllm``,
    which is installed as ``vllm-cpu``)."""
    try:
        importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model]
    return [str(Path(sys.executable).with_name("vllm")), "serve", model]


def _wait_until_listed(proc: subprocess.Popen, base_url: str, model: str, log_path: Path, timeout_s: float,
                       api_key: str | None = None) -> None:
    request = urllib.request.Request(f"{base_url}/models",
                                     headers={"Authorization": f"Bearer {api_key}"} if api_key else {})
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log_path.read_text()[-2000:]
            raise RuntimeError(f"vllm serve exited with {proc.returncode} before serving; {log_path} ends:\n{tail}")
        try:
            with urllib.request.urlopen(request, timeout=5) as resp:
                if model in [m["id"] for m in json.load(resp)["data"]]:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass  # not listening yet
        time.sleep(1.0)  # polling interval of a readiness check with a deadline
    raise TimeoutError(f"vllm serve did not list {model} at {base_url}/models within {timeout_s:.0f} s; see {log_path}")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)  # the server and the engine processes it started
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def check_rehearsal(cfg: CastConfig) -> list[str]:
    """What a finished rehearsal lacks: stages without ``DONE.json``, and evaluated domains that
    no group of the report names.  Empty when it is complete."""
    root = Path(cfg.run_dir)
    problems = [f"{STAGE_DIRS[s]}/DONE.json missing" for s in cfg.pipeline.stages
                if not (root / STAGE_DIRS[s] / "DONE.json").exists()]
    pipeline = root / "pipeline.json"
    if not pipeline.exists():
        return [*problems, "pipeline.json missing"]
    domains = report_domains(Path(json.loads(pipeline.read_text())["report"]))
    wanted = cfg.eval.domains or [cfg.env.domain]
    problems += [f"the report has no group of domain {d}" for d in wanted if d not in domains]
    return problems


def report_domains(report_path: Path) -> set[str]:
    """Domains named by the groups (``<domain>/<split>``) of every configuration of a report."""
    report = json.loads(report_path.read_text())
    return {group.split("/")[0] for config in report["configurations"] for group in config["groups"]}


def rehearse(layout: str | Path, overrides: list[str], run_root: Path) -> dict[str, Any]:
    """One layout end to end (module docstring); returns its run_dir, wall time and problems."""
    layout = Path(layout)
    overrides = [f"run_dir={run_root / layout.stem}", *overrides]
    cfg = rehearsal_config(layout, overrides)
    user = cfg.user
    if user.type != "llm" or user.inference.backend != "openai":
        raise ValueError(f"{layout}: the rehearsal serves an LLM user behind an OpenAI-compatible endpoint; "
                         f"this layout has user.type={user.type}, user.inference.backend={user.inference.backend}")
    ensure_model(user.model, training_corpus(Path(cfg.env.data_dir)))
    start = time.perf_counter()
    with vllm_server(user.model.path, user.inference.max_model_len, Path(cfg.run_dir) / "user_server.log",
                     seed=cfg.seed) as base_url:
        cmd = [sys.executable, "-m", "cast_rl.cli", "pipeline", str(layout), str(OVERLAY), *overrides,
               f"user.inference.base_url={base_url}"]
        logger.info("running %s", " ".join(cmd))
        # the local server takes no key; the client still wants its variable set
        key = user.inference.api_key_env
        rc = subprocess.run(cmd, env={**os.environ, key: os.environ.get(key) or "rehearsal"}).returncode
    problems = ([f"cast-rl pipeline exited with {rc}"] if rc else []) + check_rehearsal(cfg)
    return {"layout": str(layout), "run_dir": cfg.run_dir, "wall_s": round(time.perf_counter() - start, 1),
            "problems": problems}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("args", nargs="*", metavar="LAYOUT|KEY=VALUE",
                        help="layout files (default: every configs/paper/qwen3_*.yaml) and overrides for each")
    parser.add_argument("--run-root", type=Path, default=Path("runs/rehearsal"),
                        help="each layout runs in <run-root>/<layout name>")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    layouts = [a for a in args.args if "=" not in a] or [str(p) for p in LAYOUTS]
    overrides = [a for a in args.args if "=" in a]
    results = [rehearse(layout, overrides, args.run_root) for layout in layouts]
    for result in results:
        status = "ok" if not result["problems"] else "FAILED: " + "; ".join(result["problems"])
        print(f"{result['layout']}: {status} ({result['wall_s']} s, {result['run_dir']})")
    return 1 if any(r["problems"] for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
