"""Losses: verl's policy losses, KL penalties and aggregation, plus masked cross-entropy.

Nothing here re-implements verl.  The policy loss is ``core_algos.get_policy_loss_fn(name)``
called with a verl :class:`~verl.workers.config.ActorConfig` (clip ratios, ``clip_ratio_c``,
``loss_agg_mode`` and ``global_batch_info``); the KL term is ``core_algos.kl_penalty``
aggregated by ``core_algos.agg_loss``; the supervised loss is ``agg_loss`` over ``-logprob``.

Global batch information: verl normalises every micro-batch's loss by the *global* batch (the
token count, or the sequence count in the ``seq-mean-*`` modes, summed over data-parallel ranks)
and multiplies by ``dp_size``, so that summing micro-batch gradients and averaging them over
ranks (what FSDP does) gives the gradient of the mean over the whole global batch, whatever the
split.  :class:`GlobalBatchInfo` carries those counts, separately for policy and supervised
samples since each term has its own denominator.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from cast_rl.config.schema import AlgorithmConfig


@dataclass(frozen=True)
class GlobalBatchInfo:
    """Counts over the whole global batch (all ranks, all micro-batches)."""

    dp_size: int
    policy_tokens: int
    """Loss tokens of policy samples."""
    policy_seqs: int
    """Policy samples with at least one loss token."""
    supervised_tokens: int
    supervised_seqs: int
    verdict_tokens: int = 0
    """Supervised tokens of a critic answer's verdict lines (:attr:`Sample.verdict_mask`)."""
    explanation_tokens: int = 0
    """The other supervised tokens of samples that mark a verdict."""

    def verl_info(self, policy: bool) -> dict[str, int]:
        """The ``global_batch_info`` verl's aggregation reads, for one loss term."""
        return {
            "dp_size": self.dp_size,
            "batch_num_tokens": self.policy_tokens if policy else self.supervised_tokens,
            "global_batch_size": self.policy_seqs if policy else self.supervised_seqs,
        }


def verl_actor_config(algo: AlgorithmConfig) -> Any:
    """A verl ``ActorConfig`` carrying our algorithm settings (what verl's losses read)."""
    from verl.workers.config import ActorConfig, PolicyLossConfig

    return ActorConfig(
        strategy="fsdp",
        clip_ratio=algo.clip_ratio,
        clip_ratio_low=algo.clip_ratio if algo.clip_ratio_low is None else algo.clip_ratio_low,
        clip_ratio_high=algo.clip_ratio if algo.clip_ratio_high is None else algo.clip_ratio_high,
        clip_ratio_c=algo.clip_ratio_c,
        loss_agg_mode=algo.loss_agg_mode,
        policy_loss=PolicyLossConfig(loss_mode=algo.policy_loss),
        use_kl_loss=algo.kl_coef > 0,
        kl_loss_coef=algo.kl_coef,
        kl_loss_type=algo.kl_penalty,
        ppo_mini_batch_size=1,
        ppo_micro_batch_size_per_gpu=1,
        rollout_n=1,
    )


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log p(target) per position: logits (B, L-1, V) and targets (B, L-1) -> (B, L-1), fp32."""
    logits = logits.float()
    picked = torch.gather(logits, -1, targets.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    actor_config: Any,
    info: GlobalBatchInfo,
) -> tuple[torch.Tensor, dict[str, float]]:
    """verl's registered policy loss over the policy tokens of one micro-batch.

    Returns (loss to backpropagate, verl's metrics with the ``actor/`` prefix dropped).
    """
    from verl.trainer.ppo.core_algos import get_policy_loss_fn

    actor_config.global_batch_info.clear()
    actor_config.global_batch_info.update(info.verl_info(policy=True))
    fn = get_policy_loss_fn(actor_config.policy_loss.loss_mode)
    loss, metrics = fn(
        old_log_prob=old_logprobs,
        log_prob=logprobs,
        advantages=advantages,
        response_mask=mask.bool(),
        loss_agg_mode=actor_config.loss_agg_mode,
        config=actor_config,
        rollout_is_weights=None,
    )
    return loss, {k.removeprefix("actor/"): float(v) for k, v in metrics.items()}


def kl_loss(
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    mask: torch.Tensor,
    kl_penalty: str,
    loss_agg_mode: str,
    info: GlobalBatchInfo,
) -> torch.Tensor:
    """verl's KL estimator against the reference, aggregated like the policy loss."""
    from verl.trainer.ppo import core_algos

    kld = core_algos.kl_penalty(logprob=logprobs, ref_logprob=ref_logprobs, kl_penalty=kl_penalty)  # type: ignore[arg-type]
    return core_algos.agg_loss(kld, mask, loss_agg_mode, **info.verl_info(policy=True))


def supervised_loss(logprobs: torch.Tensor, mask: torch.Tensor, info: GlobalBatchInfo) -> torch.Tensor:
    """Masked next-token cross-entropy, a token mean over the global batch's supervised tokens."""
    from verl.trainer.ppo import core_algos

    return core_algos.agg_loss(-logprobs, mask, "token-mean", **info.verl_info(policy=False))


def critic_terms(logprobs: torch.Tensor, verdict_mask: torch.Tensor, explanation_mask: torch.Tensor,
                 info: GlobalBatchInfo) -> tuple[torch.Tensor, torch.Tensor]:
    """(verdict, explanation) cross-entropies of critic answers, each a token mean over the global
    batch's tokens of its kind (0 for a kind the batch lacks): the two terms of
    ``pipeline.critic_loss=two_term``, ``w_verdict x verdict + w_explanation x explanation``."""
    from verl.trainer.ppo import core_algos

    def term(mask: torch.Tensor, tokens: int) -> torch.Tensor:
        if not tokens:
            return (logprobs * 0.0).sum()
        return core_algos.agg_loss(-logprobs, mask, "token-mean", dp_size=info.dp_size, batch_num_tokens=tokens,
                                   global_batch_size=info.supervised_seqs)

    return term(verdict_mask, info.verdict_tokens), term(explanation_mask, info.explanation_tokens)
