"""The critic service: a batched critic behind a backend registry, and its retrying client.

:class:`CriticService` is the library object the Ray actor (``actors/critic_service.py``) wraps:
``await service.critique(requests) -> critiques`` over one :class:`Verifier` backend chosen by
``critic.backend`` (``rule``: visible-information rules; ``model``: a critic LLM through an
:class:`~cast_rl.inference.base.InferenceEngine`; ``trained``: the same over the critic the
pipeline trained, whose directory the pipeline puts in ``critic.model.path``).  It counts what it
answered, unparsable answers apart, and says which critic it serves (:meth:`CriticService.describe`).

:class:`CriticServiceClient` is what rollout workers hold: a :class:`Verifier` that sends each
batch to one of the service actors (round robin) and, when an actor dies or is unavailable,
retries on the next one (re-creating the dead one when it can), at most ``critic.max_retries``
times before giving up with :class:`CriticUnavailable`.  A request that takes longer than
``critic.timeout_s`` (a hung actor) counts as such a failure.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from cast_rl.config.schema import CriticConfig
from cast_rl.critique.verifier import Critique, ModelVerifier, RuleVerifier, Verifier, VerifyRequest

logger = logging.getLogger(__name__)

ACTOR_PREFIX = "cast-critic"
"""Critic service actors are named ``cast-critic-<i>`` so every worker finds the same ones."""


class CriticUnavailable(RuntimeError):
    """Every retry of a critique request hit a dead or unavailable critic actor."""


def _rule(cfg: CriticConfig, tools: dict[str, list[dict[str, Any]]] | None, engine: Any) -> Verifier:
    return RuleVerifier(tools)


def _model(cfg: CriticConfig, tools: dict[str, list[dict[str, Any]]] | None, engine: Any) -> Verifier:
    from pathlib import Path

    from cast_rl.inference.base import Sampling

    if cfg.backend == "trained" and engine is None and not (Path(cfg.model.path) / "config.json").exists():
        raise FileNotFoundError(
            f"critic.backend=trained: no trained critic at critic.model.path={cfg.model.path!r}; the "
            "pipeline serves <run_dir>/05_train_critic/model once stage train_critic has run"
        )
    if engine is None:
        from cast_rl.inference import build_engine

        engine = build_engine(cfg.model.path, cfg.inference, seed=cfg.model.seed)
    sampling = Sampling(
        max_new_tokens=cfg.inference.max_new_tokens,
        temperature=cfg.inference.temperature,
        top_p=cfg.inference.top_p,
        logprobs=False,
    )
    return ModelVerifier(engine, sampling, name=cfg.model.path)


BACKENDS: dict[str, Callable[[CriticConfig, Any, Any], Verifier]] = {
    "rule": _rule, "model": _model, "trained": _model,
}


def build_verifier(
    cfg: CriticConfig,
    tools: dict[str, list[dict[str, Any]]] | None = None,
    engine: Any = None,
) -> Verifier:
    """The verifier of ``cfg.backend`` (``engine`` overrides the model backend's own engine)."""
    if cfg.backend not in BACKENDS:
        raise ValueError(f"critic.backend={cfg.backend!r} is not allowed; choose {', '.join(BACKENDS)}")
    return BACKENDS[cfg.backend](cfg, tools, engine)


def critic_description(cfg: CriticConfig) -> str:
    """What reports call a critic: ``rule``, or ``<backend>:<model directory>``."""
    return "rule" if cfg.backend == "rule" else f"{cfg.backend}:{cfg.model.path}"


def as_request(obj: VerifyRequest | dict[str, Any]) -> VerifyRequest:
    return obj if isinstance(obj, VerifyRequest) else VerifyRequest(**obj)


class CriticService:
    """Batched critiques from one verifier backend, with counts for the metrics logger."""

    def __init__(self, verifier: Verifier, cfg: CriticConfig | None = None) -> None:
        self.verifier = verifier
        self.cfg = cfg
        self.counts: Counter[str] = Counter()

    def describe(self) -> dict[str, str]:
        """Which critic this service serves: its backend and (model critics) its model directory."""
        if self.cfg is None:
            return {"backend": type(self.verifier).__name__, "model": ""}
        return {"backend": self.cfg.backend, "model": "" if self.cfg.backend == "rule" else self.cfg.model.path}

    async def close(self) -> None:
        """Shut a model critic's engine down; a rule critic holds nothing."""
        close = getattr(self.verifier, "close", None)
        if close is not None:
            await close()

    async def critique(self, requests: list[VerifyRequest | dict[str, Any]]) -> list[Critique]:
        batch = [as_request(r) for r in requests]
        critiques = await self.verifier.verify(batch) if batch else []
        if len(critiques) != len(batch):
            raise RuntimeError(f"the verifier answered {len(critiques)} of {len(batch)} requests")
        self.counts["requests"] += len(batch)
        self.counts["batches"] += 1
        for c in critiques:
            self.counts[c.verdict] += 1
            if c.verdict == "invalid":
                self.counts[f"type_{c.error_type}"] += 1
        return critiques

    def stats(self) -> dict[str, float]:
        """``critic/`` metrics: requests, batches, verdict counts and the unparsable rate."""
        out = {f"critic/{k}": float(v) for k, v in self.counts.items()}
        n = self.counts["requests"]
        out["critic/unparsable_rate"] = self.counts["unparsable"] / n if n else 0.0
        return out


def _ray_errors() -> tuple[type[BaseException], ...]:
    try:
        from ray.exceptions import ActorUnavailableError, RayActorError
    except ImportError:  # pragma: no cover - ray is a hard dependency
        return ()
    return (RayActorError, ActorUnavailableError)


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
        self.retry_on = retry_on if retry_on is not None else _ray_errors()
        self.timeout_s = timeout_s
        self.failures = 0
        self.timeouts = 0
        self._next = 0

    @classmethod
    def from_config(cls, cfg: Any) -> CriticServiceClient:
        """Join (or start) the ``critic.num_replicas`` named critic actors of a run."""
        from actors.critic_service import critic_actor

        critic: CriticConfig = cfg.critic
        handles = [critic_actor(cfg, i) for i in range(critic.num_replicas)]
        return cls(handles, critic.max_retries, respawn=lambda i: critic_actor(cfg, i),
                   timeout_s=critic.timeout_s)

    async def verify(self, requests: list[VerifyRequest]) -> list[Critique]:
        attempt = 0
        while True:
            slot = self._next % len(self.handles)
            self._next += 1
            try:
                result = await asyncio.wait_for(
                    _awaitable(self.handles[slot].critique.remote(requests)), self.timeout_s
                )
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
                if self.respawn is not None and not timed_out:
                    try:
                        self.handles[slot] = self.respawn(slot)
                    except Exception as respawn_exc:  # keep failing over to the others
                        logger.warning("could not restart critic actor %d: %s", slot, respawn_exc)


    async def close(self) -> None:
        """Close the critic actors' engines and end the actors (when the run switches critic)."""
        import ray

        for handle in self.handles:
            try:
                await asyncio.wait_for(_awaitable(handle.close.remote()), 60)
                ray.kill(handle)
            except (asyncio.TimeoutError, *self.retry_on) as exc:  # already gone, or another worker closed it
                logger.info("critic actor was not closed cleanly: %s", exc)


async def _awaitable(ref: Any) -> Any:
    """Await an ObjectRef (or any awaitable) as a coroutine, so ``wait_for`` can cancel it."""
    return await ref


def critique_dicts(critiques: list[Critique]) -> list[dict[str, Any]]:
    return [asdict(c) for c in critiques]
