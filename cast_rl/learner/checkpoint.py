"""Checkpoints: sharded model and optimizer (torch.distributed.checkpoint), RNG states, cursors.

Layout of ``<run_dir>/checkpoints/step_000012/``::

    train_state/      torch.distributed.checkpoint files (model + optimizer, every rank's shard)
    rng_rank0.pt ...  each learner rank's RNG states (python, numpy, torch CPU and CUDA)
    schedule.pt       the learning-rate schedule of the current phase and its step, if any
    meta.json         step, collection rounds, policy version, data cursor, replay-buffer cursor

The driver keeps no RNG state of its own: the task order is a seeded function of the data cursor
(:class:`~cast_rl.learner.loop.TaskCursor`), so the cursor is enough to resume it.

``meta.json`` is written last (by the driver, after every rank finished), so a directory without
it is an interrupted save and :func:`latest_checkpoint` skips it.  DCP checkpoints reshard on
load: a run may resume with a different number of learner workers.  With LoRA
(``learner.lora``) the frozen base weights are not saved: a resumed learner loads them from its
model directory again, and the adapters and their optimizer state from ``train_state/`` (a tied
output embedding, which torch's state dict lists apart from the input embedding, is saved too).
"""

from __future__ import annotations

import json
import logging
import random
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

logger = logging.getLogger(__name__)

META = "meta.json"
_STEP_DIR = re.compile(r"^step_(\d+)$")


def checkpoint_dir(run_dir: str | Path, step: int) -> Path:
    return Path(run_dir) / "checkpoints" / f"step_{step:06d}"


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest complete checkpoint under ``<run_dir>/checkpoints``, or None."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return None
    done = [(int(m.group(1)), p) for p in root.iterdir()
            if (m := _STEP_DIR.match(p.name)) and (p / META).is_file()]
    return max(done)[1] if done else None


def write_meta(path: str | Path, meta: dict[str, Any]) -> None:
    """Write ``meta.json`` atomically: the marker that the checkpoint is complete."""
    path = Path(path)
    tmp = path / (META + ".tmp")
    tmp.write_text(json.dumps(meta, indent=2, sort_keys=True))
    tmp.replace(path / META)


def read_meta(path: str | Path) -> dict[str, Any]:
    return json.loads((Path(path) / META).read_text())


def capture_rng() -> dict[str, Any]:
    """Every RNG state this process uses."""
    import numpy as np

    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    import numpy as np

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _options(model: torch.nn.Module) -> Any:
    """State-dict options: a model with frozen parameters (LoRA's base weights, which never
    change and are loaded from the model directory again) saves and loads its trainable ones only."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(ignore_frozen_params=any(not p.requires_grad for p in model.parameters()))


def save_train_state(path: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, rank: int) -> None:
    """Collective: every rank writes its model and optimizer shards plus its RNG states."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model_sd, optim_sd = get_state_dict(model, optimizer, options=_options(model))
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(path / "train_state"))
    torch.save(capture_rng(), path / f"rng_rank{rank}.pt")


def load_train_state(path: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, rank: int) -> None:
    """Collective: load model and optimizer shards (resharding if needed) and this rank's RNG."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    path = Path(path)
    options = _options(model)
    model_sd, optim_sd = get_state_dict(model, optimizer, options=options)  # also creates empty optimizer state
    state: dict[str, Any] = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=str(path / "train_state"))  # every key asked for must be there
    if options.ignore_frozen_params:
        options = replace(options, strict=False)  # the frozen weights are not in the state: keep them
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"],
                   options=options)
    rng = path / f"rng_rank{rank}.pt"
    if rng.is_file():
        restore_rng(torch.load(rng, weights_only=False))
    else:  # resumed with more ranks than were saved: the new ranks keep their seeded state
        logger.warning("no RNG state for rank %d in %s", rank, path)


SCHEDULE = "schedule.pt"


def save_schedule(path: str | Path, state: dict[str, Any] | None) -> None:
    """Rank 0: the learner's schedule (:meth:`cast_rl.learner.schedule.PhaseSchedule.state_dict`);
    None (a constant learning rate, which the optimizer state holds) writes nothing."""
    if state is not None:
        torch.save(state, Path(path) / SCHEDULE)


def load_schedule(path: str | Path) -> dict[str, Any] | None:
    """The schedule :func:`save_schedule` wrote, or None."""
    file = Path(path) / SCHEDULE
    return torch.load(file, weights_only=False) if file.is_file() else None
