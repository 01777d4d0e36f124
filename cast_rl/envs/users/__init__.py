"""Simulated customers, chosen by ``user.type`` through :data:`USER_BUILDERS`.

``scripted``: :class:`~cast_rl.envs.users.scripted.ScriptedUser`, deterministic rules, no model
(all four domains; ``user.trait`` picks a tau-trait trait, :mod:`cast_rl.envs.users.traits`).
``llm``: :class:`~cast_rl.envs.users.llm.LLMUser` over an injected ``complete`` callable: the
user model's own in-process engine (``user.inference.backend=vllm``, :func:`user_engine`, which
each rollout worker starts beside its policy engine), or, when none is given and
``user.inference.backend`` is ``openai``, that endpoint serving ``user.model.path``.
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
    openai_complete,
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
                "(cast_rl.envs.users.engine), or set user.inference.backend=openai and "
                "user.inference.base_url"
            )
        complete = openai_complete(
            cfg.inference.base_url,
            cfg.model.path,
            cfg.inference.api_key_env,
            temperature=cfg.inference.temperature,
            max_tokens=cfg.inference.max_new_tokens,
            request_timeout_s=cfg.inference.request_timeout_s,
        )
    return LLMUser(complete, timeout_s=cfg.timeout_s, trait=Trait(cfg.trait, cfg.trait_level))


USER_BUILDERS: dict[str, Callable[[UserConfig, Complete | None, int], UserSimulator]] = {
    "scripted": _scripted,
    "llm": _llm,
}


def user_engine(cfg: UserConfig, seed: int = 0) -> tuple[Any, Complete | None]:
    """For ``user.type=llm`` with ``user.inference.backend=vllm``: the user model's own engine
    (built from ``user.model``, a tiny one first if it is missing and allowed) and the
    ``complete`` that serves :class:`LLMUser` from it; otherwise ``(None, None)``.

    The caller owns the engine and closes it (the rollout worker does, with its policy engine).
    """
    if cfg.type != "llm" or cfg.inference.backend != "vllm":
        return None, None

    engine = build_engine(str(ensure_model(cfg.model)), cfg.inference, seed=seed)
    return engine, engine_complete(engine, cfg.inference)


def build_user(cfg: UserConfig, complete: Complete | None = None, seed: int = 0) -> UserSimulator:
    """A fresh user simulator for one episode (``complete`` serves ``type=llm``; ``seed`` drives
    the scripted user's trait behaviour)."""
    if cfg.type not in USER_BUILDERS:
        raise ValueError(f"user.type={cfg.type!r} is not allowed; choose one of "
                         f"{', '.join(USER_BUILDERS)}")
    return USER_BUILDERS[cfg.type](cfg, complete, seed)
