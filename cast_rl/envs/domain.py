"""Domain registry: what makes a tau-style domain (tools, terminate tools, data layout).

Each domain module under :mod:`cast_rl.envs.domains` defines its tool classes and registers one
:class:`DomainSpec` in :data:`DOMAINS`.  A tool is a class with a ``@staticmethod invoke(data,
**kwargs) -> str`` whose keyword arguments are exactly the source benchmark's, so that a call with
missing or extra arguments fails with the same ``TypeError`` text as the source (Python names the
function by its qualified name, e.g. ``CancelPendingOrder.invoke()``).  ``data`` is a
:class:`cast_rl.envs.db.Database`; tools follow its copy-on-write contract.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Protocol

from cast_rl.config.schema import DOMAIN_NAMES


class Tool(Protocol):
    """A tool class: ``invoke`` runs it on the database and returns the observation string."""

    @staticmethod
    def invoke(data: Any, **kwargs: Any) -> str: ...


@dataclass(frozen=True)
class DomainSpec:
    """A domain: its tools in the source's ALL_TOOLS order and how an episode ends."""

    name: str
    tools: tuple[type, ...]
    """Tool classes, in the order of the source's ALL_TOOLS (and of tools.json)."""
    terminate_tools: tuple[str, ...]
    """Tool names whose call ends the episode (only those the domain actually exposes matter)."""
    write_tools: frozenset[str]
    """Tools that change the database (consequential actions for the labeller and the critic)."""

    @property
    def tool_map(self) -> dict[str, type]:
        return {tool_name(tool): tool for tool in self.tools}


def tool_name(tool: type) -> str:
    """snake_case name of a tool class: ``CancelPendingOrder`` -> ``cancel_pending_order``."""
    explicit = getattr(tool, "name", None)
    if isinstance(explicit, str):
        return explicit
    out = []
    for i, ch in enumerate(tool.__name__):
        if ch.isupper() and i:
            out.append("_")
        out.append(ch.lower())
    return "".join(out)


DOMAINS: dict[str, DomainSpec] = {}
_DOMAIN_MODULES = {name: f"cast_rl.envs.domains.{name}" for name in DOMAIN_NAMES}


def register(spec: DomainSpec) -> DomainSpec:
    DOMAINS[spec.name] = spec
    return spec


def get_domain(name: str) -> DomainSpec:
    """The registered domain, importing its module on first use."""
    if name not in DOMAINS:
        if name not in _DOMAIN_MODULES:
            raise ValueError(f"unknown domain {name!r}; choose one of {', '.join(_DOMAIN_MODULES)}")
        importlib.import_module(_DOMAIN_MODULES[name])
    return DOMAINS[name]
