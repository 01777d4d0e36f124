"""A rollout group's collection reaches the replay-buffer actor by reference (the workers' chunk
results), never through the driver; the actor builds the samples and logs exactly what it logs
given the values."""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path
from typing import Any

import ray
from test_learner_critique_samples import ROUND, _traj

from cast_rl.config import load_config
from cast_rl.config.schema import ReplayBufferConfig
from cast_rl.samples.builders import build_samples


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


def test_a_collection_by_reference_is_built_in_the_actor_and_logs_as_one_by_value(ray_local, tmp_path: Path) -> None:  # noqa: ANN001
    """The loop hands the buffer's actor the workers' chunk references and the sample recipe: the
    actor builds the samples (verl's advantages in a Ray task), logs exactly what the loop's own
    build and a by-value add log, and still holds no torch and nothing of the learner."""
    from actors.replay_buffer import ReplayBufferClient

    cfg = load_config(None, ["algorithm.samples=[outcome_groups,revision,supervised]"])
    trajs = [_traj(0, t, float(t % 2), [ROUND]) for t in range(4)] + [_traj(1, t, float(t < 2)) for t in range(4)]
    samples = build_samples(trajs, cfg, "r0")
    assert {s.source for s in samples} == {"outcome_groups", "revision", "supervised"}
    refs = [ray.put(trajs[:3]), ray.put(trajs[3:5]), ray.put(trajs[5:])]  # as RolloutGroup.collect_refs gives them
    recipe = partial(build_samples, cfg=cfg, round_id="r0")

    by_value = ReplayBufferClient(ReplayBufferConfig(capacity=1000), tmp_path / "value" / "log.jsonl", 4)
    by_ref = ReplayBufferClient(ReplayBufferConfig(capacity=1000), tmp_path / "ref" / "log.jsonl", 4)
    actor = by_ref.handle
    by_ref.handle = _Recorder(actor)
    assert by_ref.add_collection(refs, recipe) == by_value.add(samples, list(trajs))
    (name, args), = by_ref.handle.calls
    assert name == "add_collection" and len(args) == 4  # the recipe, then three references: no values
    assert all(isinstance(r, ray.ObjectRef) for r in args[1:])
    assert by_ref.add_collection(refs, recipe).duplicates == len(samples)  # a retried add
    by_value.add(samples, list(trajs))
    assert _files(tmp_path / "ref") == _files(tmp_path / "value") != {}
    # the samples the actor built are the loop's, advantages included (drawn back in log order)
    drawn = by_ref.sample(len(samples), 0)
    assert sorted((s.key, s.advantage) for s in drawn) == sorted((s.key, s.advantage) for s in samples)
    # what the actor process imported by now (a lambda travels by value, importing nothing)
    heavy = lambda _actor: sorted(m for m in sys.modules if m == "torch" or m.startswith(("cast_rl.learner", "cast_rl.rollout")))  # noqa: E731
    assert ray.get(actor.__ray_call__.remote(heavy)) == []
    assert by_ref.add_collection([], recipe).accepted == 0  # an empty collection
