"""The trajectory record: one episode, as JSON Lines on disk and as the learner's input.

One line per episode::

    {"domain": "retail", "split": "test", "task_index": 3, "trial": 0,
     "reward": 1.0, "policy_version": 4,
     "messages": [...],             # OpenAI-style: system, user, assistant (tool_calls), tool
     "verification_rounds": [...],  # critic-in-the-loop rounds, see VerificationRound
     "turns": [...],                # per assistant message: token span, action, verdict (PolicyTurn)
     "token_ids": [...], "loss_mask": [...], "logprobs": [...],
     "tree": null,                  # tree rollouts only: points / point, branch, env_steps (TreeNode)
     "info": {...}}                 # termination, policy versions, token consistency, timing

``turns``, ``verification_rounds`` and ``tree`` are :class:`PolicyTurn`, :class:`VerificationRound`
and :class:`TreeNode` records in memory and plain objects on disk (``dataclasses.asdict``); :meth:`Trajectory.from_json`
and ``Trajectory(...)`` turn objects back into records and name a line's unknown or missing
fields.  Counts are read from the turns, not kept twice: :attr:`Trajectory.policy_tokens`,
``prompt_tokens``, ``malformed_calls``, ``extra_calls_dropped``, ``env_steps`` (with ``jq``:
``[.turns[] | .end - .start] | add`` is the generated tokens of a line without substitutions).
Lines written before turns were recorded load; their counts then come from ``info``.

Shapes: ``token_ids``, ``loss_mask`` and ``logprobs`` have one entry per token of the whole
conversation as rendered by the policy's chat template.  ``loss_mask`` is 1 exactly on tokens
the policy generated (including each turn's end-of-turn token) and 0 on system, user, tool and
critic tokens; ``logprobs`` holds the engine's log-probability for policy tokens and 0.0
elsewhere.  A critique shown to the policy is a ``user`` message with ``"name": "critic"``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import MISSING, asdict, dataclass, field
from pathlib import Path
from typing import Any

from cast_rl.jsonl import iter_jsonl

CRITIC_NAME = "critic"


class TrajectoryFormatError(ValueError):
    """A trajectory line that does not follow the format; names the file and line."""


@dataclass
class VerificationRound:
    """One critique of a proposed action before it ran."""

    message_index: int
    """Index in ``messages`` of the proposal (an assistant message)."""
    proposal: dict[str, Any]
    """The proposed action ``{"name", "kwargs"}`` (``respond`` for a message to the user)."""
    critique: dict[str, Any]
    """The critic's answer in the rationale schema (verdict, error_type, explanation, ...)."""
    revision: dict[str, Any] | None = None
    """The action the policy proposed next, or None when the budget ran out."""


@dataclass
class PolicyTurn:
    """One assistant message as the runner saw it: its tokens, its action and the critic's word.

    Written by the runner while the episode runs, so readers (labeller, learner, viewer) take
    spans and actions from here instead of re-parsing text or guessing turns from the mask.
    """

    message_index: int
    """Index in ``messages`` of the assistant message."""
    start: int
    """First token of the policy's generated ids for this turn in ``token_ids``."""
    end: int
    """One past the last generated id (the end-of-turn token included when generated)."""
    action: dict[str, Any] | None
    """The parsed action ``{"name", "kwargs"}``; None for a malformed turn."""
    error: str | None = None
    """The error observation a malformed turn got."""
    verdict: str | None = None
    """The critic's verdict on this proposal (valid, invalid, unparsable); None if unchecked."""
    error_type: str | None = None
    """The critic's error type when it judged the proposal."""
    executed: bool = True
    """False when the critic rejected the proposal (it never ran; a revision follows)."""
    substituted: bool = False
    """True for an action put in the policy's place by a counterfactual branch
    (:meth:`~cast_rl.rollout.runner.EpisodeRunner.continue_from`): its tokens carry loss mask 0
    and no logprobs, and it ran unchecked."""
    prompt_tokens: int = 0
    """Length of the prompt this turn was generated from."""
    dropped_calls: int = 0
    """Well-formed tool calls the turn wrote after its first, which do not run (the source
    environments run one call per turn)."""


