"""The one configuration surface of every entry point: ``[CONFIG] [key=value ...]`` on argparse.

Every ``cast-rl`` subcommand that reads configuration and every ``python -m launchers.*`` module
adds its config arguments with :func:`add_config_arguments` and resolves them with
:func:`config_from_args` (the launchers through ``launchers.commands``, which the ``cast-rl``
subcommands share)::

    cast-rl label configs/quickstart.yaml env.now=2024-05-15T15:00:00 --trajectories T --out L
    cast-rl env replay env.domain=airline env.data_dir=../shared/benchmarks/airline --out R.jsonl

``CONFIG`` is a YAML file or ``default`` (the built-in defaults); it may be left out, and then the
first argument is already an override.  Further YAML files among the arguments (``*.yaml`` or
``*.yml``, no ``=``) are merged after it, in order, before the overrides: an overlay on a layout,
e.g. ``cast-rl pipeline configs/paper/qwen3_4b_1x8gpu.yaml configs/paper/rehearsal_cpu.yaml``.
Flags stay only for what is not configuration (input and output paths); anything a run is
configured by is a dotted key, validated with the rest.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from cast_rl.config.loader import load_config
from cast_rl.config.schema import CastConfig

DEFAULT = "default"
"""The CONFIG value that means the built-in defaults (no YAML file)."""


def add_config_arguments(parser: argparse.ArgumentParser, example: str = "learner.lr=1e-6") -> None:
    """Add the positional ``CONFIG`` (optional) and ``KEY=VALUE`` overrides to ``parser``."""
    parser.add_argument(
        "config",
        nargs="?",
        default=DEFAULT,
        metavar="CONFIG",
        help=f"YAML file, or '{DEFAULT}' for the built-in defaults (the default when left out)",
    )
    parser.add_argument(
        "overrides",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help=f"dotted config overrides such as {example}; a further YAML file here (an overlay) "
             "is merged after CONFIG, before the overrides",
    )


FLAG_KEYS = {"log_level": "logging.level"}
"""Convenience flags that stand for a config key (``cast-rl --log-level DEBUG`` is
``logging.level=DEBUG``; given, the flag wins over the config)."""


def config_from_args(args: argparse.Namespace) -> CastConfig:
    """The resolved configuration of ``args.config`` and ``args.overrides``; a one-line
    :class:`ConfigError` (naming the key) when they do not validate.

    Flags of :data:`FLAG_KEYS` present in ``args`` become overrides of their keys; the console
    log level is then set from ``logging.level``.
    """
    config, overrides = args.config, list(args.overrides)
    if config != DEFAULT and "=" in config and not Path(config).is_file():
        # CONFIG left out: what argparse took for it is the first override
        config, overrides = DEFAULT, [config, *overrides]
    overlays = [item for item in overrides if _is_yaml_file(item)]
    overrides = [item for item in overrides if not _is_yaml_file(item)]
    for flag, key in FLAG_KEYS.items():
        value = getattr(args, flag, None)
        if value is not None:
            overrides.append(f"{key}={str(value).upper()}")
    cfg = load_config(([] if config == DEFAULT else [config]) + overlays, overrides)
    logging.getLogger().setLevel(cfg.logging.level)
    return cfg


def _is_yaml_file(item: str) -> bool:
    """An argument naming a YAML file (a further config layer), not a ``key=value`` override."""
    return "=" not in item and item.endswith((".yaml", ".yml"))
