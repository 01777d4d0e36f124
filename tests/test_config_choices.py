"""Every allowed value of every choice key can be typed, on the command line and in a YAML file.

The choices are found from the schema itself: every string (or list-of-strings) key is given a
value no choice has, and the key's own error lists what it allows.  Each allowed value is then
typed unquoted, as a user would (``learner.mixed_precision=no``, ``critic_data_blame: off``), and
must come back as that string: YAML 1.1 would read ``no`` and ``off`` as booleans.
"""

from __future__ import annotations

import dataclasses
import re
import typing
from pathlib import Path
from typing import Any

import pytest

from cast_rl.config import CastConfig, ConfigError, load_config

BOGUS = "zz_not_a_choice"
COMPANIONS = {  # keys some choices need beside them (each rule names its companion)
    "eval.domains": ["eval.data_root=data"],
    "critic.backend": ["pipeline.critic_train_steps=1"],
    "pipeline.critic_data_blame": ["pipeline.blame_k=2"],
    "labeller.backend": ["labeller.model.path=runs/models/verifier"],
}
CHOICES = re.compile(r"choose one of (.+)$")


def _string_keys(node: type, prefix: str = "") -> list[tuple[str, bool]]:
    """(dotted key, is a list) for every str, str | None and list-of-str leaf of the schema."""
    out: list[tuple[str, bool]] = []
    for f, hint in ((f, typing.get_type_hints(node)[f.name]) for f in dataclasses.fields(node)):
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(hint):
            out.extend(_string_keys(hint, key + "."))
            continue
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        origin = typing.get_origin(hint)
        if hint is str or (origin in (typing.Union, getattr(__import__("types"), "UnionType", None))
                           and args == [str]):
            out.append((key, False))
        elif origin in (list, tuple) and args and args[0] is str:
            out.append((key, True))
    return out


def _choices() -> list[tuple[str, bool, str]]:
    found = []
    for key, is_list in _string_keys(CastConfig):
        value = f"[{BOGUS}]" if is_list else BOGUS
        try:
            load_config(None, [f"{key}={value}"])
        except ConfigError as exc:
            match = CHOICES.search(str(exc))
            if match and BOGUS in str(exc):
                found.extend((key, is_list, c.strip()) for c in match.group(1).split(","))
    return found


ALL_CHOICES = _choices()


def _get(cfg: CastConfig, key: str) -> Any:
    obj: Any = cfg
    for part in key.split("."):
        obj = getattr(obj, part)
    return obj


def _nested_yaml(key: str, value: str) -> str:
    parts = key.split(".")
    lines = [f"{'  ' * i}{p}:" for i, p in enumerate(parts[:-1])]
    lines.append(f"{'  ' * (len(parts) - 1)}{parts[-1]}: {value}")
    return "\n".join(lines) + "\n"


def test_the_schema_has_the_choice_keys_users_type() -> None:
    keys = {k for k, _, _ in ALL_CHOICES}
    # a walk that found nothing would pass every test below
    assert len(keys) >= 20, sorted(keys)
    assert {"learner.mixed_precision", "pipeline.critic_data_blame", "critic.backend",
            "algorithm.samples"} <= keys
    assert ("learner.mixed_precision", False, "no") in ALL_CHOICES
    assert ("pipeline.critic_data_blame", False, "off") in ALL_CHOICES


@pytest.mark.parametrize(("key", "is_list", "choice"), ALL_CHOICES,
                         ids=[f"{k}={c}" for k, _, c in ALL_CHOICES])
def test_every_choice_can_be_typed_on_the_command_line_and_in_yaml(
        key: str, is_list: bool, choice: str, tmp_path: Path) -> None:
    typed = f"[{choice}]" if is_list else choice
    expected = [choice] if is_list else choice
    try:
        cfg = load_config(None, [f"{key}={typed}", *COMPANIONS.get(key, [])])
    except ConfigError as exc:
        # a rule across keys may refuse a value with its reason (the user cannot be served by the
        # expert policy) or ask for a companion key; never a listed choice refused as unknown, and
        # never the YAML 1.1 boolean trap
        message = str(exc)
        assert "'False'" not in message and "'True'" not in message, message
        assert not (key in message and "choose one of" in message), message
        pytest.skip(f"{key}={choice} is refused with a reason: {message}")
    got = _get(cfg, key)
    assert (list(got) if is_list else got) == expected
    path = tmp_path / "c.yaml"
    path.write_text(_nested_yaml(key, typed))
    got = _get(load_config(path, COMPANIONS.get(key, [])), key)
    assert (list(got) if is_list else got) == expected


def test_boolean_keys_still_take_yes_no_on_off() -> None:
    for text, value in (("yes", True), ("no", False), ("on", True), ("off", False), ("false", False)):
        assert load_config(None, [f"learner.activation_checkpointing={text}"]).learner.activation_checkpointing is value
