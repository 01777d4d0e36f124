"""The GPU memory estimate per actor (cast_rl.config.memory, ``cast-rl plan``): hand-worked sizes
of a 2-layer model, the paper's architectures against their published sizes, parameter counts
against real checkpoints, every paper layout against its GPUs, and docs/reproduce.md's tables
against the module's output.

Run: .venv/bin/python -m pytest tests/test_memory_plan.py -q
"""

from __future__ import annotations

import json
import re
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from cast_rl.config import load_config
from cast_rl.config.memory import (
    GIB,
    QWEN3_ARCHS,
    arch_from_config_json,
    engine_memory,
    layout_markdown,
    learner_memory,
    not_fitting,
    plan,
)
from cast_rl.config.schema import InferenceConfig, ModelConfig

REPO = Path(__file__).resolve().parents[1]
LAYOUTS = sorted(p.name for p in (REPO / "configs" / "paper").glob("qwen3_*.yaml"))
PLAN_BLOCK = re.compile(r"<!-- plan: (\S+) -->\n(.*?)<!-- /plan -->", re.S)

# A 2-layer Qwen3: hidden 8, MLP 16, 2 query heads and 1 KV head of width 4, 32 tokens, tied.
TINY = {"model_type": "qwen3", "num_hidden_layers": 2, "hidden_size": 8, "intermediate_size": 16,
        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 4, "vocab_size": 32,
        "tie_word_embeddings": True, "torch_dtype": "bfloat16"}
# per layer: q 8x8 + k 8x4 + v 8x4 + o 8x8 = 192; MLP 3 x 8 x 16 = 384; norms 2 x 8 + q/k norms 2 x 4 = 24
TINY_LAYER = 192 + 384 + 24
TINY_PARAMS = 2 * TINY_LAYER + 32 * 8 + 8  # + embeddings (tied) + final norm = 1464


@pytest.fixture
def tiny_dir(tmp_path: Path) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    return tmp_path


def test_a_two_layer_model_by_hand(tiny_dir: Path) -> None:
    arch = arch_from_config_json(tiny_dir / "config.json")
    assert (arch.layer_params, arch.params, TINY_PARAMS) == (600, 1464, 1464)
    assert arch.kv_bytes_per_token(2) == 2 * 2 * 1 * 4 * 2 == 32  # K and V x layers x kv heads x head_dim x bf16
    assert arch.kv_bytes_per_token(2, tp=2) == 32  # one KV head: each rank keeps a copy
    assert arch.lora_params(2, ["q_proj", "v_proj"]) == 2 * (2 * (8 + 8) + 2 * (8 + 4)) == 112


def test_the_learner_shards_master_weights_grads_and_adam_by_hand(tiny_dir: Path) -> None:
    cfg = load_config(None, [f"policy.path={tiny_dir}", "policy.dtype=bfloat16", "learner.num_workers=2",
                             "learner.global_batch_size=4", "learner.micro_batch_size=1",
                             "learner.max_tokens_per_micro_batch=16", "algorithm.kl_coef=0.001",
                             "learner.activation_checkpointing=true"])
    r = learner_memory("learner", cfg, cfg.policy, "policy.path", 80.0)
    assert (r.weights, r.grads, r.optimizer, r.reference) == (4 * 1464 / 2, 4 * 1464 / 2, 8 * 1464 / 2, 4 * 1464 / 2)
    assert r.optimizer == 5856  # AdamW's two float32 moments, half of them on each of 2 ranks
    # two gathered bf16 layers + checkpointed bf16 layer inputs + float32 logits of 16 tokens
    assert r.working == 2 * 600 * 2 + 16 * 8 * 2 * 2 + 16 * 32 * 4 == 4960
    lora = load_config(None, [f"policy.path={tiny_dir}", "learner.num_workers=2", "learner.global_batch_size=4",
                              "learner.micro_batch_size=1", "learner.lora.rank=2",
                              "learner.lora.target_modules=[q_proj,v_proj]", "algorithm.kl_coef=0.001"])
    r = learner_memory("learner", lora, lora.policy, "policy.path", 80.0)
    # frozen float32 base + adapters, sharded; only the 112 adapter weights have grads and moments
    assert (r.weights, r.grads, r.optimizer, r.reference) == (4 * (1464 + 112) / 2, 4 * 112 / 2, 8 * 112 / 2, 0.0)


