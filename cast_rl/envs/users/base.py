"""The user-simulator protocol: what an episode needs from a simulated customer."""

from __future__ import annotations

from typing import Protocol

from cast_rl.envs.db import Database
from cast_rl.envs.types import Task


class UserSimulator(Protocol):
    """A simulated customer: ``reset`` gives the first message, ``step`` answers the agent."""

    async def reset(self, task: Task, db: Database) -> str: ...

    async def step(self, agent_message: str) -> str: ...

    def fork(self) -> UserSimulator:
        """An independent copy of the user's state (counterfactual branches start from it)."""
        ...
