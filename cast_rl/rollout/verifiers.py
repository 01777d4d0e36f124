"""Build the verifier a rollout worker consults (``critic.*`` config)."""

from __future__ import annotations

from collections.abc import Callable

from cast_rl.config.schema import CastConfig
from cast_rl.critique.service import build_verifier as build_backend
from cast_rl.critique.verifier import Verifier
from cast_rl.envs.core import DomainData

ConnectCritic = Callable[[CastConfig], Verifier]
"""Reaches the run's critic-service actors (``actors.critic_service.critic_client``)."""


def build_verifier(cfg: CastConfig, data: DomainData, connect: ConnectCritic | None = None) -> Verifier | None:
    """None when the critic is off (budget 0); else the configured backend's verifier.

    ``backend=rule`` checks in-process unless ``critic.service`` asks for the critic-service
    actors; either way it checks tool arguments against the tools of ``data``'s domain.
    ``backend=model`` always goes through the actors: ``connect(cfg)`` (the Ray shell passes
    :func:`actors.critic_service.critic_client`: retries, fail-over and a per-request timeout).
    """
    if cfg.critic.verification_budget == 0:
        return None
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
