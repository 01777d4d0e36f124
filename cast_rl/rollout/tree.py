"""Tree rollouts: an episode, then more continuations from chosen decision points of it.

A decision point is the exact state before a policy turn (:class:`~cast_rl.rollout.episode.EpisodeState`,
kept by ``on_decision`` as a fork); each continuation plays a fork of it to the end with a
sampling seed of its own, so a stochastic policy explores from the very state the root was in.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Callable
from functools import partial
from typing import Protocol

from cast_rl.config.schema import CastConfig
from cast_rl.envs.core import DomainData
from cast_rl.envs.types import Action
from cast_rl.records import Trajectory, TreeNode
from cast_rl.rollout.episode import EpisodeSpec, EpisodeState


class Continues(Protocol):
    """What a tree rollout needs of the episode runner."""

    cfg: CastConfig
    data: DomainData

    async def run(self, spec: EpisodeSpec, on_decision: Callable[[EpisodeState], None] | None = None) -> Trajectory: ...

    async def continue_from(
        self, state: EpisodeState, action: Action | None = None, seed: int | None = None,
        on_decision: Callable[[EpisodeState], None] | None = None,
    ) -> Trajectory: ...


async def run_tree(runner: Continues, spec: EpisodeSpec, branches: int, points: str) -> list[Trajectory]:
    """An episode and ``branches - 1`` more continuations from each of its decision points
    named by ``points`` (writes, flagged, all: see :func:`tree_points`), root first.

    Each episode's :attr:`~cast_rl.records.Trajectory.tree` says where it sits: the root's
    lists the points; each continuation's names its ``point``, ``branch`` (1..K-1) and
    ``env_steps`` (actions after the point: what it cost beyond the shared prefix).  Continuations sample with seeds of their own, so a stochastic policy
    explores from the very state the root was in.
    """
    snapshots: dict[int, EpisodeState] = {}
    root = await runner.run(spec, on_decision=partial(_keep_first, snapshots))
    chosen = [p for p in tree_points(root, points, runner.data.spec.write_tools) if p in snapshots]
    root.tree = TreeNode(env_steps=root.env_steps, points=chosen)

    async def grow(point: int, branch: int) -> Trajectory:
        seed = zlib.crc32(repr(("tree", runner.cfg.seed, spec.key, point, branch)).encode()) & 0x7FFFFFFF
        state = snapshots[point]
        traj = await runner.continue_from(state, seed=seed)
        traj.tree = TreeNode(env_steps=traj.env_steps - state.steps, point=point, branch=branch)
        return traj

    grown = await asyncio.gather(*(grow(p, b) for p in chosen for b in range(1, branches)))
    return [root, *grown]


def _keep_first(snapshots: dict[int, EpisodeState], state: EpisodeState) -> None:
    if state.message_index not in snapshots:
        snapshots[state.message_index] = state.fork()


def tree_points(traj: Trajectory, points: str, write_tools: frozenset[str] | set[str]) -> list[int]:
    """Message indices of the decision points to branch from: before each write that ran
    (``writes``), before each decision whose first proposal the critic rejected (``flagged``),
    or before every turn that ran (``all``)."""
    turns = traj.turns
    if points == "writes":
        return [t.message_index for t in turns if t.executed and t.action and t.action["name"] in write_tools]
    if points == "flagged":
        out, previous_rejected = [], False
        for t in turns:
            if not t.executed and not previous_rejected:
                out.append(t.message_index)
            previous_rejected = not t.executed
        return out
    if points == "all":
        return [t.message_index for t in turns if t.executed]
    raise ValueError(f"tree points {points!r} is not allowed; choose writes, flagged or all")