def test_an_engine_keeps_what_its_weights_leave_for_the_kv_cache(tiny_dir: Path) -> None:
    gpu_gib = 2**14 / GIB  # a 16 KiB "GPU": half of it is 8192 bytes
    model = ModelConfig(path=str(tiny_dir), make_tiny_if_missing=False)

    def engine(max_model_len: int):
        cfg = InferenceConfig(gpu_memory_utilization=0.5, max_model_len=max_model_len)
        return engine_memory("e", 1, 1, model, cfg, "policy.path", gpu_gib)

    r = engine(64)
    assert (r.budget, r.weights, r.kv_cache) == (8192, 1464 * 2, 8192 - 2928)
    assert r.kv_tokens == (8192 - 2928) // 32 == 164
    assert (engine(64).fits, engine(100).fits, engine(200).fits) == ("yes", "tight", "NO")


def test_the_paper_architectures_have_their_published_sizes() -> None:
    sizes = {name: a.params for name, a in QWEN3_ARCHS.items()}
    assert sizes == {"qwen3-4b": 4_022_468_096, "qwen3-8b": 8_190_735_360, "qwen3-32b": 32_762_123_264}
    # the model cards: 4.0B, 8.2B and 32.8B parameters
    assert [round(p / 1e9, 1) for p in sizes.values()] == [4.0, 8.2, 32.8]
    assert QWEN3_ARCHS["qwen3-8b"].kv_bytes_per_token(2) == 2 * 36 * 8 * 128 * 2


def _safetensors_numel(model_dir: Path) -> int:
    total = 0
    for path in model_dir.glob("*.safetensors"):
        with path.open("rb") as f:
            header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
        total += sum(_prod(t["shape"]) for k, t in header.items() if k != "__metadata__")
    return total


def _prod(shape: list[int]) -> int:
    out = 1
    for n in shape:
        out *= n
    return out


def test_parameter_count_matches_a_real_checkpoint(tmp_path: Path) -> None:
    from cast_rl.models.tiny import make_tiny_model

    out = make_tiny_model(tmp_path / "tiny")
    assert arch_from_config_json(out / "config.json").params == _safetensors_numel(out)
    smol = REPO / "runs" / "models" / "smollm2-135m"  # a Llama (no q/k norms), when installed
    if (smol / "config.json").is_file():
        assert arch_from_config_json(smol / "config.json").params == _safetensors_numel(smol) == 134_515_008


@pytest.mark.parametrize("name", LAYOUTS)
def test_every_paper_layout_fits_its_gpus(name: str) -> None:
    rows = plan(load_config(REPO / "configs" / "paper" / name), gpu_gib=80.0)
    # the user's Qwen3-32B on one GPU holds about 1.4 sequences of 32768 tokens (named in
    # docs/reproduce.md); the critic, served in critic.model.dtype=bfloat16, fits
    assert not_fitting(rows) == ["user simulator (outside the job): tight"]
    assert {r.actor for r in rows} >= {"rollout (policy engine)", "critic service", "teacher", "learner (policy)",
                                       "learner (critic)"}


def test_a_smaller_gpu_is_flagged_by_the_cli() -> None:
    cmd = [sys.executable, "-m", "cast_rl.cli", "plan", "configs/paper/qwen3_8b_1x8gpu.yaml"]
    ok = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert "learner (policy)" in ok.stdout and "Qwen3-32B" in ok.stdout
    small = subprocess.run([*cmd, "--gpu-gib", "40"], cwd=REPO, capture_output=True, text=True)
    assert small.returncode == 1
    assert "does not fit on 40 GiB GPUs" in small.stderr and "learner (policy): NO" in small.stderr


def test_the_reproduce_page_shows_the_module_output_for_every_layout() -> None:
    page = (REPO / "docs" / "reproduce.md").read_text()
    blocks = dict(PLAN_BLOCK.findall(page))
    assert sorted(Path(p).name for p in blocks) == LAYOUTS, "docs/reproduce.md: one plan block per layout"
    for path, shown in blocks.items():
        expected = layout_markdown(load_config(REPO / path), gpu_gib=80.0)
        assert shown == expected, (f"docs/reproduce.md's table for {path} is stale: replace it by the output of "
                                   f"`cast-rl plan {path} --markdown`")
