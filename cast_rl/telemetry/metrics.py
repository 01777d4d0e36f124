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
from collections.abc import Iterator, Mapping
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
        """Finish the run; an offline run is on disk whole (its exit record written) on return."""
        if self._run is None:
            return
        run_path = self.run_path if self.mode == "offline" else None
        self._run.finish()
        self._run = None
        if run_path is not None:
            try:
                read_offline_history(run_path, timeout=30.0)
            except (OSError, TimeoutError, ValueError) as err:
                logger.warning("offline W&B run not flushed: %s", err)

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.finish()


def _fmt(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def read_offline_history(run_path: str | Path, timeout: float = 60.0) -> list[dict[str, Any]]:
    """The history rows of an offline W&B run, read back from its ``.wandb`` file.

    ``run.finish()`` can return before wandb-core has flushed the file (the first run of a
    process often leaves only the header on disk for a moment), so this waits up to ``timeout``
    seconds for the run's ``exit`` record, the last one W&B writes, and raises ``TimeoutError``
    naming the file when it never comes.
    """
    import json

    path = _offline_log(run_path)
    deadline = time.monotonic() + timeout
    while True:
        records = list(_offline_records(path))
        if records and records[-1].WhichOneof("record_type") == "exit":
            break
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"{path} holds no exit record after {timeout:.0f} s: the run is unfinished "
                "or W&B never flushed it"
            )
        time.sleep(0.05)
    return [
        {
            item.key or "/".join(item.nested_key): json.loads(item.value_json)
            for item in record.history.item
        }
        for record in records
        if record.WhichOneof("record_type") == "history"
    ]


def _offline_log(run_path: str | Path) -> Path:
    files = sorted(Path(run_path).glob("*.wandb"))
    if not files:
        raise FileNotFoundError(f"no .wandb file in {run_path}")
    return files[0]


def _offline_records(path: Path) -> Iterator[Any]:
    """The records of a W&B record log, as far as they are on disk.

    The file is a 7-byte header, then LevelDB-log-style 32 KiB blocks of chunks (4-byte
    checksum, 2-byte length, 1-byte type: full/first/middle/last), each record a serialized
    ``wandb_internal_pb2.Record``; a record cut short at the end of the file is not yielded.
    """
    import struct

    from wandb.proto import wandb_internal_pb2

    raw = path.read_bytes()
    if raw[:4] != b":W&B":
        raise ValueError(f"{path} is not a W&B record log")
    pos, pending = 7, b""
    block = 32768
    while pos + 7 <= len(raw):
        if block - pos % block < 7:  # too little room for a chunk header: block padding
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", raw[pos : pos + 7])
        if pos + 7 + length > len(raw):
            return
        chunk = raw[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == 0 and length == 0:
            return
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind not in (1, 4):
            continue
        record = wandb_internal_pb2.Record()
        record.ParseFromString(pending)
        yield record
