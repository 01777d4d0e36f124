"""Simulated customers, chosen by ``user.type`` through :data:`USER_BUILDERS`.

``scripted``: :class:`~cast_rl.envs.users.scripted.ScriptedUser`, deterministic rules, no model
(all four domains; ``user.trait`` picks a tau-trait trait, :mod:`cast_rl.envs.users.traits`).
``llm``: :class:`~cast_rl.envs.users.llm.LLMUser` over an injected ``complete`` callable: the
user model's engine built by :func:`user_engine` (which each rollout worker starts beside its
policy engine): in process (``user.inference.backend=vllm``) or an OpenAI-compatible endpoint
serving ``user.model.path`` (``openai``, :class:`~cast_rl.inference.openai_engine.OpenAIEngine`);
when no ``complete`` is given and the backend is ``openai``, :func:`build_user` opens that
endpoint itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cast_rl.config.schema import UserConfig
from cast_rl.envs.users.base import UserSimulator
from cast_rl.envs.users.llm import (
    Complete,
    LLMUser,
    UserSimulatorTimeout,
    engine_complete,
)
from cast_rl.envs.users.scripted import ScriptedUser
from cast_rl.envs.users.traits import Trait
from cast_rl.inference import build_engine
from cast_rl.models.setup import ensure_model

__all__ = [
    "USER_BUILDERS",
    "LLMUser",
    "ScriptedUser",
    "Trait",
    "UserSimulator",
    "UserSimulatorTimeout",
    "build_user",
    "user_engine",
]


def _scripted(cfg: UserConfig, complete: Complete | None, seed: int) -> UserSimulator:
    return ScriptedUser(cfg.max_turns, Trait(cfg.trait, cfg.trait_level), seed=seed)


def _llm(cfg: UserConfig, complete: Complete | None, seed: int) -> UserSimulator:
    if complete is None:
        if cfg.inference.backend != "openai":
            raise ValueError(
                f"user.type='llm' with user.inference.backend={cfg.inference.backend!r} needs an "
                "engine: the rollout worker passes its in-process user engine "
                "(cast_rl.envs.users.user_engine), or set user.inference.backend=openai and "
                "user.inference.base_url"
            )
        complete = engine_complete(build_engine(cfg.model.path, cfg.inference, seed=seed, dtype=cfg.model.dtype),
                                   cfg.inference)
    return LLMUser(complete, timeout_s=cfg.timeout_s, trait=Trait(cfg.trait, cfg.trait_level))


USER_BUILDERS: dict[str, Callable[[UserConfig, Complete | None, int], UserSimulator]] = {
    "scripted": _scripted,
    "llm": _llm,
}


def user_engine(cfg: UserConfig, seed: int = 0) -> tuple[Any, Complete | None]:
    """For ``user.type=llm``: the user model's engine and the ``complete`` that serves
    :class:`LLMUser` from it, otherwise ``(None, None)``.  ``user.inference.backend=vllm`` starts
    an in-process engine from ``user.model`` (a tiny one first if it is missing and allowed),
    served in ``user.model.dtype``;
    ``openai`` opens the endpoint ``user.inference.base_url`` serving ``user.model.path``.

    The caller owns the engine and closes it (the rollout worker does, with its policy engine).
    """
    if cfg.type != "llm" or cfg.inference.backend not in ("vllm", "openai"):
        return None, None
    path = str(ensure_model(cfg.model)) if cfg.inference.backend == "vllm" else cfg.model.path
    engine = build_engine(path, cfg.inference, seed=seed, dtype=cfg.model.dtype)
    return engine, engine_complete(engine, cfg.inference)


def build_user(cfg: UserConfig, complete: Complete | None = None, seed: int = 0) -> UserSimulator:
    """A fresh user simulator for one episode (``complete`` serves ``type=llm``; ``seed`` drives
    the scripted user's trait behaviour)."""
    if cfg.type not in USER_BUILDERS:
        raise ValueError(f"user.type={cfg.type!r} is not allowed; choose one of "
                         f"{', '.join(USER_BUILDERS)}")
    return USER_BUILDERS[cfg.type](cfg, complete, seed)
