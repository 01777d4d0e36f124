"""A weight update generates one greedy probe, not two: the probe taken when the served weights
landed is the next update's "before"; and every update path (object store, collective) goes
through the one swap (:meth:`cast_rl.rollout.worker.RolloutWorker.swap`), which accepts an
unchanged answer only for weights equal to those served before.

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
from cast_rl.inference.weight_sync import (
    WeightMeta,
    WeightSyncError,
    state_checksum,
    state_fingerprint,
)
from cast_rl.rollout import weights
from cast_rl.rollout.worker import RolloutWorker


class CountingEngine:
    """Greedy answers that follow one weight ``w``; counts generations; a load may be dropped."""

    tokenizer: Any = None

    def __init__(self) -> None:
        self.w = 0.0
        self.generations = 0
        self.drop_loads = False
        self.broadcast = 0.0
        self.model_path = "/nonexistent"  # no checkpoint on disk: never "equal to the initial weights"

    async def generate(self, prompt_ids: list[int], sampling: Sampling) -> Completion:
        self.generations += 1
        return Completion("x", token_ids=[1, 2], logprobs=[-self.w, -2 * self.w])

    async def load_weights(self, state: dict[str, torch.Tensor]) -> None:
        if not self.drop_loads:
            self.w = float(state["w"].item())

    async def receive_weights(self, meta: WeightMeta, newer_than: int = 0) -> str:
        """The collective path's end in the engine: loads :attr:`broadcast` (what the learner sent)."""
        state = _state(self.broadcast)
        await self.load_weights(state)
        return state_fingerprint(meta, state)


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


def _checkpoint(engine: CountingEngine, tmp_path: Path, w: float) -> None:
    """The engine started from a checkpoint on disk holding ``w``."""
    from safetensors.torch import save_file

    save_file(_state(w), str(tmp_path / "model.safetensors"))
    engine.model_path = str(tmp_path)


@pytest.mark.parametrize("on_disk", [0.0, 5.0])
def test_a_first_update_equal_to_the_checkpoint_may_leave_the_answer(worker, tmp_path: Path, on_disk: float) -> None:  # noqa: ANN001
    """The learner's first weights after steps that moved nothing equal the checkpoint the engine
    started from: the answer stays, and that is accepted; with another checkpoint it is refused."""
    w, engine = worker
    _checkpoint(engine, tmp_path, on_disk)
    if on_disk == 0.0:
        assert _update(w, 1, 0.0) == 1 and w.checksum == state_checksum(_state(0.0))
    else:
        with pytest.raises(WeightSyncError, match="did not change"):
            _update(w, 1, 0.0)


def _receive(worker: RolloutWorker, engine: CountingEngine, version: int, w: float,
             planned: int | None = None) -> tuple[int, str]:
    """One broadcast of ``w`` announced as ``version`` with a plan for ``planned`` (default: the same)."""
    engine.broadcast = w
    meta = WeightMeta.plan(planned or version, [("w", torch.float32, (1,))], bucket_bytes=1 << 20)
    return asyncio.run(weights.receive(worker, version, meta))


def test_the_collective_path_goes_through_the_same_swap(worker, tmp_path: Path) -> None:  # noqa: ANN001
    """weights.receive: versions, the fingerprint, one probe per update and the checks of the swap."""
    w, engine = worker
    with pytest.raises(WeightSyncError, match="plan for version 2"):
        _receive(w, engine, 1, 1.0, planned=2)
    version, printed = _receive(w, engine, 1, 1.0)
    assert (version, w.version, w.checksum) == (1, 1, printed) and engine.generations == 2
    assert _receive(w, engine, 2, 2.0)[0] == 2 and engine.generations == 3
    assert set(w.last_sync_s) == {"probe_s", "receive_load_s"}
    engine.drop_loads = True
    with pytest.raises(WeightSyncError, match="did not change"):
        _receive(w, engine, 3, 3.0)
    assert w.version == 2


@pytest.mark.parametrize("on_disk", [0.0, 5.0])
def test_a_first_broadcast_equal_to_the_checkpoint_may_leave_the_answer(worker, tmp_path: Path, on_disk: float) -> None:  # noqa: ANN001
    w, engine = worker
    _checkpoint(engine, tmp_path, on_disk)
    if on_disk == 0.0:
        assert _receive(w, engine, 1, 0.0)[0] == 1
    else:
        with pytest.raises(WeightSyncError, match="did not change"):
            _receive(w, engine, 1, 0.0)


def test_a_name_the_checkpoint_does_not_hold_is_not_compared(worker, tmp_path: Path) -> None:  # noqa: ANN001
    """A tensor the learner sends that the checkpoint does not store (a tied output layer) does not
    stop a first update equal to the checkpoint from being accepted."""
    w, engine = worker
    _checkpoint(engine, tmp_path, 0.0)
    state = {**_state(0.0), "lm_head.weight": torch.ones(2)}
    assert asyncio.run(w.update_weights(1, state, state_checksum(state))) == 1
