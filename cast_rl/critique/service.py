"""The critic service: a batched critic behind a backend registry, and its retrying client.

:class:`CriticService` is the library object the Ray actor (``actors/critic_service.py``) wraps:
``await service.critique(requests) -> critiques`` over one :class:`Verifier` backend chosen by
``critic.backend`` (``rule``: visible-information rules; ``model``: a critic LLM through an
:class:`~cast_rl.inference.base.InferenceEngine`; ``trained``: the same over the critic the
pipeline trained, whose directory the pipeline puts in ``critic.model.path``).  It counts what it
answered, unparsable answers apart, and says which critic it serves (:meth:`CriticService.describe`).

:class:`CriticUnavailable` is what a verifier raises when no critic answers; the rollout runner
turns it into an observation.  The client that reaches the service actors, with retries and
fail-over, is :class:`actors.critic_service.CriticServiceClient` (it holds Ray actor handles).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from cast_rl.config.schema import CriticConfig
from cast_rl.critique.prompt import served_prompt
from cast_rl.critique.rationale import CRITIQUE_REGEX
from cast_rl.critique.verifier import Critique, ModelVerifier, RuleVerifier, Verifier, VerifyRequest
from cast_rl.inference import build_engine
from cast_rl.inference.base import Sampling

logger = logging.getLogger(__name__)

ACTOR_PREFIX = "cast-critic"
"""Critic service actors are named ``cast-critic-<i>`` so every worker finds the same ones."""


class CriticUnavailable(RuntimeError):
    """Every retry of a critique request hit a dead or unavailable critic actor."""


def _rule(cfg: CriticConfig, tools: dict[str, list[dict[str, Any]]] | None, engine: Any) -> Verifier:
    return RuleVerifier(tools)


def _model(cfg: CriticConfig, tools: dict[str, list[dict[str, Any]]] | None, engine: Any) -> Verifier:
    if cfg.backend == "trained" and engine is None and not (Path(cfg.model.path) / "config.json").exists():
        raise FileNotFoundError(
            f"critic.backend=trained: no trained critic at critic.model.path={cfg.model.path!r}; the "
            "pipeline serves <run_dir>/05_train_critic/model once stage train_critic has run"
        )
    if engine is None:
        # critic.model.dtype: a trained critic is saved in float32 (the learner's master weights)
        engine = build_engine(cfg.model.path, cfg.inference, seed=cfg.model.seed, dtype=cfg.model.dtype)
    return model_verifier(cfg, engine)


def model_verifier(cfg: CriticConfig, engine: Any, adapter: str | None = None, owns_engine: bool = True) -> ModelVerifier:
    """The model critic ``cfg`` describes over ``engine`` (``adapter``: the engine's LoRA adapter
    that serves it; ``owns_engine=False``: closing the critic leaves the engine running)."""
    return ModelVerifier(engine, critic_sampling(cfg, adapter=adapter), name=cfg.model.path, owns_engine=owns_engine,
                         min_invalid_prob=cfg.min_invalid_prob, **served_prompt(cfg))


def critic_sampling(cfg: CriticConfig, adapter: str | None = None) -> Sampling:
    """How a model critic decodes (``critic.inference``, its format enforced with ``critic.structured``);
    ``adapter``: the LoRA adapter it is served as (``critic.engine=shared_with_policy``)."""
    return Sampling(
        max_new_tokens=cfg.inference.max_new_tokens,
        temperature=cfg.inference.temperature,
        top_p=cfg.inference.top_p,
        logprobs=cfg.min_invalid_prob > 0,  # the verdict token's probability
        regex=CRITIQUE_REGEX if cfg.structured else None,
        adapter=adapter,
    )


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


def critique_dicts(critiques: list[Critique]) -> list[dict[str, Any]]:
    return [asdict(c) for c in critiques]
