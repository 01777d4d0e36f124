"""Replay: the state at a decision point of a recorded trajectory, reached by playing it again.

:func:`replay` resets the trajectory's episode and feeds its recorded policy turns (their exact
token ids, :class:`RecordedPolicy`) and critiques back through the loop that ran it, so tools, the
user and the token bookkeeping act as they did, up to the decision point asked for: the slow way
to the state that a snapshot's :meth:`~cast_rl.rollout.episode.EpisodeState.fork` gives at once.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, Protocol

from cast_rl.critique.verifier import Critique
from cast_rl.envs.core import DomainData
from cast_rl.inference.base import Completion, Sampling
from cast_rl.records import Trajectory
from cast_rl.rollout.episode import EpisodeSpec, EpisodeState, Policy


class ReplayDiverged(RuntimeError):
    """A replayed prefix did not reproduce the recorded episode."""


class _Reached(Exception):
    """The replay reached its decision point."""


class Replays(Protocol):
    """What a replay needs of the episode runner."""

    data: DomainData
    policy: Policy
    budget: int

    def with_policy(self, policy: Policy, verifier: Any) -> Replays: ...

    def new_state(self, spec: EpisodeSpec) -> EpisodeState: ...

    async def _advance(
        self, state: EpisodeState, on_decision: Callable[[EpisodeState], None] | None = None, reset: bool = False,
    ) -> None: ...


async def replay(runner: Replays, traj: Trajectory, message_index: int) -> EpisodeState:
    """Reset ``traj``'s episode and replay its recorded prefix up to the decision point that
    produced ``messages[message_index]`` (an assistant message), with ``runner``'s user and
    limits; the state returned continues with ``runner``'s policy.

    Raises :class:`ReplayDiverged` when the environment or the user answers otherwise (a user
    that is not deterministic for the episode's seed).  A stateful per-episode policy (the
    gold-plan expert) starts fresh.
    """
    if not (0 < message_index < len(traj.messages)) or traj.messages[message_index]["role"] != "assistant":
        raise ValueError(f"message_index={message_index} is not an assistant message of the trajectory")
    if not traj.turns:
        raise ValueError("the trajectory has no recorded turns (written before turns were recorded); "
                         "it cannot be replayed")
    spec = EpisodeSpec(traj.split, traj.task_index, traj.trial)
    recorded = RecordedPolicy(traj, runner.policy.tokenizer)
    sibling = runner.with_policy(recorded, recorded if recorded.checked else None)
    if recorded.checked:  # every recorded critique is served, an unchecked turn stays so
        sibling.budget = 1 << 30
    state = sibling.new_state(spec)
    reached: list[EpisodeState] = []

    def stop_at(s: EpisodeState) -> None:
        if len(s.conv.messages) == message_index:
            reached.append(s)
            raise _Reached

    with contextlib.suppress(_Reached):
        await sibling._advance(state, stop_at, reset=True)
    if not reached:
        raise ReplayDiverged(f"episode {spec.key}: the replay ended ({state.termination}) before message {message_index}")
    if state.conv.messages != traj.messages[:message_index]:
        first = next(i for i, (a, b) in enumerate(zip(state.conv.messages, traj.messages)) if a != b)
        raise ReplayDiverged(f"episode {spec.key}: message {first} differs on replay "
                             f"({state.conv.messages[first]!r} != {traj.messages[first]!r})")
    state.policy = runner.policy.for_episode(runner.data, spec)
    return state


class RecordedPolicy(Policy):
    """Policy and verifier in one: answers a replay with a trajectory's recorded turns and
    critiques, turn by turn (see :func:`replay`)."""

    def __init__(self, traj: Trajectory, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._traj = traj
        self._turns = traj.turns
        self._rejections = iter(r.critique for r in traj.verification_rounds)
        self._next = 0
        self.checked = any(t.verdict is not None for t in self._turns)

    async def act(self, state: EpisodeState, sampling: Sampling) -> Completion:
        if self._next >= len(self._turns):
            raise ReplayDiverged("the replay asked for more policy turns than were recorded")
        t = self._turns[self._next]
        self._next += 1
        return Completion(text="", token_ids=self._traj.token_ids[t.start:t.end],
                          logprobs=self._traj.logprobs[t.start:t.end])

    async def verify(self, requests: list[Any]) -> list[Any]:
        """The recorded critique of the turn just served; a turn the critic never saw gets a
        verdict of None, which the runner treats as unchecked."""
        t = self._turns[self._next - 1]
        if t.verdict is None:
            return [Critique(verdict=None, error_type=None)]  # type: ignore[arg-type]
        if t.executed:
            return [Critique(verdict=t.verdict, error_type=t.error_type or "none")]
        return [Critique(**next(self._rejections))]
