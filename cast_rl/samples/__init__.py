"""The learner's unit of data: one token sequence with its loss mask, advantage and provenance.

A :class:`Sample` is what the replay buffer stores (one JSON object per line in its log) and what
the learner trains on.  Rollout trajectories become samples through
:mod:`cast_rl.samples.builders`.

Shapes: ``token_ids``, ``loss_mask`` and ``logprobs`` have one entry per token.  ``loss_mask`` is
1 on tokens that carry loss (tokens the policy generated, or the target tokens of a supervised
example) and 0 elsewhere; ``logprobs`` holds the behaviour policy's log-probability of each
policy token (0.0 elsewhere, and 0.0 everywhere for supervised samples).  ``advantage`` is the
sequence's outcome advantage (every outcome estimator we allow gives one value per sequence);
``span_advantages`` overrides it on the token ranges of turns that have their own credit.
A critic's training example may mark, in ``verdict_mask``, the loss tokens of its answer's verdict
lines (``pipeline.critic_loss=two_term`` weighs them apart from the rest of the answer).

A sample cut from a trajectory says so in its :class:`Origin` (set by the builder that cut it):
which of the builder's trajectories, and where its logprobs come from.  The replay buffer logs
such a sample as a reference into its trajectory instead of repeating its tokens.

Also here, because both the learner and the replay buffer's Ray actor use them on batches of
samples: :func:`shard` (data-parallel split) and :func:`batch_metrics`.

This module imports nothing of cast_rl and no torch: the replay buffer and its Ray actor stay
light, and every layer can read samples.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

SOURCES = ("outcome_groups", "revision", "supervised", "step_groups")
"""Where a sample came from; ``supervised`` samples take the cross-entropy loss, the rest the
policy loss."""

LogprobMode = Literal["trajectory", "masked", "zero"]
LOGPROB_MODES: tuple[LogprobMode, ...] = ("trajectory", "masked", "zero")
"""How a sample's logprobs follow from its source trajectory's: the same (``trajectory``), the
trajectory's where the sample's loss mask is 1 and 0.0 elsewhere (``masked``), or all 0.0
(``zero``: supervised samples carry no behaviour logprobs)."""


@dataclass(frozen=True)
class Origin:
    """Where a sample was cut from: its token ids are the first ``len(sample.token_ids)`` tokens
    of one trajectory, and its logprobs follow from that trajectory's by ``logprobs``."""

    trajectory: int
    """Position of the source in the trajectories the builder was given: the same list the
    caller hands to :meth:`cast_rl.replay.ReplayBuffer.add` beside the samples."""
    logprobs: LogprobMode
    """See :data:`LOGPROB_MODES`."""

    def __post_init__(self) -> None:
        if self.logprobs not in LOGPROB_MODES:
            raise ValueError(f"origin logprobs={self.logprobs!r} is not allowed; choose one of {LOGPROB_MODES}")
        if self.trajectory < 0:
            raise ValueError(f"origin trajectory={self.trajectory} must be a position (>= 0)")


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
    origin: Origin | None = field(default=None, compare=False)
    """The trajectory this sample was cut from (None: not cut from one, e.g. supervised data from
    files, or a sample whose tokens are not a prefix of its trajectory's).  It points into the
    list of trajectories given with the sample, so it is not part of :meth:`to_json` (the replay
    log keeps a ``ref`` with the trajectory file's offset instead) nor of equality."""

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
        if isinstance(self.origin, dict):
            self.origin = Origin(**self.origin)

    @property
    def is_policy(self) -> bool:
        """True when the sample takes the policy-gradient loss (not the supervised one)."""
        return self.source != "supervised"

    @property
    def num_loss_tokens(self) -> int:
        return sum(self.loss_mask)

    def to_json(self) -> dict[str, Any]:
        """The sample's data as a JSON object (without :attr:`origin`, see there)."""
        out = asdict(self)
        del out["origin"]
        return out

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Sample:
        return cls(**obj)


def shard(samples: Sequence[Sample], world_size: int) -> list[list[Sample]]:
    """Split a global batch over data-parallel ranks, balancing tokens.

    Longest first, each sample goes to the rank with the fewest tokens so far (ties: the rank
    with fewer samples, then the lower rank); deterministic for a given input order.
    """
    order = sorted(range(len(samples)), key=lambda i: -len(samples[i].token_ids))
    shards: list[list[Sample]] = [[] for _ in range(world_size)]
    tokens = [0] * world_size
    for i in order:
        r = min(range(world_size), key=lambda k: (tokens[k], len(shards[k]), k))
        shards[r].append(samples[i])
        tokens[r] += len(samples[i].token_ids)
    return shards


def batch_metrics(batch: list[Sample], learner_version: int) -> dict[str, float]:
    """Advantage, reward and staleness statistics of a drawn batch (``train/`` names)."""
    adv = [s.advantage for s in batch if s.is_policy]
    lag = [learner_version - s.policy_version for s in batch]
    out = {
        "train/samples": float(len(batch)),
        "train/staleness_mean": statistics.fmean(lag) if lag else 0.0,
        "train/staleness_max": float(max(lag, default=0)),
        "train/critique_changed_frac": statistics.fmean(s.critique_changed for s in batch) if batch else 0.0,
    }
    if adv:
        out.update({
            "train/adv_mean": statistics.fmean(adv), "train/adv_std": statistics.pstdev(adv),
            "train/adv_min": min(adv), "train/adv_max": max(adv),
            "train/batch_reward_mean": statistics.fmean(s.reward for s in batch if s.is_policy),
        })
    return out
