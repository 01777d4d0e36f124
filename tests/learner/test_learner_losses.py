"""Advantages and losses equal verl's own functions (and hand-worked values) on the same inputs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from verl.trainer.ppo import core_algos

from cast_rl.config.schema import AlgorithmConfig
from cast_rl.learner.losses import (
    GlobalBatchInfo,
    kl_loss,
    policy_loss,
    supervised_loss,
    token_logprobs,
    verl_actor_config,
)
from cast_rl.samples.builders import verl_advantages

# Multi-turn masks: policy tokens in runs, context (0) between and around them.
MASKS = [
    [0, 0, 1, 1, 1, 0, 0, 1, 1],
    [0, 1, 1, 0, 1],
    [0, 0, 0, 1, 1, 1, 1],
    [0, 1],
    [0, 0, 1, 1, 0, 1, 1, 1],
    [1, 1, 1],
]
REWARDS = [1.0, 0.0, 0.0, 1.0, 0.5, 0.0]
GROUPS = ["a", "a", "a", "a", "b", "b"]


def test_grpo_advantages_worked_by_hand() -> None:
    adv = verl_advantages([1.0, 0.0, 0.0, 1.0], MASKS[:4], ["g"] * 4, "grpo")
    std = np.std([1, 0, 0, 1], ddof=1)  # torch.std is the unbiased estimate
    expected = [(r - 0.5) / (std + 1e-6) for r in (1, 0, 0, 1)]
    assert adv == pytest.approx(expected, abs=1e-6)
    assert verl_advantages([1.0, 0.0], MASKS[:2], ["g"] * 2, "grpo", norm_adv_by_std=False) == pytest.approx([0.5, -0.5])


@pytest.mark.parametrize("estimator", ["grpo", "grpo_vectorized", "rloo", "reinforce_plus_plus_baseline", "opo"])
def test_advantages_equal_verl_on_token_level_layout(estimator: str) -> None:
    width = max(map(len, MASKS))
    mask = torch.zeros(len(MASKS), width)
    scores = torch.zeros_like(mask)
    for i, m in enumerate(MASKS):
        mask[i, : len(m)] = torch.tensor(m, dtype=torch.float32)
        scores[i, max(j for j, x in enumerate(m) if x)] = REWARDS[i]
    expected, _ = core_algos.get_adv_estimator_fn(estimator)(
        token_level_rewards=scores, response_mask=mask, index=np.array(GROUPS, dtype=object)
    )
    ours = verl_advantages(REWARDS, MASKS, GROUPS, estimator)
    for i, m in enumerate(MASKS):
        on = torch.tensor(m, dtype=torch.bool)
        assert torch.allclose(expected[i, : len(m)][on], torch.full((int(on.sum()),), ours[i]), atol=1e-6)
        assert torch.all(expected[i, : len(m)][~on] == 0)


def _random_inputs(seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    mask = (torch.rand(6, 9, generator=g) > 0.3).float()
    mask[5] = 0  # a sequence without policy tokens (e.g. a supervised row)
    old = -torch.rand(6, 9, generator=g) * 3
    new = old + torch.randn(6, 9, generator=g) * 0.4  # ratios well outside [0.8, 1.2]
    adv = torch.randn(6, 1, generator=g).expand(6, 9) * mask
    return old, new, adv, mask


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "token-sum"])
def test_policy_loss_equals_verl_vanilla(agg: str) -> None:
    old, new, adv, mask = _random_inputs()
    algo = AlgorithmConfig(loss_agg_mode=agg, clip_ratio=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0)
    info = GlobalBatchInfo(1, int(mask.sum()), int((mask.sum(-1) > 0).sum()), 0, 0)
    ours, metrics = policy_loss(new, old, adv, mask, verl_actor_config(algo), info)
    # verl's function called directly, with the config object it documents
    cfg = OmegaConf.create({
        "clip_ratio": 0.2, "clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 3.0,
        "global_batch_info": {"dp_size": 1, "batch_num_tokens": info.policy_tokens,
                              "global_batch_size": info.policy_seqs},
    })
    ref, ref_metrics = core_algos.compute_policy_loss_vanilla(
        old_log_prob=old, log_prob=new, advantages=adv, response_mask=mask.bool(), loss_agg_mode=agg, config=cfg
    )
    assert torch.allclose(ours, ref, atol=1e-7)
    assert metrics["pg_clipfrac"] == pytest.approx(ref_metrics["actor/pg_clipfrac"])
    assert 0 < metrics["pg_clipfrac"] < 1


def test_policy_loss_at_ratio_one_is_minus_mean_advantage() -> None:
    mask = torch.tensor([[0.0, 1, 1], [1, 1, 0]])
    adv = torch.tensor([[0.0, 2, 2], [-1, -1, 0]])
    lp = torch.log(torch.tensor([[0.5, 0.5, 0.5], [0.5, 0.5, 0.5]]))
    info = GlobalBatchInfo(1, 4, 2, 0, 0)
    loss, _ = policy_loss(lp, lp, adv, mask, verl_actor_config(AlgorithmConfig()), info)
    assert float(loss) == pytest.approx(-(2 + 2 - 1 - 1) / 4)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "token-sum"])
def test_two_rank_split_with_global_counts_equals_one_rank(agg: str) -> None:
    """What makes data-parallel training exact: per-rank losses normalised by global counts,
    averaged over ranks (FSDP's gradient reduction), equal the single-process loss."""
    old, new, adv, mask = _random_inputs(1)
    new = new.clone().requires_grad_(True)
    cfg = verl_actor_config(AlgorithmConfig(loss_agg_mode=agg))
    full = GlobalBatchInfo(1, int(mask.sum()), int((mask.sum(-1) > 0).sum()), 0, 0)
    single, _ = policy_loss(new, old, adv, mask, cfg, full)
    (g_single,) = torch.autograd.grad(single, new)
    dp = GlobalBatchInfo(2, full.policy_tokens, full.policy_seqs, 0, 0)
    parts = [policy_loss(new[s], old[s], adv[s], mask[s], cfg, dp)[0] for s in (slice(0, 2), slice(2, 6))]
    averaged = sum(parts) / 2
    (g_dp,) = torch.autograd.grad(averaged, new)
    assert torch.allclose(averaged, single, atol=1e-6)
    assert torch.allclose(g_dp, g_single, atol=1e-6)


def test_kl_loss_equals_verl_kl_penalty() -> None:
    old, new, _, mask = _random_inputs(2)
    info = GlobalBatchInfo(1, int(mask.sum()), int((mask.sum(-1) > 0).sum()), 0, 0)
    for name in ("low_var_kl", "k1", "mse"):
        ours = kl_loss(new, old, mask, name, "token-mean", info)
        kld = core_algos.kl_penalty(new, old, name)
        assert torch.allclose(ours, (kld * mask).sum() / mask.sum(), atol=1e-6)


def test_supervised_loss_is_masked_cross_entropy() -> None:
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(2, 5, 11, generator=g)
    targets = torch.randint(0, 11, (2, 5), generator=g)
    mask = torch.tensor([[0.0, 0, 1, 1, 1], [0, 1, 1, 0, 0]])
    lp = token_logprobs(logits, targets)
    loss = supervised_loss(lp, mask, GlobalBatchInfo(1, 0, 0, 5, 2))
    ce = torch.nn.functional.cross_entropy(logits.reshape(-1, 11), targets.reshape(-1), reduction="none")
    assert torch.allclose(loss, (ce * mask.reshape(-1)).sum() / 5, atol=1e-6)
