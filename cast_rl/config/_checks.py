"""Validation helpers the config dataclasses' ``__post_init__`` share: each raises
:class:`ValueError` naming the key, the value and what is allowed.
"""

from __future__ import annotations


def _check_choice(key: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{key}={value!r} is not allowed; choose one of {', '.join(allowed)}")


def _check_positive(key: str, value: float, *, allow_zero: bool = False) -> None:
    if value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{key}={value!r} is not allowed; it must be {bound}")


def _check_ray_resources(key: str, resources: dict[str, float]) -> None:
    for name, amount in resources.items():
        if name in ("CPU", "GPU", "memory", "object_store_memory"):
            raise ValueError(f"{key}.{name} is not allowed; CPUs and GPUs have their own num_*_per_worker keys")
        _check_positive(f"{key}.{name}", amount)


def _check_fraction(key: str, value: float) -> None:
    if not 0.0 < value <= 1.0:
        raise ValueError(f"{key}={value!r} is not allowed; it must be in (0, 1]")
