"""One metrics logger for every stage: console lines plus a W&B run (offline by default).

Metric names are namespaced: ``rollout/``, ``critic/``, ``train/``, ``eval/``, ``system/`` (and
``label/`` for the labeller); a name outside them is a programming error.  The W&B mode comes from
``WANDB_MODE`` when set, else from ``logging.mode`` in the config; offline runs land under
``<run_dir>/wandb`` and can be uploaded later with ``wandb sync <run_dir>/wandb/offline-run-*``.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cast_rl.config.schema import LoggingConfig

logger = logging.getLogger(__name__)

NAMESPACES = ("rollout", "critic", "train", "eval", "system", "label", "blame", "benefit")


class MetricsLogger:
    """Log scalar metrics (and tables) to the console and to one W&B run."""

    def __init__(
        self,
        cfg: LoggingConfig,
        run_dir: str | Path,
        config: Mapping[str, Any] | None = None,
        job_type: str | None = None,
    ) -> None:
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.mode = os.environ.get("WANDB_MODE") or cfg.mode
        self._run: Any = None
        self._step = 0
        if self.mode != "disabled":
            import wandb

            name = cfg.run_name or time.strftime("run-%Y%m%d-%H%M%S")
            self._run = wandb.init(
                project=cfg.project,
                group=cfg.group or name,
                name=name,
                job_type=job_type,
                mode=self.mode,
                dir=str(self.run_dir),
                config=dict(config or {}),
                reinit="create_new",
                settings=wandb.Settings(silent=True, console="off", x_disable_stats=True),
            )

    @property
    def run_path(self) -> Path | None:
        """The directory of the W&B run files (offline: ``<run_dir>/wandb/offline-run-...``)."""
        return Path(self._run.dir).parent if self._run is not None else None

    def log(self, metrics: Mapping[str, float | int], step: int | None = None) -> None:
        for key in metrics:
            if key.split("/", 1)[0] not in NAMESPACES or "/" not in key:
                raise ValueError(f"metric {key!r} must start with one of {', '.join(NAMESPACES)}/")
        step = self._step if step is None else step
        self._step = max(self._step, step + 1)
        logger.info(
            "step %d | %s", step, " ".join(f"{k}={_fmt(v)}" for k, v in sorted(metrics.items()))
        )
        if self._run is not None:
            self._run.log(dict(metrics), step=step)

    def log_table(self, key: str, columns: list[str], rows: list[list[Any]]) -> None:
        """A W&B table (e.g. sample trajectories with their critiques)."""
        if self._run is None:
            return
        import wandb

        self._run.log({key: wandb.Table(columns=columns, data=rows)}, step=max(self._step - 1, 0))

    def finish(self) -> None:
        if self._run is not None:
            self._run.finish()
            self._run = None

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.finish()


def _fmt(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def read_offline_history(run_path: str | Path) -> list[dict[str, Any]]:
    """The history rows of an offline W&B run, read back from its ``.wandb`` file.

    The file is W&B's record log: a 7-byte header, then LevelDB-log-style 32 KiB blocks of
    chunks (4-byte checksum, 2-byte length, 1-byte type: full/first/middle/last), each record a
    serialized ``wandb_internal_pb2.Record``.
    """
    import json
    import struct

    from wandb.proto import wandb_internal_pb2

    files = sorted(Path(run_path).glob("*.wandb"))
    if not files:
        raise FileNotFoundError(f"no .wandb file in {run_path}")
    raw = files[0].read_bytes()
    if raw[:4] != b":W&B":
        raise ValueError(f"{files[0]} is not a W&B record log")
    rows: list[dict[str, Any]] = []
    pos, pending = 7, b""
    block = 32768
    while pos + 7 <= len(raw):
        if block - pos % block < 7:  # too little room for a chunk header: block padding
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", raw[pos : pos + 7])
        chunk = raw[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == 0 and length == 0:
            break
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind not in (1, 4):
            continue
        record = wandb_internal_pb2.Record()
        record.ParseFromString(pending)
        if record.WhichOneof("record_type") == "history":
            rows.append(
                {
                    item.key or "/".join(item.nested_key): json.loads(item.value_json)
                    for item in record.history.item
                }
            )
    return rows
