"""Build the verifier a rollout worker consults (``critic.*`` config)."""

from __future__ import annotations

from typing import Any

from cast_rl.config.schema import CastConfig
from cast_rl.envs.core import DomainData


def build_verifier(cfg: CastConfig, data: DomainData) -> Any:
    """None when the critic is off (budget 0); else the configured backend's verifier.

    ``backend=rule`` checks in-process unless ``critic.service`` asks for the critic-service
    actors; either way it checks tool arguments against the tools of ``data``'s domain.
    ``backend=model`` always goes through the actors (a :class:`CriticServiceClient` with
    retries, fail-over and a per-request timeout).
    """
    if cfg.critic.verification_budget == 0:
        return None
    if cfg.critic.backend == "rule" and not cfg.critic.service:
        from cast_rl.critique.service import build_verifier as build_backend

        return build_backend(cfg.critic, {data.domain: data.tools})
    from cast_rl.critique.service import CriticServiceClient

    return CriticServiceClient.from_config(cfg)
