"""Replay gold or given action sequences through a domain and record what they do.

Run::

    cast-rl env replay [CONFIG] env.domain=retail env.data_dir=../shared/benchmarks/retail \
        env.split=test [env.now=2024-05-15T15:00:00] [--actions-file actions.jsonl] --out replay.jsonl

Without ``--actions-file`` every task of ``env.split`` replays its gold actions.  With it, each
input line ``{"split", "task_index", "actions": [{"name", "kwargs"}, ...]}`` is replayed instead
(a line without ``split`` uses ``env.split``).  Each output line is ``{"split", "task_index",
"observations", "final_state_hash", "reward"}``.

Semantics, following the source's episode loop:

* actions run in order on a fresh fork; a ``respond`` action has no user here, so its observation
  is ``""``; the replay stops after a terminate tool (whose observation is included);
* there is no ``max_steps`` cut-off: every given action runs.  The source's own reward replays
  gold actions without counting steps, and gold sequences are the main input (the longest has 29
  actions, under the agent loop's 30, so for them both choices agree);
* ``final_state_hash`` is sha256 of ``json.dumps(state, sort_keys=True)`` over the database keyed
  by file stem (:meth:`Database.state_hash`);
* ``reward`` is the source's reward if the agent's replies contained every required output,
  i.e. the database check alone.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cast_rl.envs.core import DomainData, ToolEnv
from cast_rl.envs.types import Action
from cast_rl.jsonl import iter_jsonl

logger = logging.getLogger(__name__)


class ReplayInputError(ValueError):
    """A malformed actions file: the message names the file and the line."""


def replay(data: DomainData, split: str, task_index: int, actions: list[Action]) -> dict[str, Any]:
    """Replay one action sequence; the output record of the ``replay`` command."""
    env = ToolEnv(data, split, task_index, max_steps=None)
    observations: list[str] = []
    for action in actions:
        result = env.step(action)
        observations.append(result.observation)
        if result.done:
            break
    reward, _ = env.reward(check_outputs=False)
    return {
        "split": split,
        "task_index": task_index,
        "observations": observations,
        "final_state_hash": env.state_hash(),
        "reward": reward,
    }


def read_actions_file(
    path: Path, data: DomainData, default_split: str
) -> Iterator[tuple[str, int, list[Action]]]:
    """(split, task_index, actions) per line; a malformed line raises :class:`ReplayInputError`."""
    for number, obj in iter_jsonl(path, what="valid JSON", error=ReplayInputError):
        yield _parse_line(obj, f"{path}:{number}", data, default_split)


def _parse_line(
    obj: Any, where: str, data: DomainData, default_split: str
) -> tuple[str, int, list[Action]]:
    if not isinstance(obj, dict):
        raise ReplayInputError(f'{where}: expected an object {{"split", "task_index", "actions"}}')
    split = obj.get("split", default_split)
    index = obj.get("task_index")
    if not isinstance(split, str):
        raise ReplayInputError(f"{where}: split must be a string, got {split!r}")
    if split not in data.splits:
        raise ReplayInputError(
            f"{where}: unknown split {split!r}; available: {', '.join(data.splits)}"
        )
    count = len(data.tasks(split))
    if type(index) is not int or not 0 <= index < count:
        raise ReplayInputError(
            f"{where}: task_index must be an integer in 0..{count - 1} for split {split!r}, "
            f"got {index!r}"
        )
    raw_actions = obj.get("actions")
    if not isinstance(raw_actions, list):
        raise ReplayInputError(f'{where}: actions must be a list of {{"name", "kwargs"}}')
    actions = []
    for position, raw in enumerate(raw_actions):
        if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
            raise ReplayInputError(
                f"{where}: actions[{position}] must be an object with a string name"
            )
        # kwargs are kept as given: a non-object becomes an error observation, like a model's.
        actions.append(Action(name=raw["name"], kwargs=raw.get("kwargs", {})))
    return split, index, actions

