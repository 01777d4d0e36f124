"""A weight update generates one greedy probe, not two: the probe taken when the served weights
landed is the next update's "before".

The rollout worker checks that an update took effect by comparing a greedy probe before and
after the load (:meth:`cast_rl.rollout.worker.RolloutWorker._swap`).  The weights served between
two updates are the ones the last update left, so its "after" probe is reused; an update that
fails forgets it.  A stand-in engine counts the probes; the real engines run in
``tests/rollout/test_rollout_ray.py`` and ``tests/rollout/test_weight_sync_collective.py``.

Run: .venv/bin/python -m pytest tests/rollout/test_update_probes.py -q
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from cast_rl.config import load_config
from cast_rl.envs.core import load_domain_data
from cast_rl.inference.base import Completion, Sampling
from cast_rl.inference.weight_sync import WeightSyncError, state_checksum
from cast_rl.rollout.worker import RolloutWorker


class CountingEngine:
    """Greedy answers that follow one weight ``w``; counts generations; a load may be dropped."""

    tokenizer: Any = None

    def __init__(self) -> None:
        self.w = 0.0
        self.generations = 0
        self.drop_loads = False
        self.model_path = "/nonexistent"  # no checkpoint on disk: never "equal to the initial weights"

    async def generate(self, prompt_ids: list[int], sampling: Sampling) -> Completion:
        self.generations += 1
        return Completion("x", token_ids=[1, 2], logprobs=[-self.w, -2 * self.w])

    async def load_weights(self, state: dict[str, torch.Tensor]) -> None:
        if not self.drop_loads:
            self.w = float(state["w"].item())


def _state(w: float) -> dict[str, torch.Tensor]:
    return {"w": torch.tensor([w])}


@pytest.fixture
def worker(retail_data_dir: Path) -> tuple[RolloutWorker, CountingEngine]:
    engine = CountingEngine()
    w = RolloutWorker(load_config(None, [f"env.data_dir={retail_data_dir}"]),
                      load_domain_data("retail", retail_data_dir), engine)
    w.engine.tokenizer = lambda text, add_special_tokens: SimpleNamespace(input_ids=[1, 2, 3])
    return w, engine


def _update(worker: RolloutWorker, version: int, w: float) -> int:
    state = _state(w)
    return asyncio.run(worker.update_weights(version, state, state_checksum(state)))


def test_only_the_first_update_probes_before_loading(worker) -> None:  # noqa: ANN001
    w, engine = worker
    assert _update(w, 1, 1.0) == 1 and engine.generations == 2  # nothing landed yet: before and after
    assert _update(w, 2, 2.0) == 2 and engine.generations == 3  # before = the probe taken when 1 landed
    assert _update(w, 3, 3.0) == 3 and engine.generations == 4


def test_a_load_that_did_not_take_effect_is_still_caught(worker) -> None:  # noqa: ANN001
    """The reused probe is the served weights' one: a dropped load answers the same and is refused."""
    w, engine = worker
    _update(w, 1, 1.0)
    engine.drop_loads = True
    with pytest.raises(WeightSyncError, match="did not change"):
        _update(w, 2, 2.0)
    assert w.version == 1 and engine.w == 1.0


def test_a_failed_update_forgets_the_probe(worker) -> None:  # noqa: ANN001
    """After a refused update the served weights are not known: the next update probes them again."""
    w, engine = worker
    _update(w, 1, 1.0)
    engine.drop_loads = True
    with pytest.raises(WeightSyncError):
        _update(w, 2, 2.0)
    engine.drop_loads = False
    before = engine.generations
    assert _update(w, 3, 3.0) == 3 and engine.generations == before + 2
