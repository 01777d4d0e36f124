"""Every config file loads; bad keys and values fail at load time with one line naming the key."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cast_rl.config import CastConfig, ConfigError, load_config, to_yaml
from cast_rl.config.schema import field_docs

CONFIG_FILES = sorted((Path(__file__).resolve().parents[1] / "configs").rglob("*.yaml"))


def test_there_are_configs() -> None:
    assert CONFIG_FILES


@pytest.mark.parametrize("path", CONFIG_FILES, ids=[p.name for p in CONFIG_FILES])
def test_every_config_file_loads(path: Path) -> None:
    cfg = load_config(path)
    assert isinstance(cfg, CastConfig)
    # A round trip through YAML gives the same config: nothing is lost in `config show`.
    dumped = path.parent / "__roundtrip__.yaml"
    try:
        dumped.write_text(to_yaml(cfg))
        assert load_config(dumped) == cfg
    finally:
        dumped.unlink()


def test_overrides_apply_and_keep_types() -> None:
    cfg = load_config(None, ["learner.lr=1e-6", "env.task_indices=[1,2]", "critic.verification_budget=2"])
    assert cfg.learner.lr == 1e-6
    assert cfg.env.task_indices == [1, 2]
    assert cfg.critic.verification_budget == 2
    assert load_config().learner.lr == CastConfig().learner.lr


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("learner.lrr=1e-6", "unknown key 'learner.lrr'; allowed keys of learner: num_workers, lr,"),
        ("learner.lr=fast", "learner.lr='fast' is not allowed; expected float"),
        ("env.domain=banking", "env.domain='banking' is not allowed; choose one of retail, airline"),
        ("rollout.num_workers=0", "rollout.num_workers=0 is not allowed; it must be > 0"),
        ("learner.global_batch_size=10", "learner.global_batch_size=10 is not allowed"),
        ("nonsense=1", "unknown key 'nonsense'"),
        ("pipeline.grpo_lr=0", "pipeline.grpo_lr=0.0 is not allowed; it must be > 0"),
    ],
)
def test_bad_key_or_value_names_the_key(override: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, [override])
    message = str(info.value)
    assert expected in message
    assert "\n" not in message


SENTINELS = {
    "eval.trials": 3, "algorithm.tasks_per_step": 2, "algorithm.clip_ratio_low": 0.1,
    "algorithm.clip_ratio_high": 0.28, "learner.grad_clip": 0.5,
    "learner.max_tokens_per_micro_batch": 64, "learner.checkpoint_every": 5, "pipeline.train_tasks": 2,
    "pipeline.benefit_tasks": 2, "pipeline.grpo_lr": 5e-5,
}
"""Keys where None (once 0) means "the other value" or "off", with a value each."""


@pytest.mark.parametrize("key", sorted(SENTINELS))
def test_none_sentinels_take_none_and_values(key: str) -> None:
    section, name = key.split(".")
    default = {"learner.grad_clip": 1.0, "learner.checkpoint_every": 10}.get(key)
    assert getattr(getattr(load_config(), section), name) == default
    assert getattr(getattr(load_config(None, [f"{key}=null"]), section), name) is None
    assert getattr(getattr(load_config(None, [f"{key}={SENTINELS[key]}"]), section), name) == SENTINELS[key]


def test_none_sentinels_resolve_in_their_readers() -> None:
    from cast_rl.learner.batch import split_micro_batches
    from cast_rl.learner.loop import tasks_per_step
    from cast_rl.learner.sample import Sample
    from launchers.eval import eval_trials

    cfg = load_config(None, ["rollout.trials_per_task=4", "learner.global_batch_size=16"])
    assert eval_trials(cfg) == 4 and tasks_per_step(cfg) == 4
    cfg = load_config(None, ["eval.trials=2", "algorithm.tasks_per_step=3"])
    assert eval_trials(cfg) == 2 and tasks_per_step(cfg) == 3
    samples = [Sample(f"s{i}", "outcome_groups", [1] * 10, [1] * 10, [0.0] * 10) for i in range(4)]
    assert [len(g) for g in split_micro_batches(samples, 4, None)] == [4]
    assert [len(g) for g in split_micro_batches(samples, 4, 20)] == [2, 2]
    for key in ("eval.trials", "algorithm.tasks_per_step", "pipeline.train_tasks", "learner.checkpoint_every"):
        with pytest.raises(ConfigError, match=f"{key}=0 is not allowed"):
            load_config(None, [f"{key}=0"])


def test_bad_key_in_yaml_names_file_and_key(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("learner:\n  lr: 1e-6\n  warmup: 3\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml.*unknown key 'learner\.warmup'"):
        load_config(path)


def test_base_chain(tmp_path: Path) -> None:
    (tmp_path / "base.yaml").write_text("learner:\n  lr: 0.5\nseed: 3\n")
    (tmp_path / "child.yaml").write_text("base: base.yaml\nseed: 4\n")
    cfg = load_config(tmp_path / "child.yaml")
    assert (cfg.learner.lr, cfg.seed) == (0.5, 4)


def test_every_field_is_documented() -> None:
    import dataclasses

    from cast_rl.config import schema

    for obj in vars(schema).values():
        if dataclasses.is_dataclass(obj) and obj.__module__.startswith("cast_rl.config."):
            for name, doc in field_docs(obj).items():
                assert doc, f"{obj.__name__}.{name} has no docstring"


def test_cli_config_show_and_one_line_error() -> None:
    ok = subprocess.run(
        [sys.executable, "-m", "cast_rl.cli", "config", "show", "default", "learner.lr=0.001"],
        capture_output=True, text=True, check=True,
    )
    assert "lr: 0.001" in ok.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "cast_rl.cli", "config", "show", "default", "learner.lr=abc"],
        capture_output=True, text=True,
    )
    assert bad.returncode == 2
    assert bad.stderr.strip() == "config error (command line): learner.lr='abc' is not allowed; expected float"


@pytest.mark.parametrize(
    ("name", "gpus"),
    [("qwen3_4b_1x8gpu.yaml", 8), ("qwen3_8b_1x8gpu.yaml", 8), ("qwen3_8b_4x8gpu.yaml", 32)],
)
def test_paper_gpu_layouts_fit_their_nodes(name: str, gpus: int) -> None:
    from cast_rl.config.resources import gpus_required

    cfg = load_config(Path(__file__).resolve().parents[1] / "configs" / "paper" / name)
    need = gpus_required(cfg)
    assert need["peak"] <= gpus, need
    assert need["learner"] >= 4 and need["rollout"] >= 2, need
    assert cfg.policy.path.startswith("/models/Qwen3-")
    assert cfg.eval.domains == ["retail", "airline", "telecom", "telehealth"]
    assert cfg.critic.backend == "trained" and cfg.critic.num_gpus_per_replica == 1 and cfg.teacher.enabled
    assert need["critic"] == cfg.critic.num_replicas  # the critic actors ask Ray for their GPUs


def test_several_files_merge_in_order(tmp_path: Path) -> None:
    """A second YAML file (an overlay such as configs/paper/rehearsal_cpu.yaml) merges after the
    first (after its base: chain), overrides after both; on the command line it is an argument
    ending in .yaml."""
    import argparse

    from cast_rl.config.args import add_config_arguments, config_from_args

    (tmp_path / "base.yaml").write_text("learner:\n  lr: 0.5\nseed: 3\n")
    (tmp_path / "layout.yaml").write_text("base: base.yaml\nseed: 4\nrun_dir: runs/layout\n")
    (tmp_path / "overlay.yaml").write_text("seed: 5\npolicy:\n  path: ${run_dir}/models/p\n")
    cfg = load_config([tmp_path / "layout.yaml", tmp_path / "overlay.yaml"], ["run_dir=runs/x"])
    assert (cfg.learner.lr, cfg.seed, cfg.policy.path) == (0.5, 5, "runs/x/models/p")
    parser = argparse.ArgumentParser()
    add_config_arguments(parser)
    args = parser.parse_args([str(tmp_path / "layout.yaml"), str(tmp_path / "overlay.yaml"), "run_dir=runs/x"])
    assert config_from_args(args) == cfg
    with pytest.raises(ConfigError, match="missing.yaml does not exist"):
        config_from_args(parser.parse_args([str(tmp_path / "layout.yaml"), str(tmp_path / "missing.yaml")]))
