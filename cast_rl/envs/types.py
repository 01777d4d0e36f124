"""Plain data types of the environment layer: actions, tasks, step results."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

RESPOND = "respond"
"""Action name of a message to the user (``kwargs={"content": ...}``), as in the source."""
STOP_TOKEN = "###STOP###"
"""The user simulator's end-of-conversation marker."""
SUCCESS_TOLERANCE = 1e-6
"""A reward within this distance of 1 (inclusive) is a success."""


def is_success(reward: float) -> bool:
    """Whether a trial's reward counts as a success (within 1e-6 of 1, bounds included)."""
    return 1.0 - SUCCESS_TOLERANCE <= reward <= 1.0 + SUCCESS_TOLERANCE


def confirmation_text(name: str, kwargs: dict[str, Any]) -> str:
    """How the expert asks the user to confirm a write, every argument listed (verified blame
    proposes the same alternative)."""
    details = json.dumps(kwargs, ensure_ascii=False)
    return f"I will call {name} with {details}. Do you confirm (yes/no)?"


@dataclass(frozen=True)
class Action:
    """One agent action: a tool call or, with name ``respond``, a message to the user."""

    name: str
    kwargs: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "kwargs": self.kwargs}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Action:
        return cls(name=obj["name"], kwargs=dict(obj.get("kwargs", {})))


@dataclass(frozen=True)
class Task:
    """A task as in the source: the user's identity and instruction, gold actions and outputs."""

    user_id: str
    instruction: str
    actions: tuple[Action, ...]
    outputs: tuple[str, ...] = ()
    annotator: str = ""

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Task:
        return cls(
            user_id=obj["user_id"],
            instruction=obj["instruction"],
            actions=tuple(Action.from_json(a) for a in obj["actions"]),
            outputs=tuple(obj.get("outputs", ())),
            annotator=str(obj.get("annotator", "")),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "annotator": self.annotator,
            "user_id": self.user_id,
            "instruction": self.instruction,
            "actions": [a.to_json() for a in self.actions],
            "outputs": list(self.outputs),
        }


@dataclass
class StepResult:
    """What ``step`` returns: the observation for the agent, reward (set when done), done, info."""

    observation: str
    reward: float = 0.0
    done: bool = False
    info: dict[str, Any] = field(default_factory=dict)
