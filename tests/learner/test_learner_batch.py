"""Micro-batching with dynamic padding, the target-frame shift, and data-parallel sharding."""

from __future__ import annotations

import torch

from cast_rl.learner.batch import collate, dummy_micro_batch, shard, split_micro_batches
from cast_rl.learner.sample import Sample


def _sample(key: str, n: int, source: str = "outcome_groups", adv: float = 1.0) -> Sample:
    ids = list(range(10, 10 + n))
    mask = [0] * (n // 2) + [1] * (n - n // 2)
    lps = [-0.1 * m for m in mask]
    return Sample(key, source, ids, mask, lps, advantage=adv)


def test_collate_pads_to_longest_and_shifts_to_the_target_frame() -> None:
    a, b = _sample("a", 4, adv=2.0), _sample("b", 6, source="supervised", adv=0.0)
    mb = collate([a, b], pad_id=0)
    assert mb.input_ids.shape == (2, 6) and mb.targets.shape == (2, 5)
    assert mb.input_ids[0].tolist() == [10, 11, 12, 13, 0, 0]
    assert mb.attention_mask[0].tolist() == [1, 1, 1, 1, 0, 0]
    # token t's mask and logprob sit at position t-1 (the position that predicts it)
    assert mb.loss_mask[0].tolist() == [0, 1, 1, 0, 0]
    assert mb.targets[0, :3].tolist() == [11, 12, 13]
    assert mb.old_logprobs[0].tolist() == torch.tensor([0.0, -0.1, -0.1, 0, 0]).tolist()
    assert mb.advantages[0].tolist() == [0, 2, 2, 0, 0]
    assert mb.is_policy.tolist() == [True, False]
    assert mb.policy_mask.sum() == 2 and mb.supervised_mask.sum() == 3
    assert mb.num_tokens == 10


def test_dummy_micro_batch_carries_no_loss() -> None:
    mb = dummy_micro_batch(pad_id=0)
    assert mb.loss_mask.sum() == 0 and mb.input_ids.shape == (1, 2)


def test_shard_balances_tokens_and_keeps_every_sample() -> None:
    samples = [_sample(f"s{i}", n) for i, n in enumerate([30, 5, 20, 10, 10, 5, 2, 18])]
    shards = shard(samples, 2)
    assert sorted(s.key for sh in shards for s in sh) == sorted(s.key for s in samples)
    tokens = [sum(len(s.token_ids) for s in sh) for sh in shards]
    assert abs(tokens[0] - tokens[1]) <= 2
    assert shard(samples, 2) == shards  # deterministic


def test_split_micro_batches_by_count_and_tokens() -> None:
    samples = [_sample(f"s{i}", n) for i, n in enumerate([8, 3, 5, 9, 4])]
    by_count = split_micro_batches(samples, micro_batch_size=2)
    assert [len(b) for b in by_count] == [2, 2, 1]
    assert [len(s.token_ids) for b in by_count for s in b] == [3, 4, 5, 8, 9]  # similar lengths together
    by_tokens = split_micro_batches(samples, micro_batch_size=8, max_tokens=16)
    assert all(len(b) * max(len(s.token_ids) for s in b) <= 16 or len(b) == 1 for b in by_tokens)
    assert sum(len(b) for b in by_tokens) == 5
