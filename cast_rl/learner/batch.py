"""Samples to tensors: data-parallel shards, micro-batches, dynamic padding.

:func:`shard` lives in :mod:`cast_rl.samples` (torch-free, for the replay actor) and is
importable from here.

Every per-token tensor of a :class:`MicroBatch` lives in the *target frame*: position ``t``
describes the prediction of token ``t + 1`` from tokens ``0..t``.  So for a padded batch of
``B`` sequences of longest length ``L``: ``input_ids`` and ``attention_mask`` are (B, L); and
``targets``, ``loss_mask``, ``old_logprobs`` and ``advantages`` are (B, L - 1), each the sample's
list shifted left by one (a token's loss and logprob belong to the position that predicts it).
Padding is on the right, to the longest sequence of the micro-batch only (dynamic padding).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import torch

from cast_rl.samples import Sample, shard

__all__ = ["MicroBatch", "collate", "dummy_micro_batch", "shard", "split_micro_batches"]


@dataclass
class MicroBatch:
    """One forward/backward pass worth of padded sequences (shapes in the module doc)."""

    input_ids: torch.Tensor
    """(B, L) token ids, right-padded."""
    attention_mask: torch.Tensor
    """(B, L) 1 on real tokens."""
    targets: torch.Tensor
    """(B, L-1) the token each position predicts (input_ids shifted left)."""
    loss_mask: torch.Tensor
    """(B, L-1) float, 1 where the predicted token carries loss."""
    old_logprobs: torch.Tensor
    """(B, L-1) behaviour-policy logprob of each predicted token (0 where not policy)."""
    advantages: torch.Tensor
    """(B, L-1) each token's advantage (the sequence's, or its turn's span advantage) on loss
    tokens, 0 elsewhere."""
    is_policy: torch.Tensor
    """(B,) bool: True takes the policy loss, False the supervised loss."""
    verdict_mask: torch.Tensor
    """(B, L-1) float, 1 where the predicted token is in a critic answer's verdict lines."""
    explanation_mask: torch.Tensor
    """(B, L-1) float, 1 on the other loss tokens of samples that mark a verdict."""

    @property
    def policy_mask(self) -> torch.Tensor:
        return self.loss_mask * self.is_policy[:, None].to(self.loss_mask.dtype)

    @property
    def supervised_mask(self) -> torch.Tensor:
        return self.loss_mask * (~self.is_policy)[:, None].to(self.loss_mask.dtype)

    @property
    def num_tokens(self) -> int:
        """Real (unpadded) tokens, for throughput."""
        return int(self.attention_mask.sum())

    def to(self, device: torch.device | str) -> MicroBatch:
        return MicroBatch(**{f.name: getattr(self, f.name).to(device) for f in fields(self)})


def collate(samples: Sequence[Sample], pad_id: int) -> MicroBatch:
    """Pad ``samples`` to their longest sequence and shift to the target frame."""
    if not samples:
        raise ValueError("collate() needs at least one sample")
    length = max(max(len(s.token_ids) for s in samples), 2)
    b = len(samples)
    ids = torch.full((b, length), pad_id, dtype=torch.long)
    attn = torch.zeros((b, length), dtype=torch.long)
    mask = torch.zeros((b, length), dtype=torch.float32)
    old = torch.zeros((b, length), dtype=torch.float32)
    adv = torch.zeros((b, length), dtype=torch.float32)
    verdict = torch.zeros((b, length), dtype=torch.float32)
    marked = torch.zeros((b, length), dtype=torch.float32)
    for i, s in enumerate(samples):
        n = len(s.token_ids)
        ids[i, :n] = torch.tensor(s.token_ids, dtype=torch.long)
        attn[i, :n] = 1
        mask[i, :n] = torch.tensor(s.loss_mask, dtype=torch.float32)
        old[i, :n] = torch.tensor(s.logprobs, dtype=torch.float32)
        adv[i, :n] = s.advantage
        for start, end, value in s.span_advantages:
            adv[i, int(start):int(end)] = value
        if s.verdict_mask:
            verdict[i, :n] = torch.tensor(s.verdict_mask, dtype=torch.float32)
            marked[i, :n] = mask[i, :n]
    # The first token is never predicted: nothing before it, so it can carry no loss.
    loss_mask = mask[:, 1:]
    return MicroBatch(
        input_ids=ids,
        attention_mask=attn,
        targets=ids[:, 1:],
        loss_mask=loss_mask,
        old_logprobs=old[:, 1:] * loss_mask,
        advantages=adv[:, 1:] * loss_mask,
        is_policy=torch.tensor([s.is_policy for s in samples], dtype=torch.bool),
        verdict_mask=verdict[:, 1:],
        explanation_mask=(marked - verdict)[:, 1:],
    )


def dummy_micro_batch(pad_id: int) -> MicroBatch:
    """A micro-batch with no loss tokens: keeps FSDP collectives in step on a rank with less data."""
    return collate([Sample("dummy", "supervised", [pad_id, pad_id], [0, 0], [0.0, 0.0])], pad_id)


def split_micro_batches(
    samples: Sequence[Sample], micro_batch_size: int, max_tokens: int | None = None
) -> list[list[Sample]]:
    """Group a rank's samples into micro-batches of similar length (less padding).

    At most ``micro_batch_size`` sequences each and, unless ``max_tokens`` is None, at most that many
    padded tokens (a single longer sequence still forms its own micro-batch).
    """
    ordered = sorted(samples, key=lambda s: len(s.token_ids))
    batches: list[list[Sample]] = []
    current: list[Sample] = []
    for s in ordered:
        longest = max([len(s.token_ids)] + [len(c.token_ids) for c in current])
        too_many = len(current) >= micro_batch_size
        too_long = max_tokens is not None and current and longest * (len(current) + 1) > max_tokens
        if too_many or too_long:
            batches.append(current)
            current = []
        current.append(s)
    if current:
        batches.append(current)
    return batches
