"""Load a :class:`CastConfig` from defaults, a YAML file and dotted overrides.

Layers merge in order: the dataclass defaults, the YAML file (which may name a ``base:`` YAML file
of its own, resolved relative to it), any further YAML files given after it (an overlay such as
``configs/paper/rehearsal_cpu.yaml`` on a layout; each with its own ``base:`` chain), then
command-line overrides such as ``learner.lr=1e-6``.
Every problem becomes a one-line :class:`ConfigError` naming the key, the value and what is
allowed, raised before anything starts.

YAML files and overrides are read with YAML 1.2's booleans (``true``/``false`` only): YAML 1.1
also reads ``no``, ``off``, ``yes`` and ``on`` as booleans, which would turn the choices
``learner.mixed_precision=no`` or ``pipeline.critic_data_blame=off`` into the string ``'False'``.
Boolean keys still take ``yes``/``no``/``on``/``off`` (OmegaConf converts those strings).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import re
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf._utils import get_yaml_loader
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException, ValidationError

from cast_rl.config.schema import CastConfig

BASE_KEY = "base"
_BOOL_TAG = "tag:yaml.org,2002:bool"


@functools.cache
def _yaml_loader() -> type:
    """OmegaConf's YAML loader with YAML 1.2's booleans: only true/false, any capitalisation."""
    base = get_yaml_loader()

    class Loader(base):  # type: ignore[misc, valid-type]
        pass

    Loader.yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag != _BOOL_TAG]
        for first, resolvers in base.yaml_implicit_resolvers.items()
    }
    Loader.add_implicit_resolver(_BOOL_TAG, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
                                 list("tTfF"))
    return Loader


class ConfigError(ValueError):
    """A configuration problem, stated in one line."""


def load_config(path: str | Path | Sequence[str | Path] | None = None,
                overrides: list[str] | None = None) -> CastConfig:
    """The resolved, validated configuration of one YAML file or several (merged in order)."""
    merged = _schema()
    paths = [] if path is None else [path] if isinstance(path, str | Path) else list(path)
    for each in paths:
        for layer_path, layer in _yaml_layers(Path(each)):
            merged = _merge(merged, layer, str(layer_path))
    if overrides:
        merged = _merge(merged, _dotlist(overrides), "command line")
    try:
        cfg = OmegaConf.to_object(merged)
    except ValueError as exc:  # __post_init__ validation names the key itself
        raise ConfigError(f"config error: {exc}") from None
    except OmegaConfBaseException as exc:
        raise ConfigError(f"config error: {_describe(exc)}") from None
    assert isinstance(cfg, CastConfig)
    return cfg


def to_yaml(cfg: CastConfig) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def to_dict(cfg: CastConfig) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def _schema() -> DictConfig:
    return copy.deepcopy(_schema_template())


@functools.cache
def _schema_template() -> DictConfig:
    """The defaults as a writable OmegaConf tree, built once (a deep copy is ~4x cheaper)."""
    schema = OmegaConf.structured(CastConfig)
    _writable(schema)
    return schema


def _writable(node: DictConfig) -> None:
    """Frozen dataclasses mark every node read-only; merging needs them writable."""
    OmegaConf.set_readonly(node, None)
    for key in node:
        child = node._get_node(key)
        if isinstance(child, DictConfig):
            _writable(child)


def _yaml_layers(path: Path, seen: tuple[Path, ...] = ()) -> list[tuple[Path, DictConfig]]:
    path = path.resolve()
    if not path.is_file():
        raise ConfigError(f"config error: config file {path} does not exist")
    if path in seen:
        raise ConfigError(f"config error: {BASE_KEY}: chain loops back to {path}")
    try:
        layer = OmegaConf.create(yaml.load(path.read_text(), Loader=_yaml_loader()))
    except Exception as exc:  # yaml.YAMLError and friends: report file and reason
        raise ConfigError(f"config error: {path} is not valid YAML: {exc}".replace("\n", " ")) from None
    if not isinstance(layer, DictConfig):
        raise ConfigError(f"config error: {path} must hold a mapping of keys, not a list")
    layers: list[tuple[Path, DictConfig]] = []
    if BASE_KEY in layer:
        base = layer.pop(BASE_KEY)
        if not isinstance(base, str):
            raise ConfigError(f"config error: {BASE_KEY}={base!r} in {path} must be a file path")
        layers.extend(_yaml_layers(path.parent / base, seen + (path,)))
    layers.append((path, layer))
    return layers


def _dotlist(overrides: list[str]) -> DictConfig:
    for item in overrides:
        if "=" not in item or item.startswith("="):
            raise ConfigError(f"config error: override {item!r} must look like key=value, e.g. learner.lr=1e-6")
    layer = OmegaConf.create()
    for item in overrides:
        key, _, value = item.partition("=")
        try:
            parsed = yaml.load(value, Loader=_yaml_loader())
        except yaml.YAMLError as exc:
            raise ConfigError(f"config error: override {item!r}: {value!r} is not a YAML value: "
                              f"{exc}".replace("\n", " ")) from None
        OmegaConf.update(layer, key, parsed)
    return layer


def _merge(merged: DictConfig, layer: DictConfig, source: str) -> DictConfig:
    section = _scalar_for_section(layer)
    if section is not None:  # OmegaConf's own error here does not name the key
        key, value = section
        raise ConfigError(f"config error ({source}): {key}={value!r} is not allowed; expected {_expected_type(key)}")
    try:
        out = OmegaConf.merge(merged, layer)
    except OmegaConfBaseException as exc:
        raise ConfigError(f"config error ({source}): {_describe(exc)}") from None
    assert isinstance(out, DictConfig)
    return out


def _scalar_for_section(layer: DictConfig, prefix: str = "") -> tuple[str, Any] | None:
    """The first key of ``layer`` that gives a plain value where the schema has a section."""
    for key in layer:
        dotted = f"{prefix}{key}"
        if not dataclasses.is_dataclass(_node_type(dotted)):
            continue
        child = layer._get_node(key)
        if isinstance(child, DictConfig):
            found = _scalar_for_section(child, dotted + ".")
            if found is not None:
                return found
        else:
            value = OmegaConf.to_container(child) if isinstance(child, ListConfig) else child._value()  # type: ignore[union-attr]
            return dotted, value
    return None


def _describe(exc: OmegaConfBaseException) -> str:
    key = getattr(exc, "full_key", None)
    if not key:
        return str(exc).splitlines()[0]
    if isinstance(exc, ConfigKeyError):
        parent = key.rsplit(".", 1)[0] if "." in key else ""
        allowed = _allowed_keys(parent)
        where = f" of {parent}" if parent else ""
        return f"unknown key {key!r}; allowed keys{where}: {', '.join(allowed)}"
    if isinstance(exc, ValidationError):
        value = getattr(exc, "value", None)
        expected = _expected_type(key)
        return f"{key}={value!r} is not allowed; expected {expected}"
    return str(exc).splitlines()[0]


def _node_type(dotted: str) -> Any:
    node: Any = CastConfig
    for part in filter(None, dotted.split(".")):
        name, _, index = part.partition("[")
        if not dataclasses.is_dataclass(node):
            return None
        hints = typing.get_type_hints(node)
        if name not in hints:
            return None
        node = hints[name]
        if index:  # a list element: the element type
            node = typing.get_args(node)[0] if typing.get_args(node) else None
    return node


def _allowed_keys(parent: str) -> list[str]:
    node = _node_type(parent)
    if node is None or not dataclasses.is_dataclass(node):
        return []
    return [f.name for f in dataclasses.fields(node)]


def _expected_type(key: str) -> str:
    node = _node_type(key)
    if node is None:
        return "a valid value"
    if dataclasses.is_dataclass(node):
        return f"a mapping with keys {', '.join(f.name for f in dataclasses.fields(node))}"
    return getattr(node, "__name__", str(node))
