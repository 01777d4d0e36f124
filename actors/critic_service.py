"""Ray actor shell of :class:`cast_rl.critique.service.CriticService` (batched critiques).

Actors are named ``cast-critic-<critic>-<i>`` (``<critic>``: a digest of the backend and model,
so a run that switches critic never joins the old one's actors): the first rollout worker (or
the driver) that asks for slot ``i`` starts it and everyone else joins it.  A model critic's actor
asks Ray for one CPU and ``critic.num_gpus_per_replica`` GPUs.  A dead actor is restarted by Ray up to
``critic.max_retries`` times; :class:`~cast_rl.critique.service.CriticServiceClient` retries
requests across actors meanwhile.
"""

from __future__ import annotations

import hashlib
from typing import Any

import ray

from cast_rl.config.schema import CriticConfig
from cast_rl.critique.service import ACTOR_PREFIX
from cast_rl.critique.verifier import Critique, VerifyRequest


@ray.remote
class CriticServiceActor:
    def __init__(self, cfg: CriticConfig, tools: dict[str, list[dict[str, Any]]] | None = None) -> None:
        from cast_rl.critique.service import CriticService, build_verifier

        self.service = CriticService(build_verifier(cfg, tools), cfg)

    def ready(self) -> bool:
        return True

    def describe(self) -> dict[str, str]:
        return self.service.describe()

    async def close(self) -> None:
        await self.service.close()

    async def critique(self, requests: list[VerifyRequest]) -> list[Critique]:
        return await self.service.critique(requests)

    def stats(self) -> dict[str, float]:
        return self.service.stats()


def actor_name(critic: CriticConfig, index: int) -> str:
    """``cast-critic-<digest of backend and model>-<index>``."""
    key = critic.backend if critic.backend == "rule" else f"{critic.backend}:{critic.model.path}"
    return f"{ACTOR_PREFIX}-{hashlib.sha256(key.encode()).hexdigest()[:10]}-{index}"


def critic_actor(cfg: Any, index: int) -> Any:
    """The named critic actor of slot ``index`` of a run (``cfg`` is a CastConfig), started if absent."""
    tools = None
    if cfg.critic.backend == "rule":
        from cast_rl.envs.setup import load_env_data

        data = load_env_data(cfg)
        tools = {data.domain: data.tools}
    return CriticServiceActor.options(
        name=actor_name(cfg.critic, index), get_if_exists=True, **_resources(cfg.critic),
    ).remote(cfg.critic, tools)


def private_critic_actor(critic: CriticConfig, tools: dict[str, list[dict[str, Any]]] | None = None) -> Any:
    """An unnamed critic actor only its caller uses (the held-out evaluation); end it with
    ``close`` and ``ray.kill``."""
    return CriticServiceActor.options(**_resources(critic)).remote(critic, tools)


def _resources(critic: CriticConfig) -> dict[str, Any]:
    """Ray options: what :func:`cast_rl.config.resources.critic_request` says (the resource check
    counts the same)."""
    from cast_rl.config.resources import critic_request

    return {"max_restarts": critic.max_retries, "max_concurrency": 64, **critic_request(critic).ray_options()}
