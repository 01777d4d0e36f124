"""Typed configuration (dataclasses) and its YAML/command-line loader."""

from cast_rl.config.loader import ConfigError, load_config, to_dict, to_yaml
from cast_rl.config.schema import CastConfig

__all__ = ["CastConfig", "ConfigError", "load_config", "to_dict", "to_yaml"]
