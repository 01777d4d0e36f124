"""Build the verifier a rollout worker consults (``critic.*`` config)."""

from __future__ import annotations

from typing import Any

from cast_rl.config.schema import CastConfig


def build_verifier(cfg: CastConfig) -> Any:
    """None when the critic is off (budget 0); else the configured backend's verifier.

    ``backend=rule`` checks in-process unless ``critic.service`` asks for the critic-service
    actors; ``backend=model`` always goes through them (a :class:`CriticServiceClient` with
    retries, fail-over and a per-request timeout).
    """
    if cfg.critic.verification_budget == 0:
        return None
    if cfg.critic.backend == "rule" and not cfg.critic.service:
        from cast_rl.critique.verifier import RuleVerifier

        return RuleVerifier()
    from cast_rl.critique.service import CriticServiceClient

    return CriticServiceClient.from_config(cfg)
