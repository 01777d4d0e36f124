"""One engine, several domains: ``RolloutWorker.set_domain`` and the group re-applying it.

An evaluation of ``eval.domains`` switches its rollout workers from domain to domain instead of
starting a vLLM engine per domain.  Here a scripted engine (the tiny policy's tokenizer) plays
generated retail, then airline (``../shared/benchmarks``; skipped without it); the group's part
runs on stand-in actors (no Ray).

    .venv/bin/python -m pytest tests/rollout/test_worker_domain.py -q
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from cast_rl.config import load_config
from cast_rl.critique.records import VerifyRequest
from cast_rl.envs.core import load_domain_data
from cast_rl.rollout.expert import ScriptPolicy, tool_call_text
from cast_rl.rollout.worker import RolloutWorker

SMALL = ["env.split=test", "env.max_steps=2", "inference.max_model_len=65536"]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def _airline_cfg(benchmarks_dir: Path) -> Any:
    return load_config(None, ["env.domain=airline", f"env.data_dir={benchmarks_dir / 'airline'}", *SMALL])


def test_later_episodes_run_in_the_new_domain_with_the_same_engine_critic_and_counters(
    tokenizer: Any, retail_data_dir: Path, benchmarks_dir: Path
) -> None:
    cfg = load_config(None, [f"env.data_dir={retail_data_dir}", "critic.backend=rule", "critic.service=false", *SMALL])
    retail, airline = load_domain_data("retail", retail_data_dir), load_domain_data("airline", benchmarks_dir / "airline")
    # an airline tool: unknown in retail, a valid first step in airline
    engine = ScriptPolicy(tokenizer, [tool_call_text("list_all_airports", {}), "Goodbye."])
    worker = RolloutWorker(cfg, retail, engine)
    worker.set_verification_budget(1)
    worker.version, worker.checksum = 3, "abc"
    user = worker.runner.user_complete = object()  # what the actor sets (an LLM user's engine)

    async def run() -> tuple[list[Any], list[Any], Any, Any]:
        before = await worker.collect([("test", 0, 0)])
        old = worker.runner.verifier
        closed: list[bool] = []
        old_close = old.close

        async def close() -> None:
            closed.append(True)
            await old_close()

        old.close = close
        assert await worker.set_domain(_airline_cfg(benchmarks_dir), airline) == "airline"
        assert closed == [True] and worker.runner.verifier is not old
        after = await worker.collect([("test", 0, 0), ("test", 1, 0)])
        wrong_args = VerifyRequest("airline", airline.policy, [], {"name": "list_all_airports", "kwargs": {"city": "SEA"}})
        (critique,) = await worker.runner.verifier.verify([wrong_args])
        return before, after, critique, old

    before, after, critique, old = asyncio.run(run())
    assert [t.domain for t in before] == ["retail"]
    assert before[0].verification_rounds  # the retail critic flagged the airline tool
    assert [t.domain for t in after] == ["airline", "airline"]
    assert [t.task_index for t in after] == [0, 1]
    assert airline.policy in after[0].messages[0]["content"]
    assert not any(t.verification_rounds for t in after)  # the airline critic knows the tool
    assert all(t.policy_version == 3 for t in before + after)
    # the rule critic checks arguments against the airline tools (a stale retail one knows none)
    assert worker.runner.verifier.inner.tools == {"airline": airline.tools}
    assert critique.verdict == "invalid" and critique.error_type == "wrong_tool_usage"
    # budget, critic, weights and counters are the worker's still
    assert worker.runner.budget == 1 and worker.cfg.critic.verification_budget == 1
    assert worker.cfg.critic == replace(cfg.critic, verification_budget=1)
    assert worker.cfg.env == _airline_cfg(benchmarks_dir).env
    assert (worker.version, worker.checksum) == (3, "abc")
    assert worker.runner.user_complete is user and worker.runner.data is airline
    metrics = worker.metrics()
    assert metrics["rollout/episodes"] == 3 and metrics["rollout/critiques"] > 0


def test_a_model_critic_is_kept_and_budget_0_builds_no_verifier(
    tokenizer: Any, retail_data_dir: Path, benchmarks_dir: Path
) -> None:
    """A model critic reads no domain data: switching domain keeps it (its actors and engine);
    with budget 0 the rule critic is not built for the new domain."""
    cfg = load_config(None, [f"env.data_dir={retail_data_dir}", "critic.backend=model", "critic.verification_budget=1",
                             *SMALL])
    retail, airline = load_domain_data("retail", retail_data_dir), load_domain_data("airline", benchmarks_dir / "airline")
    closed: list[bool] = []

    async def close() -> None:
        closed.append(True)

    model_critic = SimpleNamespace(verify=None, close=close)
    worker = RolloutWorker(cfg, retail, ScriptPolicy(tokenizer, ["Goodbye."]), verifier=model_critic)
    guarded = worker.runner.verifier
    asyncio.run(worker.set_domain(_airline_cfg(benchmarks_dir), airline))
    assert worker.runner.verifier is guarded and not closed and worker.runner.budget == 1

    rule = load_config(None, [f"env.data_dir={retail_data_dir}", "critic.backend=rule", "critic.service=false", *SMALL])
    worker = RolloutWorker(rule, retail, ScriptPolicy(tokenizer, ["Goodbye."]))
    asyncio.run(worker.set_domain(_airline_cfg(benchmarks_dir), airline))
    assert worker.runner.verifier is None and worker.runner.budget == 0
    worker.set_verification_budget(1)  # built for the domain the worker serves now
    assert worker.runner.verifier.inner.tools == {"airline": airline.tools}


# -- the group: a restarted worker gets its domain again ------------------------------------------


class _Ref:
    def __init__(self, call: Any) -> None:
        try:
            self.value, self.error = call(), None
        except Exception as exc:  # noqa: BLE001 (handed back by ray.get, as Ray does)
            self.value, self.error = None, exc


class _FakeRay:
    """``ray.get``/``ray.wait`` over :class:`_Ref` (calls run when submitted)."""

    @staticmethod
    def get(refs: Any, timeout: float | None = None) -> Any:
        if isinstance(refs, list):
            return [_FakeRay.get(r) for r in refs]
        if refs.error is not None:
            raise refs.error
        return refs.value

    @staticmethod
    def wait(refs: list[Any], num_returns: int = 1) -> tuple[list[Any], list[Any]]:
        return refs[:num_returns], refs[num_returns:]


class _Method:
    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def remote(self, *args: Any) -> _Ref:
        return _Ref(lambda: self.fn(*args))


class _Actor:
    """A rollout-worker actor that records its domain; ``die()`` makes its next collect fail and
    rebuilds it from the construction config, as Ray's restart does."""

    def __init__(self, cfg: Any, index: int, kind: str) -> None:
        self.cfg, self.calls, self.dying = cfg, [], False
        self.domain = cfg.env.domain
        for name in ("ready", "collect", "set_domain", "set_critic", "set_verification_budget"):
            setattr(self, name, _Method(getattr(self, f"_{name}")))

    def _ready(self) -> bool:
        return True

    def _collect(self, units: list[tuple[str, int, int]], tree: Any = None) -> list[Any]:
        if self.dying:
            from ray.exceptions import RayActorError

            self.dying, self.domain = False, self.cfg.env.domain  # restarted from the construction config
            raise RayActorError()
        return [SimpleNamespace(split=s, task_index=i, trial=t, domain=self.domain, info={}, continuation=False) for s, i, t in units]

    def _set_domain(self, cfg: Any) -> str:
        self.calls.append(("set_domain", cfg.env.domain))
        self.domain = cfg.env.domain
        return self.domain

    def _set_critic(self, critic: Any) -> str:
        self.calls.append(("set_critic", critic.backend))
        return critic.backend

    def _set_verification_budget(self, budget: int) -> int:
        self.calls.append(("set_verification_budget", budget))
        return budget


