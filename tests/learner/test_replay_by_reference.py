"""A rollout group's collection reaches the replay-buffer actor by reference (the workers' chunk
results), not re-sent by the driver, and the buffer logs exactly what it logs given the values."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ray
from test_learner_critique_samples import ROUND, _traj

from cast_rl.config import load_config
from cast_rl.config.schema import ReplayBufferConfig
from cast_rl.learner.critique_samples import build_samples


class _Recorder:
    """An actor handle that records the ``remote`` calls made through it."""

    def __init__(self, handle: Any) -> None:
        self.handle, self.calls = handle, []

    def __getattr__(self, name: str) -> Any:
        method, calls = getattr(self.handle, name), self.calls

        class Method:
            def remote(self, *args: Any) -> Any:
                calls.append((name, args))
                return method.remote(*args)

        return Method()


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_collection_by_reference_logs_as_one_by_value(ray_local, tmp_path: Path) -> None:  # noqa: ANN001
    from actors.replay_buffer import ReplayBufferClient
    from actors.rollout_group import Collected

    cfg = load_config(None, ["algorithm.samples=[outcome_groups,revision,supervised]"])
    trajs = [_traj(0, t, float(t % 2), [ROUND]) for t in range(4)] + [_traj(1, t, float(t < 2)) for t in range(4)]
    samples = build_samples(trajs, cfg, "r0")
    collected = Collected(trajs)  # as RolloutGroup.collect returns it: chunk results in order
    collected.chunk_refs = [ray.put(trajs[:3]), ray.put(trajs[3:5]), ray.put(trajs[5:])]

    by_value = ReplayBufferClient(ReplayBufferConfig(capacity=1000), tmp_path / "value" / "log.jsonl", 4)
    by_ref = ReplayBufferClient(ReplayBufferConfig(capacity=1000), tmp_path / "ref" / "log.jsonl", 4)
    by_ref.handle = _Recorder(by_ref.handle)
    assert by_ref.add(samples, collected) == by_value.add(samples, list(trajs))
    (name, args), = by_ref.handle.calls
    assert name == "add_chunks" and len(args) == 4  # the samples, then three references: no values
    assert all(isinstance(r, ray.ObjectRef) for r in args[1:])
    assert by_ref.add(samples, collected).duplicates == len(samples)  # a retried add
    by_value.add(samples, list(trajs))
    assert _files(tmp_path / "ref") == _files(tmp_path / "value") != {}
    # without references (a plain list, an empty collection), the values go as before
    empty = Collected()
    empty.chunk_refs = []
    assert by_ref.add([], empty).accepted == 0
