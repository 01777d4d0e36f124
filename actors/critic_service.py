"""Ray actor shell of :class:`cast_rl.critique.service.CriticService`, and its retrying client.

Actors are named ``cast-critic-<critic>-<i>`` (``<critic>``: a digest of the backend and model,
so a run that switches critic never joins the old one's actors): the first rollout worker (or
the driver) that asks for slot ``i`` starts it and everyone else joins it.  A model critic's actor
asks Ray for one CPU and ``critic.num_gpus_per_replica`` GPUs.  A dead actor is restarted by Ray up to
``critic.max_retries`` times; :class:`CriticServiceClient` retries requests across actors
meanwhile.

:class:`CriticServiceClient` is what rollout workers hold: a verifier that sends each batch to
one of the service actors (round robin) and, when an actor dies or is unavailable, retries on the
next one (re-creating the dead one when it can), at most ``critic.max_retries`` times before
giving up with :class:`~cast_rl.critique.service.CriticUnavailable`.  A request that takes longer
than ``critic.timeout_s`` (a hung actor) counts as such a failure.  :func:`critic_client` is the
``connect`` a rollout worker is given (:func:`cast_rl.rollout.verifiers.build_verifier`).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Callable
from typing import Any

import ray
from ray.exceptions import ActorUnavailableError, RayActorError

from cast_rl.config.resources import critic_request
from cast_rl.config.schema import CastConfig, CriticConfig
from cast_rl.critique.service import (
    ACTOR_PREFIX,
    CriticService,
    CriticUnavailable,
    build_verifier,
)
from cast_rl.critique.verifier import Critique, VerifyRequest
from cast_rl.envs.setup import load_env_data

logger = logging.getLogger(__name__)

ACTOR_FAILURES: tuple[type[BaseException], ...] = (RayActorError, ActorUnavailableError)
"""What a call to a dead or restarting critic actor raises: the client retries on these."""


@ray.remote
class CriticServiceActor:
    def __init__(self, cfg: CriticConfig, tools: dict[str, list[dict[str, Any]]] | None = None) -> None:
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
    return {"max_restarts": critic.max_retries, "max_concurrency": critic.max_concurrency, **critic_request(critic).ray_options()}


class CriticServiceClient:
    """A :class:`Verifier` over critic service actors, with retry and fail-over.

    ``handles`` are actor handles with a ``critique`` method; ``respawn(i)`` (optional) returns
    a fresh handle for slot ``i`` after its actor died.  ``timeout_s`` (None: wait forever)
    bounds each attempt; a timed-out attempt is retried like a dead actor, and its slot is not
    respawned (the actor may only be slow).
    """

    def __init__(
        self,
        handles: list[Any],
        max_retries: int = 3,
        respawn: Callable[[int], Any] | None = None,
        retry_on: tuple[type[BaseException], ...] | None = None,
        timeout_s: float | None = None,
    ) -> None:
        if not handles:
            raise ValueError("CriticServiceClient needs at least one critic actor handle")
        self.handles = list(handles)
        self.max_retries = max_retries
        self.respawn = respawn
        self.retry_on = retry_on if retry_on is not None else ACTOR_FAILURES
        self.timeout_s = timeout_s
        self.failures = 0
        self.timeouts = 0
        self._next = 0

    @classmethod
    def from_config(cls, cfg: Any) -> CriticServiceClient:
        """Join (or start) the ``critic.num_replicas`` named critic actors of a run."""
        critic: CriticConfig = cfg.critic
        handles = [critic_actor(cfg, i) for i in range(critic.num_replicas)]
        return cls(handles, critic.max_retries, respawn=lambda i: critic_actor(cfg, i),
                   timeout_s=critic.timeout_s)

    async def verify(self, requests: list[VerifyRequest]) -> list[Critique]:
        attempt = 0
        while True:
            slot = self._next % len(self.handles)
            self._next += 1
            handle = self.handles[slot]
            try:
                result = await asyncio.wait_for(_awaitable(handle.critique.remote(requests)), self.timeout_s)
                return [c if isinstance(c, Critique) else Critique(**c) for c in result]
            except (asyncio.TimeoutError, *self.retry_on) as exc:
                timed_out = isinstance(exc, asyncio.TimeoutError)
                self.timeouts += timed_out
                why = f"no answer within critic.timeout_s={self.timeout_s}s" if timed_out else str(exc)
                self.failures += 1
                attempt += 1
                if attempt > self.max_retries:
                    raise CriticUnavailable(
                        f"critic service failed {attempt} times (critic.max_retries="
                        f"{self.max_retries}); last error: {why}"
                    ) from exc
                logger.warning("critic actor %d failed (%s); retry %d of %d", slot, why, attempt,
                               self.max_retries)
                # Only the first of the calls that failed on this handle replaces it: a second
                # replacement would drop the first one's owner handle, and Ray would end that actor.
                if self.respawn is not None and not timed_out and self.handles[slot] is handle:
                    try:
                        self.handles[slot] = self.respawn(slot)
                    except Exception as respawn_exc:  # keep failing over to the others
                        logger.warning("could not restart critic actor %d: %s", slot, respawn_exc)

    async def close(self) -> None:
        """Close the critic actors' engines and end the actors (when the run switches critic)."""
        for handle in self.handles:
            try:
                await asyncio.wait_for(_awaitable(handle.close.remote()), 60)
                ray.kill(handle)
            except (asyncio.TimeoutError, *self.retry_on) as exc:  # already gone, or another worker closed it
                logger.info("critic actor was not closed cleanly: %s", exc)


async def _awaitable(ref: Any) -> Any:
    """Await an ObjectRef (or any awaitable) as a coroutine, so ``wait_for`` can cancel it."""
    return await ref


def critic_client(cfg: CastConfig) -> CriticServiceClient:
    """A rollout worker's way to the run's critic actors (``connect`` of
    :func:`cast_rl.rollout.verifiers.build_verifier`)."""
    return CriticServiceClient.from_config(cfg)
