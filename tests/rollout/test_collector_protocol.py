"""Every collector speaks the one protocol (:class:`cast_rl.rollout.collector.Collector`).

Signatures only (no engine, no Ray cluster): the parameters of ``collect`` and
``update_weights`` are the protocol's, by name, kind and default, in order; an implementation may
add options only as keyword-only parameters with defaults, and never ``*args`` or ``**kwargs``.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from cast_rl.learner.loop import Collector as LoopCollector
from cast_rl.learner.supervisor import MonotoneCollector
from cast_rl.learner.toy import HFCollector
from cast_rl.pipeline.context import StageGroup
from cast_rl.rollout.collector import Collector
from cast_rl.rollout.worker import RolloutWorker

METHODS = ("collect", "update_weights")


def implementations() -> dict[str, type]:
    from actors.rollout_group import RolloutGroup
    from actors.rollout_worker import RolloutWorkerActor
    from launchers.stages import _VersionedCollector
    from launchers.train import HFCollectorClient

    return {
        "RolloutWorker": RolloutWorker,
        "RolloutWorkerActor": RolloutWorkerActor.__ray_actor_class__,  # the class behind @ray.remote
        "RolloutGroup": RolloutGroup,
        "HFCollector": HFCollector,
        "MonotoneCollector": MonotoneCollector,
        "HFCollectorClient": HFCollectorClient,
        "_VersionedCollector": _VersionedCollector,
        "StageGroup": StageGroup,
    }


def _params(fn: Any) -> list[inspect.Parameter]:
    # Ray's actor decorator adds a keyword-only tracing context to every method
    return [p for name, p in inspect.signature(fn).parameters.items() if name not in ("self", "_ray_trace_ctx")]


def test_the_loop_and_the_pipeline_name_the_one_protocol() -> None:
    assert LoopCollector is Collector
    assert Collector in StageGroup.__mro__


@pytest.mark.parametrize("method", METHODS)
def test_every_collector_has_the_protocols_signature(method: str) -> None:
    expected = [(p.name, p.kind, p.default) for p in _params(getattr(Collector, method))]
    assert [name for name, _, _ in expected] == (["units", "tree"] if method == "collect"
                                                 else ["version", "weights", "checksum"])
    for name, cls in implementations().items():
        params = _params(getattr(cls, method))
        head = [(p.name, p.kind, p.default) for p in params[: len(expected)]]
        assert head == expected, f"{name}.{method}{inspect.signature(getattr(cls, method))}"
        extra = params[len(expected):]
        assert all(p.kind is inspect.Parameter.KEYWORD_ONLY and p.default is not inspect.Parameter.empty
                   for p in extra), f"{name}.{method}: extra options must be keyword-only with defaults: {extra}"
