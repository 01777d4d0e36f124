"""An episode between two steps, and the policy protocol that acts on it.

:class:`EpisodeState` is everything an episode in flight holds: its environment and user, the
policy playing it, the token conversation and what was recorded so far.  A :class:`Policy` takes
the policy's next turn from that state: a model (:class:`~cast_rl.rollout.policy.ModelPolicy`,
an inference engine behind the chat template) or a scripted policy that reads the episode's
messages (the gold-plan expert, the noisy teacher, a fixed script, a recorded trajectory's
replay).  The episode runner (:mod:`cast_rl.rollout.runner`) only ever asks a policy to act.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, runtime_checkable

from cast_rl.config.schema import CastConfig
from cast_rl.envs.core import DomainData, Episode
from cast_rl.inference.base import Completion, Sampling
from cast_rl.records import PolicyTurn, VerificationRound
from cast_rl.rollout.tokens import ConversationTokens


@dataclass(frozen=True)
class EpisodeSpec:
    """Which episode to run: a task of a split, and the trial number."""

    split: str
    task_index: int
    trial: int

    @property
    def key(self) -> tuple[str, int, int]:
        return (self.split, self.task_index, self.trial)


@runtime_checkable
class Policy(Protocol):
    """Who plays the policy's turns of an episode.

    :meth:`act` returns the next turn as the policy's token ids (with the model's logprobs, or
    zeros for a turn no model sampled); a scripted policy writes text, which
    :meth:`~cast_rl.rollout.tokens.ConversationTokens.encode_turn` turns into the policy
    tokenizer's canonical ids.  The runner binds one policy per episode (:meth:`for_episode`),
    copies it with the episode's state (:meth:`fork`, for branches), and lets it set the run's
    limits (:meth:`limits`).  A policy that keeps no per-episode state and sets no limits
    subclasses this protocol and inherits those three.
    """

    tokenizer: Any
    """The policy model's tokenizer: the conversation's token ids are written with it."""

    async def act(self, state: EpisodeState, sampling: Sampling) -> Completion:
        """The next policy turn at ``state`` (a decision point), sampled with ``sampling``."""
        ...

    def for_episode(self, data: DomainData, spec: EpisodeSpec) -> Policy:
        """The policy that plays the episode ``spec`` (itself, or one made for its task)."""
        return self

    def fork(self) -> Policy:
        """A copy with its own progress (itself when it keeps none)."""
        return self

    def limits(self, cfg: CastConfig) -> CastConfig:
        """``cfg`` with the step and context limits that bind this policy."""
        return cfg


@dataclass
class EpisodeState:
    """An episode between two steps: the environment and user, the policy, the token
    conversation and everything recorded so far.  At a decision point (``on_decision`` of
    :meth:`~cast_rl.rollout.runner.EpisodeRunner.run`) it is the exact state before the policy's
    next turn; :meth:`fork` copies it in microseconds (copy-on-write database, copied user state)
    so that any number of continuations can start there."""

    spec: EpisodeSpec
    episode: Episode
    policy: Policy
    conv: ConversationTokens
    sampling: Sampling
    versions: set[int]
    rounds: list[VerificationRound] = field(default_factory=list)
    turns: list[PolicyTurn] = field(default_factory=list)
    steps: int = 0
    """Actions taken (tool calls, messages to the user, malformed turns)."""
    round_index: int = 0
    """Critique rounds spent on the pending decision."""
    reward: float = 0.0
    termination: str = "max_steps"
    started: float = field(default_factory=time.perf_counter)

    @property
    def message_index(self) -> int:
        """Index the policy's next message will have."""
        return len(self.conv.messages)

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The episode's messages so far (real identifiers)."""
        return self.conv.messages

    def fork(self) -> EpisodeState:
        """An independent copy: steps on either side are invisible to the other."""
        return replace(
            self, episode=self.episode.fork(), policy=self.policy.fork(),
            conv=self.conv.fork(), versions=set(self.versions),
            rounds=[replace(r) for r in self.rounds], turns=[replace(t) for t in self.turns],
        )