@dataclass
class TreeNode:
    """Where a trajectory sits in a tree rollout (step-level GRPO,
    :func:`~cast_rl.rollout.tree.run_tree`): the root lists the decision points branched from;
    a continuation names its point and branch."""

    env_steps: int
    """Environment steps this episode cost: the root all of its own, a continuation only the
    actions after its branch point (the prefix is the root's)."""
    points: list[int] | None = None
    """The root's decision points (message indices) that continuations start from."""
    point: int | None = None
    """A continuation's branch point: the message index of the state it was forked from."""
    branch: int = 0
    """A continuation's number at its point (1..K-1); 0 for the root."""

    @property
    def is_continuation(self) -> bool:
        return self.point is not None


@dataclass(frozen=True)
class EpisodeSummary:
    """What a driver keeps of an episode whose trajectory went elsewhere (the replay buffer
    receives a collection from the rollout workers by reference): the unit, its outcome and
    what it cost, enough for the loop's collection metrics."""

    domain: str
    split: str
    task_index: int
    trial: int
    reward: float
    env_steps: int
    """:attr:`Trajectory.cost_steps`."""
    critique_rounds: int
    continuation: bool
    """A tree continuation (its unit is its root's)."""


@dataclass
class Trajectory:
    """One episode with its outcome and exact token bookkeeping."""

    domain: str
    split: str
    task_index: int
    trial: int
    reward: float
    policy_version: int
    messages: list[dict[str, Any]]
    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    verification_rounds: list[VerificationRound] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    turns: list[PolicyTurn] = field(default_factory=list)
    """One :class:`PolicyTurn` per assistant message, in order; empty in files written before
    turns were recorded (readers then fall back where they can)."""
    tree: TreeNode | None = None
    """Set on the episodes of a tree rollout; None for a plain episode."""

    def __post_init__(self) -> None:
        if self.tree is not None:
            self.tree = _record(TreeNode, self.tree, "tree")
        self.verification_rounds = [_record(VerificationRound, r, f"verification_rounds[{i}]")
                                    for i, r in enumerate(self.verification_rounds)]
        self.turns = [_record(PolicyTurn, t, f"turns[{i}]") for i, t in enumerate(self.turns)]

    def _count(self, key: str, per_turn: Callable[[PolicyTurn], int]) -> int:
        if not self.turns:  # written before turns were recorded
            return int(self.info.get(key, 0))
        return sum(per_turn(t) for t in self.turns)

    @property
    def policy_tokens(self) -> int:
        """Tokens the policy generated (substituted turns are not its own)."""
        return self._count("policy_tokens", lambda t: 0 if t.substituted else t.end - t.start)

    @property
    def prompt_tokens(self) -> int:
        """Prompt tokens over the policy's generations (what the engine prefilled or cached)."""
        return self._count("prompt_tokens", lambda t: t.prompt_tokens)

    @property
    def malformed_calls(self) -> int:
        """Turns that got an error observation instead of running."""
        return self._count("malformed_calls", lambda t: t.error is not None)

    @property
    def extra_calls_dropped(self) -> int:
        return self._count("extra_calls_dropped", lambda t: t.dropped_calls)

    @property
    def env_steps(self) -> int:
        """Actions the episode took (tool calls, replies, malformed turns; not the proposals the
        critic rejected): its environment steps.  0 for lines written before turns were recorded."""
        return sum(1 for t in self.turns if t.executed)

    @property
    def cost_steps(self) -> int:
        """Environment steps collecting this episode cost: :attr:`env_steps`, or for a tree
        continuation only those after its branch point (the x axis that compares tree and
        plain collection)."""
        return self.tree.env_steps if self.tree is not None else self.env_steps

    @property
    def continuation(self) -> bool:
        """A tree continuation (its unit is its root's), as :attr:`EpisodeSummary.continuation`."""
        return self.tree is not None and self.tree.is_continuation

    def summary(self) -> EpisodeSummary:
        return EpisodeSummary(self.domain, self.split, self.task_index, self.trial, float(self.reward),
                              self.cost_steps, len(self.verification_rounds),
                              self.continuation)

    @property
    def key(self) -> tuple[str, str, int, int]:
        """Identity of the episode: (domain, split, task_index, trial)."""
        return (self.domain, self.split, self.task_index, self.trial)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: Any) -> Trajectory:
        """Validate and build; raises ``ValueError`` saying what is wrong."""
        if not isinstance(obj, dict):
            raise ValueError("a trajectory line must be a JSON object")
        missing = [k for k in _REQUIRED if k not in obj]
        if missing:
            raise ValueError(f"missing keys: {', '.join(missing)}")
        unknown = sorted(set(obj) - set(_FIELDS))
        if unknown:
            raise ValueError(f"unknown keys: {', '.join(unknown)}")
        for key, types in _TYPES.items():
            if key in obj and not isinstance(obj[key], types):
                raise ValueError(f"{key} must be {_type_names(types)}, got {type(obj[key]).__name__}")
        for i, message in enumerate(obj["messages"]):
            if not isinstance(message, dict) or message.get("role") not in _ROLES:
                raise ValueError(f"messages[{i}] must be an object with role in {sorted(_ROLES)}")
        n = len(obj.get("token_ids", []))
        for key in ("loss_mask", "logprobs"):
            if len(obj.get(key, [])) != n:
                raise ValueError(f"{key} has {len(obj.get(key, []))} entries, token_ids has {n}")
        if any(m not in (0, 1) for m in obj.get("loss_mask", [])):
            raise ValueError("loss_mask entries must be 0 or 1")
        return cls(**obj)