def test_a_restarted_worker_gets_the_domain_again(monkeypatch: pytest.MonkeyPatch, retail_data_dir: Path) -> None:
    from actors import rollout_group

    monkeypatch.setattr(rollout_group, "ray", _FakeRay)
    monkeypatch.setattr(rollout_group.rollout_worker, "RolloutWorkerActor",
                        SimpleNamespace(options=lambda **_: SimpleNamespace(remote=_Actor)))
    cfg = load_config(None, [f"env.data_dir={retail_data_dir}", "rollout.num_workers=1", "rollout.num_cpus_per_worker=1",
                             *SMALL])
    group = rollout_group.RolloutGroup(cfg)
    (actor,) = group.workers
    airline = load_config(None, ["env.domain=airline", "env.data_dir=/data/airline", *SMALL])
    group.set_domain(airline)
    assert group.cfg.env == airline.env and group.built_cfg is cfg and group.cfg.rollout == cfg.rollout
    assert actor.calls == [("set_domain", "airline")]

    actor.dying = True  # the first chunk kills it; Ray rebuilds it on retail
    got = group.collect([("test", 0, 0), ("test", 1, 0)], chunk_size=2)
    assert group.resubmitted_chunks == 1
    assert [t.domain for t in got] == ["airline", "airline"]  # re-applied before the chunk ran again
    # only what differs from the construction config is re-applied (here the domain alone)
    assert actor.calls == [("set_domain", "airline")] * 2

    group.set_domain(cfg)  # back to the construction domain
    assert actor.calls[-1] == ("set_domain", "retail")
    actor.calls.clear()
    actor.dying = True
    assert [t.domain for t in group.collect([("test", 0, 1)])] == ["retail"]
    assert actor.calls == []  # rebuilt on the domain the group serves: nothing to re-apply


def test_a_teacher_worker_refuses_to_switch_domain() -> None:
    """The teacher's workers (``kind="teacher"``) play the training domain only."""
    from actors.rollout_worker import RolloutWorkerActor

    actor = object.__new__(RolloutWorkerActor.__ray_metadata__.modified_class)  # the class Ray wraps, unstarted
    actor.kind = "teacher"
    with pytest.raises(ValueError, match="'teacher' worker"):
        asyncio.run(actor.set_domain(load_config(None)))
