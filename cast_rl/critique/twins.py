"""Argument twins: a labelled write with one argument set to another value its tool allows.

A critic trained on the quickstart's labels learned "cancel is invalid" or, balanced per action,
"a cancel without a yes is invalid", and called every cancel with the wrong reason valid: the
valid and the invalid cancels differ in one argument the critic never had to read.  A *twin*
is the same request with one argument of the proposed write set to another value of that
argument's ``enum`` in the tool's schema (``reason``: "no longer needed" for "ordered by
mistake"), labelled by the privileged labeller like any action (the conversation, the gold
actions, the environment): a pair that differs only where the error is.  Stage ``critic_data``
adds the twins of the training split's writes to that split (``pipeline.critic_twins``); the
held-out split has none, so its metrics stay those of the policy's own actions.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from cast_rl.critique.labeller import Labeller
from cast_rl.envs.core import DomainData
from cast_rl.records import Trajectory


def enum_arguments(tools: list[dict[str, Any]]) -> dict[str, dict[str, list[Any]]]:
    """Tool name -> argument -> the values its schema's ``enum`` allows (two or more)."""
    out: dict[str, dict[str, list[Any]]] = {}
    for tool in tools:
        function = tool.get("function", tool)
        properties = (function.get("parameters") or {}).get("properties") or {}
        enums = {arg: list(spec["enum"]) for arg, spec in properties.items()
                 if isinstance(spec, dict) and len(spec.get("enum") or []) > 1}
        if enums:
            out[str(function.get("name"))] = enums
    return out


def twin_actions(action: dict[str, Any], enums: dict[str, dict[str, list[Any]]]) -> Iterator[dict[str, Any]]:
    """The action with one enum argument changed, for every argument and every other value."""
    kwargs = action.get("kwargs") or {}
    for arg, values in enums.get(str(action.get("name")), {}).items():
        if arg not in kwargs:
            continue
        for value in values:
            if value != kwargs[arg]:
                yield {"name": action["name"], "kwargs": {**kwargs, arg: value}}


def _call_message(action: dict[str, Any]) -> dict[str, Any]:
    arguments = json.dumps(action["kwargs"], ensure_ascii=False)
    return {"role": "assistant", "content": "", "tool_calls": [
        {"id": "twin", "type": "function", "function": {"name": action["name"], "arguments": arguments}}]}


def twin_labels(
    data: DomainData, trajectories: list[Trajectory], labels: list[dict[str, Any]],
) -> list[tuple[int, Trajectory, dict[str, Any]]]:
    """The twins of the writes in ``labels`` (dicts with ``trajectory_index``, ``message_index``
    and ``action``, indexing ``trajectories``): (position of the source in ``labels``, the twin's
    trajectory: the conversation up to the write, then the twin call, unexecuted, and the
    labeller's label of the twin call, with ``trajectory_index`` 0)."""
    enums = enum_arguments(data.tools)
    labeller = Labeller(data)
    out = []
    for position, label in enumerate(labels):
        if label["action"].get("name") not in data.spec.write_tools:
            continue
        source = trajectories[label["trajectory_index"]]
        index = label["message_index"]
        for action in twin_actions(label["action"], enums):
            twin = Trajectory(source.domain, source.split, source.task_index, source.trial, 0.0,
                              source.policy_version, messages=[*source.messages[:index], _call_message(action)])
            found = [lab for lab in labeller.label(twin) if lab.message_index == index]
            if found:
                out.append((position, twin, found[0].to_json()))
    return out