_FIELDS = tuple(Trajectory.__dataclass_fields__)
_REQUIRED = ("domain", "split", "task_index", "trial", "reward", "policy_version", "messages")
_ROLES = {"system", "user", "assistant", "tool"}
_TYPES: dict[str, tuple[type, ...]] = {
    "domain": (str,),
    "split": (str,),
    "task_index": (int,),
    "trial": (int,),
    "reward": (int, float),
    "policy_version": (int,),
    "messages": (list,),
    "token_ids": (list,),
    "loss_mask": (list,),
    "logprobs": (list,),
    "verification_rounds": (list,),
    "info": (dict,),
    "turns": (list,),
    "tree": (dict, type(None)),
}


def _record(cls: type, obj: Any, where: str) -> Any:
    """``obj`` as a ``cls`` record: kept when it is one, built when it is its JSON object."""
    if isinstance(obj, cls):
        return obj
    if not isinstance(obj, dict):
        raise ValueError(f"{where} must be an object, got {type(obj).__name__}")
    fields = cls.__dataclass_fields__
    unknown = sorted(set(obj) - set(fields))
    if unknown:
        raise ValueError(f"{where}: unknown keys: {', '.join(unknown)}")
    missing = [k for k, f in fields.items() if k not in obj and f.default is MISSING and f.default_factory is MISSING]
    if missing:
        raise ValueError(f"{where}: missing keys: {', '.join(missing)}")
    return cls(**obj)


def _type_names(types: tuple[type, ...]) -> str:
    return " or ".join(t.__name__ for t in types)


def write_trajectories(path: str | Path, trajectories: Iterable[Trajectory], append: bool = False) -> int:
    """Write JSON Lines; returns how many were written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with path.open("a" if append else "w") as f:
        for traj in trajectories:
            f.write(json.dumps(traj.to_json(), ensure_ascii=False) + "\n")
            n += 1
    return n


def iter_numbered(path: str | Path) -> Iterator[tuple[int, Trajectory]]:
    """(line number, trajectory) of a JSON Lines file; a malformed line raises
    :class:`TrajectoryFormatError` naming the file and the line."""
    return iter_jsonl(path, Trajectory.from_json, what="a trajectory", error=TrajectoryFormatError)


def iter_trajectories(path: str | Path) -> Iterator[Trajectory]:
    """Read JSON Lines (see :func:`iter_numbered`)."""
    return (traj for _, traj in iter_numbered(path))


def read_trajectories(path: str | Path) -> list[Trajectory]:
    return list(iter_trajectories(path))
