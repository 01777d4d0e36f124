"""Ray actor shell of :class:`cast_rl.critique.service.CriticService` (batched critiques).

Actors are named ``cast-critic-<i>``: the first rollout worker (or the driver) that asks for slot
``i`` starts it and everyone else joins it.  A dead actor is restarted by Ray up to
``critic.max_retries`` times; :class:`~cast_rl.critique.service.CriticServiceClient` retries
requests across actors meanwhile.
"""

from __future__ import annotations

from typing import Any

import ray

from cast_rl.config.schema import CriticConfig
from cast_rl.critique.service import ACTOR_PREFIX
from cast_rl.critique.verifier import Critique, VerifyRequest


@ray.remote
class CriticServiceActor:
    def __init__(self, cfg: CriticConfig, tools: dict[str, list[dict[str, Any]]] | None = None) -> None:
        from cast_rl.critique.service import CriticService, build_verifier

        self.service = CriticService(build_verifier(cfg, tools))

    def ready(self) -> bool:
        return True

    async def critique(self, requests: list[VerifyRequest]) -> list[Critique]:
        return await self.service.critique(requests)

    def stats(self) -> dict[str, float]:
        return self.service.stats()


def critic_actor(cfg: Any, index: int, num_gpus: float = 0.0) -> Any:
    """The named critic actor of slot ``index`` of a run (``cfg`` is a CastConfig), started if absent."""
    tools = None
    if cfg.critic.backend == "rule":
        from cast_rl.envs.setup import load_env_data

        data = load_env_data(cfg)
        tools = {data.domain: data.tools}
    return CriticServiceActor.options(
        name=f"{ACTOR_PREFIX}-{index}",
        get_if_exists=True,
        max_restarts=cfg.critic.max_retries,
        max_concurrency=64,
        num_cpus=0 if cfg.critic.backend == "rule" else 1,
        num_gpus=num_gpus,
    ).remote(cfg.critic, tools)
