"""The learner's unit of data: one token sequence with its loss mask, advantage and provenance.

A :class:`Sample` is what the replay buffer stores (one JSON object per line in its log) and what
the learner trains on.  Rollout trajectories become samples through
:mod:`cast_rl.learner.critique_samples`.

Shapes: ``token_ids``, ``loss_mask`` and ``logprobs`` have one entry per token.  ``loss_mask`` is
1 on tokens that carry loss (tokens the policy generated, or the target tokens of a supervised
example) and 0 elsewhere; ``logprobs`` holds the behaviour policy's log-probability of each
policy token (0.0 elsewhere, and 0.0 everywhere for supervised samples).  ``advantage`` is the
sequence's outcome advantage (every outcome estimator we allow gives one value per sequence);
``span_advantages`` overrides it on the token ranges of turns that have their own credit.
A critic's training example may mark, in ``verdict_mask``, the loss tokens of its answer's verdict
lines (``pipeline.critic_loss=two_term`` weighs them apart from the rest of the answer).

This module does not import torch: the replay buffer and its Ray actor stay light.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

SOURCES = ("outcome_groups", "revision", "supervised", "step_groups")
"""Where a sample came from; ``supervised`` samples take the cross-entropy loss, the rest the
policy loss."""


@dataclass
class Sample:
    """One training sequence."""

    key: str
    """Unique identity; the replay buffer ignores a second add with the same key."""
    source: str
    """outcome_groups, revision or supervised (see :data:`SOURCES`)."""
    token_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    advantage: float = 0.0
    """Per-sequence advantage (policy samples); 0 for supervised samples."""
    reward: float = 0.0
    """The reward the advantage was computed from (for metrics)."""
    policy_version: int = 0
    """Version of the policy that generated the sequence (the oldest, if weights changed
    mid-episode); supervised data from files has the version at which it was loaded."""
    group: str = ""
    """Advantage group (GRPO: all trials of one task in one collection)."""
    critique_changed: bool = False
    """A critique made the policy revise somewhere in this sequence (priority sampling)."""
    span_advantages: list[list[float]] = field(default_factory=list)
    """``[start, end, value]`` token ranges whose advantage is ``value`` instead of
    ``advantage`` (turn-level credit: a turn the critic judged, a rejected proposal)."""
    info: dict[str, Any] = field(default_factory=dict)
    verdict_mask: list[int] = field(default_factory=list)
    """Supervised critic examples: 1 on the loss tokens of the answer's VERDICT and ERROR lines, 0
    elsewhere (the rest of the loss tokens are its explanation); empty: no marking."""

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise ValueError(f"sample source={self.source!r} is not allowed; choose one of {SOURCES}")
        n = len(self.token_ids)
        if len(self.loss_mask) != n or len(self.logprobs) != n:
            raise ValueError(
                f"sample {self.key!r}: token_ids has {n} entries, loss_mask "
                f"{len(self.loss_mask)}, logprobs {len(self.logprobs)}; they must match"
            )
        if self.verdict_mask:
            if self.is_policy:
                raise ValueError(f"sample {self.key!r}: a verdict_mask is for supervised critic examples, not "
                                 f"source={self.source!r}")
            if len(self.verdict_mask) != n or any(v not in (0, 1) or v > m for v, m in zip(self.verdict_mask, self.loss_mask)):
                raise ValueError(f"sample {self.key!r}: verdict_mask must hold {n} entries of 0 or 1, 1 only where "
                                 "loss_mask is 1")

    @property
    def is_policy(self) -> bool:
        """True when the sample takes the policy-gradient loss (not the supervised one)."""
        return self.source != "supervised"

    @property
    def num_loss_tokens(self) -> int:
        return sum(self.loss_mask)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Sample:
        return cls(**obj)
