"""Simulated customers, chosen by ``user.type`` through :data:`USER_BUILDERS`.

``scripted``: :class:`~cast_rl.envs.users.scripted.ScriptedUser`, deterministic rules, no model.
``llm``: :class:`~cast_rl.envs.users.llm.LLMUser` over an injected ``complete`` callable, or, when
none is given and ``user.inference.backend`` is ``openai``, over that endpoint serving
``user.model.path``.
"""

from __future__ import annotations

from collections.abc import Callable

from cast_rl.config.schema import UserConfig
from cast_rl.envs.users.base import UserSimulator
from cast_rl.envs.users.llm import Complete, LLMUser, UserSimulatorTimeout, openai_complete
from cast_rl.envs.users.scripted import ScriptedUser

__all__ = [
    "USER_BUILDERS",
    "LLMUser",
    "ScriptedUser",
    "UserSimulator",
    "UserSimulatorTimeout",
    "build_user",
]


def _scripted(cfg: UserConfig, complete: Complete | None) -> UserSimulator:
    return ScriptedUser()


def _llm(cfg: UserConfig, complete: Complete | None) -> UserSimulator:
    if complete is None:
        if cfg.inference.backend != "openai":
            raise ValueError(
                f"user.type='llm' with user.inference.backend={cfg.inference.backend!r} needs an "
                "engine: pass complete=... to build_user, or set user.inference.backend=openai "
                "and user.inference.base_url"
            )
        complete = openai_complete(
            cfg.inference.base_url,
            cfg.model.path,
            cfg.inference.api_key_env,
            temperature=cfg.inference.temperature,
            max_tokens=cfg.inference.max_new_tokens,
            request_timeout_s=cfg.inference.request_timeout_s,
        )
    return LLMUser(complete, timeout_s=cfg.timeout_s)


USER_BUILDERS: dict[str, Callable[[UserConfig, Complete | None], UserSimulator]] = {
    "scripted": _scripted,
    "llm": _llm,
}


def build_user(cfg: UserConfig, complete: Complete | None = None) -> UserSimulator:
    """A fresh user simulator for one episode (``complete`` serves ``type=llm``)."""
    if cfg.type not in USER_BUILDERS:
        raise ValueError(f"user.type={cfg.type!r} is not allowed; choose one of "
                         f"{', '.join(USER_BUILDERS)}")
    return USER_BUILDERS[cfg.type](cfg, complete)
