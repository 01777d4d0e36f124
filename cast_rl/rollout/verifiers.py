"""Build the verifier a rollout worker consults (``critic.*`` config)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cast_rl.config.schema import CastConfig, CriticConfig
from cast_rl.critique.service import build_verifier as build_backend
from cast_rl.critique.service import model_verifier
from cast_rl.critique.verifier import Critique, Verifier, VerifyRequest
from cast_rl.envs.core import DomainData
from cast_rl.inference.adapters import ADAPTER_CONFIG, read_adapter

ConnectCritic = Callable[[CastConfig], Verifier]
"""Reaches the run's critic-service actors (``actors.critic_service.critic_client``)."""


CRITIC_ADAPTER = "critic"
"""The critic's adapter name in a policy engine (``critic.engine=shared_with_policy``)."""


def critic_adapter_dir(critic: CriticConfig) -> Path:
    """The peft adapter the shared engine serves as the critic: ``critic.model.path`` itself, or
    its ``adapter/`` (what a learner with ``learner.lora`` saves beside the merged model)."""
    path = Path(critic.model.path)
    for candidate in (path, path / "adapter"):
        if (candidate / ADAPTER_CONFIG).exists():
            return candidate
    raise FileNotFoundError(
        f"critic.engine=shared_with_policy serves the critic as a LoRA adapter of the policy's model, and "
        f"critic.model.path={critic.model.path!r} holds none ({ADAPTER_CONFIG} in it or in its adapter/); "
        "train the critic with learner.lora (stage train_critic saves <model>/adapter), or use critic.engine=own"
    )


class SharedEngineCritic:
    """A model critic served as the ``critic`` adapter of the rollout worker's own policy engine.

    The adapter is loaded on the first critique (a newer version each time a critic is switched
    in); critiques then batch in the same engine as the policy's turns.  Closing it leaves the
    engine running: it is the worker's.
    """

    def __init__(self, engine: Any, critic: CriticConfig) -> None:
        self.engine = engine
        self.adapter_dir = critic_adapter_dir(critic)
        self.inner = model_verifier(critic, engine, adapter=CRITIC_ADAPTER, owns_engine=False)
        self._loaded = False
        self._lock = asyncio.Lock()

    async def verify(self, requests: list[VerifyRequest]) -> list[Critique]:
        async with self._lock:
            if not self._loaded:
                version = self.engine.adapter_versions.get(CRITIC_ADAPTER, 0) + 1
                await self.engine.load_adapter(read_adapter(self.adapter_dir, CRITIC_ADAPTER, version))
                self._loaded = True
        return await self.inner.verify(requests)

    async def close(self) -> None:
        """Nothing to shut down: the engine is the rollout worker's."""


def build_verifier(cfg: CastConfig, data: DomainData, connect: ConnectCritic | None = None,
                   policy_engine: Any = None) -> Verifier | None:
    """None when the critic is off (budget 0); else the configured backend's verifier.

    ``backend=rule`` checks in-process unless ``critic.service`` asks for the critic-service
    actors; either way it checks tool arguments against the tools of ``data``'s domain.
    ``backend=model`` always goes through the actors: ``connect(cfg)`` (the Ray shell passes
    :func:`actors.critic_service.critic_client`: retries, fail-over and a per-request timeout).
    """
    if cfg.critic.verification_budget == 0:
        return None
    if cfg.critic.backend != "rule" and cfg.critic.engine == "shared_with_policy":
        if policy_engine is None:
            raise ValueError("critic.engine=shared_with_policy: the critic is served by the rollout worker's "
                             "policy engine, and none was given (build it with policy_engine=)")
        return SharedEngineCritic(policy_engine, cfg.critic)
    if cfg.critic.backend == "rule" and not cfg.critic.service:
        return build_backend(cfg.critic, {data.domain: data.tools})
    if connect is None:
        raise ValueError(
            f"critic.backend={cfg.critic.backend!r} (critic.service={cfg.critic.service}) is served by "
            "the critic-service actors, and this worker was given no way to reach them; build it "
            "with connect=actors.critic_service.critic_client, or use critic.backend=rule with "
            "critic.service=false for an in-process critic"
        )
    return connect(cfg)
