"""Why a failed episode failed: its final database against the gold outcome.

The reward (:meth:`cast_rl.envs.core.ToolEnv.reward`) compares the database after the episode
with the database after the task's gold actions, and checks required outputs in the replies.
:func:`outcome_diff` redoes exactly that on forks of the pristine database: the episode's
executed tool calls (tool calls a tool message answered; proposals the critic rejected never
ran) and replies in order, then the gold replay, and lists the records and fields that differ.

The data directory comes from the run's ``config.json`` (the pipeline writes one in its run
directory, ``cast-rl eval`` in its output directory), resolved like the run resolved it
(:func:`cast_rl.envs.setup.data_dir_for`, ``eval.domains`` under ``eval.data_root``).  The
generated default is regenerated (deterministically, in a temporary directory) when the run's
copy is gone.  Without a config or data, :func:`resolve_data` says why in a note and the viewer
shows the note instead of a difference.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import tempfile
from pathlib import Path
from typing import Any

from cast_rl.config import ConfigError, load_config
from cast_rl.critique.context import MALFORMED, iter_actions, tool_history
from cast_rl.envs.core import DomainData, ToolEnv, fixed_clock, load_domain_data
from cast_rl.envs.db import to_hashable
from cast_rl.envs.setup import data_dir_for
from cast_rl.envs.types import RESPOND, Action

logger = logging.getLogger(__name__)

MAX_DIFF_ROWS = 200
"""Differing fields shown per episode; the rest are counted."""
_MISSING = object()


def find_config(root: Path, explicit: Path | None = None) -> Path | None:
    """``explicit``, else ``config.json`` in the run directory or the one above it."""
    if explicit is not None:
        return explicit
    for candidate in (root / "config.json", root.parent / "config.json"):
        if candidate.is_file():
            return candidate
    return None


def resolve_data(root: Path, config: Path | None, scratch: tempfile.TemporaryDirectory | None = None,
                 ) -> tuple[dict[str, DomainData], list[str]]:
    """domain -> data of the run at ``root``, and notes on what could not be resolved."""
    path = find_config(root, config)
    if path is None:
        return {}, [f"no config.json in {root} or its parent (pass --config): final databases are not "
                    "compared with the gold outcome"]
    try:
        cfg = load_config(path)
    except ConfigError as exc:
        return {}, [f"{path} does not load ({exc}): final databases are not compared with the gold outcome"]
    clock = fixed_clock(cfg.env.now) if cfg.env.now else None
    if cfg.eval.domains:
        dirs = {d: Path(cfg.eval.data_root) / d for d in cfg.eval.domains}
        dirs.setdefault(cfg.env.domain, Path(cfg.env.data_dir) if cfg.env.data_dir else None)
    else:
        dirs = {cfg.env.domain: Path(cfg.env.data_dir) if cfg.env.data_dir else None}
    data: dict[str, DomainData] = {}
    notes: list[str] = []
    for domain, directory in dirs.items():
        if directory is None:  # the generated default: where the run put it, else regenerated
            runs = [Path(cfg.run_dir), path.parent]
            existing = [r for r in runs if (r / "data").is_dir()]
            if existing:
                directory = data_dir_for(dataclasses.replace(cfg, run_dir=str(existing[0])))
            elif scratch is not None:
                directory = data_dir_for(dataclasses.replace(cfg, run_dir=scratch.name))
            else:
                notes.append(f"{domain}: the generated data is not beside the run; differences not shown")
                continue
        try:
            data[domain] = load_domain_data(domain, directory, clock=clock)
        except (FileNotFoundError, ValueError) as exc:
            notes.append(f"{domain}: data directory not usable ({exc}); final databases are not compared")
    return data, notes


def replayed_actions(messages: list[dict[str, Any]]) -> list[Action]:
    """The actions that ran, in order: answered tool calls and replies to the user."""
    # tool_history lists the tool calls in iter_actions' order, each with its output or None
    answered = iter(r.output is not None for r in tool_history(messages, len(messages)))
    out = []
    for action in iter_actions(messages):
        if action.is_reply:
            out.append(Action(name=RESPOND, kwargs=action.kwargs))
        elif next(answered) and action.name != MALFORMED:
            out.append(Action(name=action.name, kwargs=action.kwargs))
    return out


def outcome_diff(data: DomainData, record: dict[str, Any]) -> dict[str, Any]:
    """The episode's final database against the gold one (see the module docstring).

    Returns ``{"r_actions", "r_outputs", "missing_outputs", "rows": [{"table", "record", "field",
    "episode", "gold"}], "more": int, "gold_actions": [...]}``.
    """
    split, task_index = record.get("split", ""), record.get("task_index", -1)
    env = ToolEnv(data, split, task_index, max_steps=None)
    for action in replayed_actions(record.get("messages") or []):
        if env.done:
            break
        env.apply(action)
        if action.name in data.spec.terminate_tools and action.name in data.tool_map:
            break
    _, info = env.reward()
    gold = data.gold_db(split, task_index)
    rows = _differences(env.db, gold)
    return {
        "r_actions": info.get("r_actions"),
        "r_outputs": info.get("r_outputs"),
        "missing_outputs": [out for out, found in (info.get("outputs") or {}).items() if not found],
        "rows": rows[:MAX_DIFF_ROWS],
        "more": max(0, len(rows) - MAX_DIFF_ROWS),
        "gold_actions": [{"name": a.name, "kwargs": a.kwargs} for a in env.task.actions],
    }


def _differences(mine: Any, gold: Any) -> list[dict[str, str]]:
    rows: list[dict[str, str]] = []
    for table in sorted(set(mine) | set(gold)):
        a, b = mine.get(table, _MISSING), gold.get(table, _MISSING)
        if hasattr(a, "touched_keys") and hasattr(b, "touched_keys"):
            for key in sorted(a.touched_keys() | b.touched_keys()):
                rows += _record_rows(table, key, a.get(key, _MISSING), b.get(key, _MISSING))
        else:
            rows += _record_rows(table, "", a, b)
    return rows


def _record_rows(table: str, key: str, a: Any, b: Any) -> list[dict[str, str]]:
    if a is b or (a is not _MISSING and b is not _MISSING and _same(a, b)):
        return []
    if a is _MISSING or b is _MISSING:
        return [{"table": table, "record": key, "field": "",
                 "episode": "(absent)" if a is _MISSING else _show(a),
                 "gold": "(absent)" if b is _MISSING else _show(b)}]
    fa, fb = _flatten(a), _flatten(b)
    return [
        {"table": table, "record": key, "field": path,
         "episode": _show(fa[path]) if path in fa else "(absent)",
         "gold": _show(fb[path]) if path in fb else "(absent)"}
        for path in sorted(set(fa) | set(fb))
        if path not in fa or path not in fb or not _same(fa[path], fb[path])
    ]


def _flatten(value: Any, path: str = "") -> dict[str, Any]:
    """Dotted path (``items[2].price``) -> leaf; an empty object or list is a leaf."""
    if isinstance(value, dict) and value:
        items = ((f"{path}.{k}" if path else str(k), v) for k, v in value.items())
    elif isinstance(value, list) and value:
        items = ((f"{path}[{i}]", v) for i, v in enumerate(value))
    else:
        return {path: value}
    out: dict[str, Any] = {}
    for sub, item in items:
        out.update(_flatten(item, sub))
    return out


def _same(a: Any, b: Any) -> bool:
    # the reward's canonical form: 5 and 5.0 or a reordered list count as different
    return str(to_hashable(a)) == str(to_hashable(b))


def _show(value: Any, limit: int = 300) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"
