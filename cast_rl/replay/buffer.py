"""The replay buffer: rollout workers add samples as episodes finish, the learner draws batches.

Behaviour, all configured by :class:`~cast_rl.config.schema.ReplayBufferConfig`:

* **Idempotent adds.** A sample whose key was ever seen (held, consumed or dropped) is ignored
  and counted as a duplicate, so a retried ``add`` never duplicates data.
* **Capacity.** Beyond ``capacity`` the oldest held samples are dropped and counted.
* **Sampling.** ``fifo`` serves the oldest first; ``priority`` serves samples a critique changed
  first (oldest first among them), then the rest.
* **Staleness.** A sample lags the learner by ``learner_version - sample.policy_version``.  At
  draw time samples lagging more than ``max_staleness`` are dropped and counted (both policies).
  With ``stale_policy=drop`` that is all; with ``wait`` producers are also throttled, AReaL-style:
  :meth:`ReplayBuffer.admit` blocks a producer until the samples it is about to generate would be
  drawn within the bound, given the samples already queued ahead of them and the learner's
  batch size, so samples are not generated only to be dropped.
* **Durability.** Every operation is appended to a JSON Lines log (``add`` with the sample,
  ``consume`` with the keys and a sequence number, ``drop`` with the keys and the reason,
  ``rewind``).  Samples cut from trajectories (``add(samples, trajectories)``) do not repeat
  their token ids there: the trajectories go once to ``<log>.trajectories.jsonl`` (the run's
  rollouts, readable by ``cast-rl view``) and the ``add`` line keeps the sample's scalars and a
  ``ref``: the trajectory's byte offset, the sample's length (a prefix of the trajectory's
  tokens), its loss mask as ``[start, end)`` runs and whether its logprobs are the trajectory's,
  those masked by the loss mask, or zero (supervised).  The sample says which trajectory and
  which logprobs (its :class:`~cast_rl.samples.Origin`, set by the builder that cut it); the
  buffer only checks that the named trajectory rebuilds the sample exactly.  A sample that fails
  the check is logged whole, marked ``origin_mismatch`` and counted (``origin_mismatches``: a
  builder bug); one without an origin (supervised examples from files) is logged whole.  A new
  buffer on the same log recovers every accepted sample that was not
  consumed or dropped, and never re-serves consumed ones.  :meth:`ReplayBuffer.cursor` is the
  sequence number of the last draw; a learner that resumes from a checkpoint taken at cursor c
  calls :meth:`ReplayBuffer.rewind` (c), which puts back what later draws took, so the resumed
  run sees exactly the data the checkpointed run would have seen.

Thread-safe: a Ray actor with ``max_concurrency > 1`` serves concurrent adds and a blocking draw.
Lines are flushed after each operation (not fsynced: a machine crash may lose the last lines).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from cast_rl.config.schema import ReplayBufferConfig
from cast_rl.jsonl import iter_jsonl
from cast_rl.records import Trajectory
from cast_rl.samples import Origin, Sample

logger = logging.getLogger(__name__)


class BufferClosed(RuntimeError):
    """The buffer was closed (the run is stopping, or a producer failed) while a caller waited."""


@dataclass
class AddResult:
    accepted: int = 0
    duplicates: int = 0
    dropped_capacity: int = 0


@dataclass
class ReplayStats:
    """Counters since the log began (recovered with it)."""

    size: int = 0
    added: int = 0
    duplicates: int = 0
    consumed: int = 0
    dropped_stale: int = 0
    dropped_capacity: int = 0
    rewinds: int = 0
    origin_mismatches: int = 0
    """Samples whose origin did not rebuild them (logged whole instead of by reference)."""


class ReplayBuffer:
    """Samples between producers and the learner (see the module doc)."""

    def __init__(self, cfg: ReplayBufferConfig, log_path: str | Path | None = None, batch_size: int = 1) -> None:
        self.cfg = cfg
        self.batch_size = batch_size
        """Samples per learner step; used only to throttle producers under stale_policy=wait."""
        self.log_path = Path(log_path) if log_path else None
        self.trajectory_path = self.log_path.with_suffix(".trajectories.jsonl") if self.log_path else None
        """Where trajectories given to :meth:`add` are written (the log's ``ref`` offsets)."""
        self._cond = threading.Condition()
        self._closed: str | None = None
        self.learner_version = 0
        self._last_draw_version = -1
        self._in_flight = 0
        """Places reserved by :meth:`admit` and not yet filled by :meth:`add`."""
        self._recover()

    # ------------------------------------------------------------------ log and recovery

    def _recover(self) -> None:
        self._items: OrderedDict[str, Sample] = OrderedDict()
        self._seen: set[str] = set()
        self._seq = 0
        self.stats = ReplayStats()
        if self.log_path is None or not self.log_path.exists():
            return
        # Only a torn last line (a crash mid-write) is tolerated; a bad line before it raises.
        self._apply([rec for _, rec in iter_jsonl(self.log_path, what="a replay log line", torn_tail="skip")])
        self._end_log_with_a_newline()
        logger.info("replay buffer recovered %d samples (cursor %d) from %s",
                    len(self._items), self._seq, self.log_path)

    def _end_log_with_a_newline(self) -> None:
        """Let the next record start a line of its own: a torn last line (skipped by recovery) is
        cut off, a whole last record that lost only its newline gets one.  Appended to as it was,
        the torn fragment would swallow the next record, lost at the next recovery."""
        assert self.log_path is not None
        data = self.log_path.read_bytes()
        if not data or data.endswith(b"\n"):
            return
        start = data.rfind(b"\n") + 1
        try:
            json.loads(data[start:])
            whole = True
        except (ValueError, RecursionError):
            whole = False
        with self.log_path.open("r+b") as f:
            if whole:
                f.seek(0, 2)
                f.write(b"\n")
            else:
                f.truncate(start)

    def _apply(self, records: list[dict[str, Any]]) -> None:
        """Rebuild state from log records (also how :meth:`rewind` works)."""
        data: dict[str, Sample] = {}
        consumed_at: dict[int, list[str]] = {}
        s = self.stats
        trajectories = _TrajectoryLines(self.trajectory_path)
        for rec in records:
            op = rec["op"]
            if op == "add":
                sample = self._rebuild(rec, trajectories)
                data[sample.key] = sample
                self._items[sample.key] = sample
                self._seen.add(sample.key)
                s.added += 1
                s.origin_mismatches += bool(rec.get("origin_mismatch"))
            elif op == "duplicate":
                s.duplicates += rec["count"]
            elif op == "consume":
                self._seq = rec["seq"]
                consumed_at[rec["seq"]] = rec["keys"]
                for k in rec["keys"]:
                    self._items.pop(k, None)
                s.consumed += len(rec["keys"])
            elif op == "drop":
                for k in rec["keys"]:
                    self._items.pop(k, None)
                if rec["reason"] == "stale":
                    s.dropped_stale += len(rec["keys"])
                else:
                    s.dropped_capacity += len(rec["keys"])
            elif op == "rewind":
                restored = [data[k] for seq in sorted(consumed_at) if seq > rec["to"] for k in consumed_at[seq]]
                for seq in [q for q in consumed_at if q > rec["to"]]:
                    s.consumed -= len(consumed_at.pop(seq))
                # Put back at the front, in their original order: they were drawn before the rest.
                self._items = OrderedDict([(x.key, x) for x in restored] + list(self._items.items()))
                self._seq = rec["to"]
                s.rewinds += 1
            else:
                raise ValueError(f"{self.log_path}: unknown replay log op {op!r}")
        s.size = len(self._items)

    @staticmethod
    def _rebuild(rec: dict[str, Any], trajectories: _TrajectoryLines) -> Sample:
        """The sample of an ``add`` record: whole, or from its trajectory ``ref``."""
        ref = rec.get("ref")
        if ref is None:
            return Sample.from_json(rec["sample"])
        traj = trajectories.at(ref["offset"])
        n = ref["length"]
        mask = [0] * n
        for start, end in ref["mask"]:
            mask[start:end] = [1] * (end - start)
        logprobs = traj.logprobs[:n]
        if ref["logprobs"] == "masked":
            logprobs = [lp if m else 0.0 for lp, m in zip(logprobs, mask)]
        elif ref["logprobs"] == "zero":
            logprobs = [0.0] * n
        return Sample(**rec["sample"], token_ids=traj.token_ids[:n], loss_mask=mask, logprobs=logprobs)

    def _write_trajectories(self, trajectories: list[Trajectory]) -> list[tuple[int, Trajectory]]:
        """Append to the trajectory file; (byte offset, trajectory) of each line."""
        assert self.trajectory_path is not None
        self.trajectory_path.parent.mkdir(parents=True, exist_ok=True)
        written = []
        with self.trajectory_path.open("ab") as f:
            for traj in trajectories:
                written.append((f.tell(), traj))
                f.write(json.dumps(traj.to_json(), ensure_ascii=False).encode() + b"\n")
        return written

    def _add_record(self, sample: Sample, sources: list[tuple[int, Trajectory]]) -> dict[str, Any]:
        """The log line of an accepted sample: a ``ref`` into the trajectory file when its origin
        names one of ``sources`` (the add call's trajectories, with their offsets) that rebuilds it
        exactly, else the whole sample (module doc)."""
        origin = sample.origin
        if origin is None or not sources:
            return {"op": "add", "sample": sample.to_json()}
        if origin.trajectory >= len(sources) or not _rebuilds(sources[origin.trajectory][1], sample, origin):
            self.stats.origin_mismatches += 1
            logger.warning("replay buffer: sample %s is not what its origin %s says; logged whole",
                           sample.key, origin)
            return {"op": "add", "sample": sample.to_json(), "origin_mismatch": True}
        runs, start = [], None
        for i, m in enumerate([*sample.loss_mask, 0]):
            if m and start is None:
                start = i
            elif not m and start is not None:
                runs.append([start, i])
                start = None
        header = {k: v for k, v in sample.to_json().items() if k not in ("token_ids", "loss_mask", "logprobs")}
        return {"op": "add", "sample": header,
                "ref": {"offset": sources[origin.trajectory][0], "length": len(sample.token_ids), "mask": runs,
                        "logprobs": origin.logprobs}}

    def _log(self, record: dict[str, Any]) -> None:
        if self.log_path is None:
            return
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("a") as f:
            f.write(json.dumps(record, separators=(",", ":")) + "\n")

    # ------------------------------------------------------------------ producers

    def add(self, samples: list[Sample], trajectories: list[Trajectory] | None = None) -> AddResult:
        """Accept new samples (ignoring keys already seen); drops the oldest beyond capacity.

        ``trajectories``: those the samples were cut from; the log then refers to them instead
        of repeating their tokens (module doc)."""
        result = AddResult()
        with self._cond:
            fresh = [s for s in samples if s.key not in self._seen]
            sources = self._write_trajectories(trajectories) if trajectories and fresh and self.log_path else []
            for sample in samples:
                if sample.key in self._seen:
                    result.duplicates += 1
                    continue
                self._log(self._add_record(sample, sources) if self.log_path else {})
                self._seen.add(sample.key)
                self._items[sample.key] = sample
                result.accepted += 1
            self._in_flight = max(0, self._in_flight - len(samples))
            if result.duplicates:
                self._log({"op": "duplicate", "count": result.duplicates})
            overflow = len(self._items) - self.cfg.capacity
            if overflow > 0:
                keys = list(self._items)[:overflow]
                self._drop(keys, "capacity")
                result.dropped_capacity = overflow
            self.stats.added += result.accepted
            self.stats.duplicates += result.duplicates
            self.stats.size = len(self._items)
            self._cond.notify_all()
        return result

    def admit(self, policy_version: int, n: int, timeout_s: float | None = None) -> bool:
        """May a producer holding weights ``policy_version`` generate ``n`` more samples now?

        Always True under ``stale_policy=drop``.  Under ``wait`` it blocks until those samples
        would be drawn within ``max_staleness``: draws take ``batch_size`` samples in queue order,
        and the admitted samples queue behind every held fresh sample and every sample admitted
        earlier but not yet added.  Admission reserves ``n`` places until the producer's ``add``.
        False on timeout, on close, or at once when the producer's weights are already too old
        (it must take new weights first).
        """
        if self.cfg.stale_policy == "drop":
            return True
        timeout = self.cfg.wait_timeout_s if timeout_s is None else timeout_s

        def too_old() -> bool:
            return self.learner_version - policy_version > self.cfg.max_staleness

        def ok() -> bool:
            if self._closed or too_old():
                return True
            return self._draw_version(self._fresh() + self._in_flight + n) - policy_version <= self.cfg.max_staleness

        with self._cond:
            if not self._cond.wait_for(ok, timeout) or self._closed or too_old():
                return False
            self._in_flight += n
            return True

    def _fresh(self) -> int:
        bound = self.learner_version - self.cfg.max_staleness
        return sum(s.policy_version >= bound for s in self._items.values())

    def _draw_version(self, position: int) -> int:
        """Learner version at which the sample at queue position ``position`` (1-based) is drawn."""
        # The learner is training on its last draw when that draw happened at the current version.
        next_draw = self.learner_version + (1 if self._last_draw_version >= self.learner_version else 0)
        return next_draw + -(-position // self.batch_size) - 1

    # ------------------------------------------------------------------ the learner

    def set_learner_version(self, version: int) -> None:
        with self._cond:
            self.learner_version = max(self.learner_version, version)
            self._cond.notify_all()

    def _drop(self, keys: list[str], reason: str) -> None:
        if not keys:
            return
        for k in keys:
            del self._items[k]
        self._log({"op": "drop", "reason": reason, "keys": keys})
        self._cond.notify_all()  # room for producers waiting for admission
        if reason == "stale":
            self.stats.dropped_stale += len(keys)
        else:
            self.stats.dropped_capacity += len(keys)
        logger.info("replay buffer dropped %d %s samples", len(keys), reason)

    def _drop_stale(self) -> None:
        bound = self.learner_version - self.cfg.max_staleness
        self._drop([k for k, s in self._items.items() if s.policy_version < bound], "stale")

    def _order(self) -> list[str]:
        if self.cfg.sampling == "priority":
            first = [k for k, s in self._items.items() if s.critique_changed]
            return first + [k for k, s in self._items.items() if not s.critique_changed]
        return list(self._items)

    def try_sample(self, n: int, learner_version: int | None = None) -> list[Sample] | None:
        """``n`` samples (dropping stale ones first), or None when fewer are held."""
        with self._cond:
            if learner_version is not None:
                self.learner_version = max(self.learner_version, learner_version)
            self._drop_stale()
            self.stats.size = len(self._items)
            if len(self._items) < n:
                return None
            keys = self._order()[:n]
            batch = [self._items.pop(k) for k in keys]
            self._last_draw_version = self.learner_version
            self._seq += 1
            self._log({"op": "consume", "seq": self._seq, "keys": keys, "learner_version": self.learner_version})
            self.stats.consumed += n
            self.stats.size = len(self._items)
            self._cond.notify_all()  # producers waiting for admission
            return batch

    def sample(self, n: int, learner_version: int | None = None, timeout_s: float | None = None) -> list[Sample]:
        """Block until ``n`` fresh samples are held, then draw them (TimeoutError otherwise)."""
        timeout = self.cfg.wait_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                if self._closed:
                    raise BufferClosed(self._closed)
                batch = self.try_sample(n, learner_version)
                if batch is not None:
                    return batch
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"replay buffer held {len(self._items)} fresh samples, "
                                       f"needed {n}, for {timeout:.0f} s")
                self._cond.wait(remaining)

    def cursor(self) -> int:
        """Sequence number of the last draw (store it in a checkpoint)."""
        with self._cond:
            return self._seq

    def rewind(self, cursor: int) -> int:
        """Undo draws after ``cursor`` (a learner resumed from an older checkpoint); returns how
        many samples were put back."""
        with self._cond:
            if cursor > self._seq:
                raise ValueError(f"cannot rewind the replay buffer to {cursor}: its cursor is {self._seq}")
            if cursor == self._seq:
                return 0
            if self.log_path is None:
                raise ValueError("rewinding needs the replay log (replay.log_dir)")
            before = len(self._items)
            self._log({"op": "rewind", "to": cursor})
            self._recover()
            self._cond.notify_all()
            return len(self._items) - before

    def close(self, reason: str = "replay buffer closed") -> None:
        """Wake every waiter; later draws raise :class:`BufferClosed`."""
        with self._cond:
            self._closed = reason
            self._cond.notify_all()

    def snapshot(self) -> dict[str, Any]:
        """Counters for ``train/replay_*`` metrics."""
        with self._cond:
            self.stats.size = len(self._items)
            return {**asdict(self.stats), "cursor": self._seq, "learner_version": self.learner_version}

    def __len__(self) -> int:
        return len(self._items)


def _rebuilds(traj: Trajectory, sample: Sample, origin: Origin) -> bool:
    """Does ``traj`` give ``sample`` as ``origin`` says: its tokens the trajectory's first ones, its
    logprobs the trajectory's, those under its loss mask, or zero?  One comparison of each list
    (length and last token first), no search."""
    n = len(sample.token_ids)
    ids = traj.token_ids
    if n > len(ids) or (n and ids[n - 1] != sample.token_ids[-1]) or ids[:n] != sample.token_ids:
        return False
    if origin.logprobs == "trajectory":
        return traj.logprobs[:n] == sample.logprobs
    if origin.logprobs == "masked":
        return [lp if m else 0.0 for lp, m in zip(traj.logprobs[:n], sample.loss_mask)] == sample.logprobs
    return not any(sample.logprobs)


class _TrajectoryLines:
    """The trajectory file's lines by byte offset, each read and parsed once per recovery (one
    trajectory is the source of several samples)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._parsed: dict[int, Trajectory] = {}

    def at(self, offset: int) -> Trajectory:
        if offset not in self._parsed:
            assert self.path is not None
            with self.path.open("rb") as f:
                f.seek(offset)
                self._parsed[offset] = Trajectory.from_json(json.loads(f.readline()))
        return self._parsed[offset]
