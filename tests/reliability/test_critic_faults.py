"""Kill critic-service actors during verification rounds of a rollout; and the critic timeout.

Real parts: a local Ray, the named critic-service actors (rule backend served by the actors,
``critic.service=true``), the retail environment, the scripted user and the episode runner with
``critic.verification_budget=1``.  The policy is scripted (the fault under test is the critic's).
Kills are triggered from inside the verification round: the request is submitted to the actor and
the actor is killed at once, so the request is in flight when it dies.

    .venv/bin/python -m pytest tests/reliability/test_critic_faults.py -q
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from reliability_helpers import ScriptedPolicy, lost_and_duplicated, num_restarts, tool_call

from actors.critic_service import CriticServiceClient, critic_client
from cast_rl.config import load_config
from cast_rl.critique.service import CriticUnavailable
from cast_rl.critique.verifier import Critique
from cast_rl.envs.core import load_domain_data
from cast_rl.rollout.runner import EpisodeRunner, EpisodeSpec
from cast_rl.rollout.verifiers import build_verifier


class KillOnSubmit:
    """Stands in for an actor handle for one call: submits it, then kills the actor under it."""

    def __init__(self, handle: Any, no_restart: bool) -> None:
        self.handle, self.no_restart, self.fired = handle, no_restart, False
        self.critique = self

    def remote(self, requests: Any) -> Any:
        import ray

        ref = self.handle.critique.remote(requests)
        if not self.fired:
            self.fired = True
            ray.kill(self.handle, no_restart=self.no_restart)
        return ref


class FaultPlan:
    """A verifier around the client that arms a kill on the n-th verification call."""

    def __init__(self, client: CriticServiceClient, kills: dict[int, bool]) -> None:
        self.client, self.kills, self.calls = client, kills, 0
        self.armed: list[KillOnSubmit] = []

    async def verify(self, requests: list[Any]) -> list[Critique]:
        self.calls += 1
        if self.calls in self.kills:
            slot = self.client._next % len(self.client.handles)  # the slot this call will use
            # the handle under any earlier (spent) wrapper: a call that beat its kill keeps it
            fault = KillOnSubmit(_unwrap(self.client.handles[slot]), no_restart=self.kills[self.calls])
            self.client.handles[slot] = fault
            self.armed.append(fault)
        return await self.client.verify(requests)


def test_critic_actors_killed_mid_verification_lose_no_episode(
    ray_local, tiny_model_dir: Path, retail_data_dir: Path, tmp_path: Path  # noqa: ANN001
) -> None:
    from transformers import AutoTokenizer

    cfg = load_config(None, [
        f"env.data_dir={retail_data_dir}", "env.split=train", "env.max_steps=3",
        "critic.backend=rule", "critic.service=true", "critic.verification_budget=1",
        "critic.num_replicas=2", "critic.max_retries=3", "critic.timeout_s=60",
        f"run_dir={tmp_path / 'run'}",
    ])
    data = load_domain_data("retail", retail_data_dir)
    client = build_verifier(cfg, data, connect=critic_client)
    assert isinstance(client, CriticServiceClient)  # the rule critic goes through the actors
    originals = list(client.handles)
    # Call 3 kills slot A with the request in flight (Ray restarts it); call 7 kills slot B for
    # good (the client must fail over and start a replacement).
    plan = FaultPlan(client, kills={3: False, 7: True})
    policy = ScriptedPolicy(AutoTokenizer.from_pretrained(tiny_model_dir), [
        "Hello! How can I help you today?",
        tool_call("cancel_pending_order", order_id="#W0000000", reason="changed my mind"),
        tool_call("list_all_product_types"),
    ])
    runner = EpisodeRunner(cfg, data, policy, verifier=plan)
    specs = [EpisodeSpec("train", task, trial) for task in range(6) for trial in range(2)]
    try:
        trajectories = asyncio.run(runner.run_many(specs, concurrency=4))
        requested = [s.key for s in specs]
        delivered = [(t.split, t.task_index, t.trial) for t in trajectories]
        lost, duplicated = lost_and_duplicated(requested, delivered)
        assert (lost, duplicated) == (0, 0)
        assert delivered == requested
        assert not [t for t in trajectories if t.info["termination"] == "critic_unavailable"]
        # every verification call was answered, none was skipped
        assert runner.stats.critiques == plan.calls >= 8
        assert sum(len(t.verification_rounds) for t in trajectories) > 0  # critiques were shown
        restarted, removed = (fault.handle for fault in plan.armed)
        assert [f.fired for f in plan.armed] == [True, True]
        assert num_restarts(restarted) >= 1  # Ray restarted it
        assert client.failures >= 1  # at least the permanent kill was failed over
        live = [_unwrap(h) for h in client.handles]
        assert removed._actor_id not in {h._actor_id for h in live}  # a replacement took its slot
        assert all(s["critic/requests"] >= 1 for s in ray_local.get([h.stats.remote() for h in live]))
    finally:
        for handle in {_unwrap(h)._actor_id: _unwrap(h) for h in [*originals, *client.handles]}.values():
            ray_local.kill(handle, no_restart=True)


def _unwrap(handle: Any) -> Any:
    while isinstance(handle, KillOnSubmit):
        handle = handle.handle
    return handle


class _HungHandle:
    """An actor-handle stand-in whose calls never answer (a wedged critic actor)."""

    def __init__(self) -> None:
        self.calls = 0
        self.critique = self

    def remote(self, requests: Any) -> Any:
        self.calls += 1
        return asyncio.get_running_loop().create_future()  # never resolved


class _LiveHandle:
    def __init__(self) -> None:
        self.critique = self

    def remote(self, requests: Any) -> Any:
        async def answer() -> list[Critique]:
            return [Critique("valid", "none", {}, "ok") for _ in requests]

        return answer()


def test_critic_call_timeout_fails_over_then_becomes_a_recorded_failure(
    tiny_model_dir: Path, retail_data_dir: Path
) -> None:
    """A hung critic call times out (critic.timeout_s), is retried on the next actor, and when
    every actor hangs the episode ends as ``critic_unavailable`` instead of hanging the run."""
    hung = _HungHandle()
    client = CriticServiceClient([hung, _LiveHandle()], max_retries=2, retry_on=(), timeout_s=0.05)
    (critique,) = asyncio.run(client.verify([object()]))  # type: ignore[list-item]
    assert critique.verdict == "valid" and (client.timeouts, hung.calls) == (1, 1)

    all_hung = CriticServiceClient([_HungHandle(), _HungHandle()], max_retries=2, retry_on=(), timeout_s=0.05)
    with pytest.raises(CriticUnavailable, match=r"critic.timeout_s=0.05"):
        asyncio.run(all_hung.verify([object()]))  # type: ignore[list-item]
    assert all_hung.timeouts == 3

    from transformers import AutoTokenizer

    cfg = load_config(None, [f"env.data_dir={retail_data_dir}", "env.split=train", "env.max_steps=3",
                             "critic.verification_budget=1"])
    data = load_domain_data("retail", retail_data_dir)
    policy = ScriptedPolicy(AutoTokenizer.from_pretrained(tiny_model_dir), ["Hello! How can I help?"])
    stuck = CriticServiceClient([_HungHandle()], max_retries=1, retry_on=(), timeout_s=0.05)
    runner = EpisodeRunner(cfg, data, policy, verifier=stuck)
    (traj,) = asyncio.run(runner.run_many([EpisodeSpec("train", 0, 0)]))
    assert traj.info["termination"] == "critic_unavailable"
    assert traj.reward == 0.0 and stuck.timeouts == 2


class _DeadHandle:
    """An actor-handle stand-in whose calls fail once they are awaited (its actor died)."""

    def __init__(self) -> None:
        self.critique = self

    def remote(self, requests: Any) -> Any:
        async def fail() -> list[Critique]:
            await asyncio.sleep(0.01)
            raise ConnectionError("actor died")

        return fail()


def test_calls_failing_on_one_dead_actor_replace_it_once() -> None:
    """Several calls in flight on a dead actor each fail; only the first replaces the slot, so the
    replacement's handle (with Ray, its owner reference) is never overwritten by a second one."""
    spawned: list[_LiveHandle] = []

    def respawn(slot: int) -> _LiveHandle:
        spawned.append(_LiveHandle())
        return spawned[-1]

    client = CriticServiceClient([_DeadHandle()], max_retries=2, respawn=respawn, retry_on=(ConnectionError,))

    async def four() -> list[list[Critique]]:
        return await asyncio.gather(*(client.verify([object()]) for _ in range(4)))  # type: ignore[list-item]

    answers = asyncio.run(four())
    assert [c.verdict for (c,) in answers] == ["valid"] * 4
    assert len(spawned) == 1 and client.handles == spawned and client.failures == 4
