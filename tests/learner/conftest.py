"""Fixtures for the learner tests: a small-vocabulary tiny model, one torch thread, configs."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from cast_rl.config import CastConfig, load_config


@pytest.fixture(scope="session")
def learner_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen3 with the base corpus only (vocabulary ~640): fast to train on two cores."""
    from cast_rl.models.tiny import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("learner-models") / "tiny", seed=0)


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    """Two shared cores: intra-op threads spin against each other and run ~10x slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def make_cfg(learner_model_dir: Path, tmp_path: Path) -> Callable[..., CastConfig]:
    """A learner config for the tiny model under tmp_path; arguments are ``key=value`` overrides."""

    def make(*overrides: str, run_dir: Path | None = None) -> CastConfig:
        base = [
            f"policy.path={learner_model_dir}", f"run_dir={run_dir or tmp_path / 'run'}",
            "learner.num_workers=1", "learner.micro_batch_size=4", "learner.global_batch_size=8",
            "learner.lr=1e-3", "learner.checkpoint_every=null", "logging.mode=disabled",
        ]
        return load_config(None, base + list(overrides))

    return make
