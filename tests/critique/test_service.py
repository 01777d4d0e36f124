"""The rule-based critic, the critic service, its retrying client (fakes and a real Ray)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from actors.critic_service import CriticServiceClient
from cast_rl.config.schema import CriticConfig
from cast_rl.critique.context import iter_actions
from cast_rl.critique.datasets import request_for
from cast_rl.critique.gold import gold_trajectory
from cast_rl.critique.inject import inject
from cast_rl.critique.service import CriticService, CriticUnavailable, build_verifier
from cast_rl.critique.verifier import (
    Critique,
    ModelVerifier,
    RuleVerifier,
    Verifier,
    VerifyRequest,
)
from cast_rl.envs.core import load_domain_data
from cast_rl.inference.base import Completion


@pytest.fixture(scope="module")
def data(retail_data_dir: Path):  # noqa: ANN201
    return load_domain_data("retail", retail_data_dir)


def _requests(trajectory) -> list[VerifyRequest]:  # noqa: ANN001
    return [request_for(trajectory, a.message_index, a.to_json()) for a in iter_actions(trajectory.messages)]


def test_rule_verifier_answers_a_batch_from_visible_information_only(data) -> None:  # noqa: ANN001
    verifier = RuleVerifier({"retail": data.tools})
    assert isinstance(verifier, Verifier)
    gold = _requests(gold_trajectory(data, "train", 2))
    critiques = asyncio.run(verifier.verify(gold))
    assert len(critiques) == len(gold) and all(c.verdict == "valid" for c in critiques)
    injected = inject("missing_confirmation", data, "train", 2)
    assert injected is not None
    (request,) = [r for r in _requests(injected.trajectory) if len(r.messages) == injected.message_index]
    (critique,) = asyncio.run(verifier.verify([request]))
    assert (critique.verdict, critique.error_type) == ("invalid", "policy_violation")
    assert critique.text.startswith("VERDICT: invalid\nERROR: policy_violation\n")
    assert critique.rationale["policy_clause"] in data.policy


def test_service_counts_and_the_model_backend_never_reads_garbage_as_valid() -> None:
    class Scripted:
        def __init__(self, answers: list) -> None:  # noqa: ANN001
            self.answers = answers

        async def chat(self, messages, sampling, tools=None):  # noqa: ANN001, ANN201
            answer = self.answers.pop(0)
            if isinstance(answer, Exception):
                raise answer
            return Completion(text=answer)

    engine = Scripted([
        "VERDICT: invalid\nERROR: hallucination\nEXPLANATION: made up.",
        "I think this is fine!",
        TimeoutError("slow"),
        "VERDICT: valid\nERROR: none\nEXPLANATION: ok",
    ])
    service = CriticService(build_verifier(CriticConfig(backend="model"), engine=engine))
    request = VerifyRequest("retail", "policy", [{"role": "user", "content": "hi"}],
                            {"name": "respond", "kwargs": {"content": "hello"}})
    critiques = asyncio.run(service.critique([request] * 4))
    assert [c.verdict for c in critiques] == ["invalid", "unparsable", "unparsable", "valid"]
    assert critiques[1].rationale["raw"] == "I think this is fine!"
    stats = service.stats()
    assert stats["critic/requests"] == 4 and stats["critic/unparsable"] == 2
    assert stats["critic/unparsable_rate"] == 0.5
    assert isinstance(build_verifier(CriticConfig()), RuleVerifier)
    assert isinstance(ModelVerifier(engine), Verifier)


class _Boom(Exception):
    pass


class _Handle:
    """An actor-handle stand-in: ``handle.critique.remote(batch)`` is awaitable."""

    def __init__(self, fail: bool) -> None:
        self.fail, self.calls = fail, 0
        self.critique = self

    def remote(self, requests):  # noqa: ANN001, ANN201
        self.calls += 1

        async def run() -> list[Critique]:
            if self.fail:
                raise _Boom("actor died")
            return [Critique("valid", "none", {}, "") for _ in requests]

        return run()


def test_client_fails_over_restarts_and_gives_up_after_max_retries() -> None:
    dead, alive = _Handle(True), _Handle(False)
    respawned = []
    client = CriticServiceClient([dead, alive], max_retries=2, retry_on=(_Boom,),
                                 respawn=lambda i: respawned.append(i) or _Handle(False))
    out = asyncio.run(client.verify([object()] * 3))  # type: ignore[list-item]
    assert len(out) == 3 and dead.calls == 1 and respawned == [0]
    assert client.failures == 1
    always_dead = CriticServiceClient([_Handle(True), _Handle(True)], max_retries=2, retry_on=(_Boom,))
    with pytest.raises(CriticUnavailable, match="max_retries=2"):
        asyncio.run(always_dead.verify([]))
    assert always_dead.failures == 3


def test_critic_actors_on_ray_survive_an_actor_death(ray_local, retail_data_dir: Path, data) -> None:  # noqa: ANN001
    from cast_rl.config import load_config

    cfg = load_config(None, [f"env.data_dir={retail_data_dir}", "critic.backend=rule",
                             "critic.num_replicas=2", "critic.max_retries=2",
                             f"run_dir={retail_data_dir.parent / 'run'}"])
    client = CriticServiceClient.from_config(cfg)
    requests = _requests(gold_trajectory(data, "train", 3))
    first = asyncio.run(client.verify(requests))
    assert [c.verdict for c in first] == ["valid"] * len(requests)
    ray_local.kill(client.handles[1], no_restart=True)
    again = [asyncio.run(client.verify(requests[:2])) for _ in range(3)]  # round robin hits slot 1
    assert all(len(batch) == 2 for batch in again)
    assert client.failures >= 1
    stats = ray_local.get(client.handles[0].stats.remote())
    assert stats["critic/requests"] >= len(requests)
    for handle in client.handles:
        ray_local.kill(handle, no_restart=True)
