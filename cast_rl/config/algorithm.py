"""Algorithm configuration: policy optimisation with verl's advantage estimators, policy losses and
KL penalties, and the critique-aware sample kinds it trains on.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cast_rl.config._checks import _check_choice, _check_positive

TREE_POINTS = ("writes", "flagged", "all")
"""Decision points step-level GRPO branches from (``algorithm.tree_points``)."""
OUTCOME_ADV_ESTIMATORS = (
    "grpo", "grpo_vectorized", "grpo_passk", "rloo", "rloo_vectorized",
    "reinforce_plus_plus_baseline", "opo", "gpg",
)
"""verl estimators that need only an outcome reward per sequence (no value model)."""
KL_PENALTIES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
"""verl's ``kl_penalty`` estimators (a trailing ``+`` adds the straight-through k2 gradient)."""
LOSS_AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-sum-norm", "seq-mean-token-mean")
"""verl's ``agg_loss`` modes."""


@dataclass(frozen=True)
class AlgorithmConfig:
    """Policy optimisation (verl's algorithms) and critique-aware samples."""

    adv_estimator: str = "grpo"
    """verl advantage estimator name (grpo, rloo, ...)."""
    policy_loss: str = "vanilla"
    """verl policy-loss registry name."""
    loss_agg_mode: str = "token-mean"
    """verl loss aggregation: token-mean, seq-mean-token-sum, seq-mean-token-mean, ..."""
    clip_ratio: float = 0.2
    """PPO clip range."""
    kl_coef: float = 0.0
    """KL penalty weight against the frozen reference (0 loads no reference model)."""
    kl_penalty: str = "low_var_kl"
    """verl KL estimator name."""
    critic_reward_weight: float = 0.0
    """Turn-level credit: each turn the critic judged gets this x (+1 valid, -1 invalid) added to
    its advantage; a rejected proposal gets only this (never the trajectory's outcome)."""
    max_collections_per_step: int = 3
    """Sync mode: collections per optimizer step while dropped groups leave fewer than
    learner.global_batch_size samples (each step trains on all it collected)."""
    filter_zero_variance_groups: bool = True
    """Drop GRPO trajectories whose group's raw outcomes are all equal and that carry no critic
    credit (dynamic sampling on the raw outcome; sync mode only, where a short collection is
    followed by another); counted as rollout/zero_variance_group_frac."""
    samples: list[str] = field(default_factory=lambda: ["outcome_groups"])
    """Critique-aware sample kinds (cast_rl.samples.builders): outcome_groups (GRPO with
    turn-level critic credit), revision, supervised (critique-enriched SFT), distill
    (critique-free distillation of revisions), rft (successes without critique), step_groups
    (step-level GRPO on tree rollouts: tree_branches continuations from each tree_points state)."""
    tree_branches: int = 4
    """step_groups: continuations per decision point, the original episode included (K >= 2)."""
    tree_points: str = "writes"
    """step_groups: where training episodes branch: writes (before each write that ran),
    flagged (before each proposal the critic rejected) or all (before every turn that ran)."""
    steps: int = 10
    """Optimizer steps of policy optimisation."""
    mode: str = "sync"
    """sync (collect, train, sync) or async (rollouts run while the learner trains)."""
    clip_ratio_low: float | None = None
    """Lower PPO clip range (None: clip_ratio)."""
    clip_ratio_high: float | None = None
    """Upper PPO clip range (None: clip_ratio; e.g. 0.28 for DAPO's clip-higher)."""
    clip_ratio_c: float = 3.0
    """Dual-clip PPO bound for negative advantages (must be > 1)."""
    norm_adv_by_std: bool = True
    """GRPO: divide by the group's reward std (False gives Dr.GRPO)."""
    old_logprobs: str = "recompute"
    """Behaviour log-probs for the ratio: recompute (learner forward before the update, as verl
    does) or rollout (the engine's logprobs stored in the trajectory)."""
    supervised_weight: float = 1.0
    """Weight of the cross-entropy loss of supervised samples in a mixed batch."""
    success_threshold: float = 1.0
    """A trajectory whose outcome reward reaches this counts as a success (supervised samples)."""
    tasks_per_step: int | None = None
    """Tasks collected per step, each with rollout.trials_per_task trials (None: enough for
    learner.global_batch_size)."""

    def __post_init__(self) -> None:
        _check_choice("algorithm.mode", self.mode, ("sync", "async"))
        _check_choice("algorithm.adv_estimator", self.adv_estimator, OUTCOME_ADV_ESTIMATORS)
        _check_choice("algorithm.loss_agg_mode", self.loss_agg_mode, LOSS_AGG_MODES)
        _check_choice("algorithm.old_logprobs", self.old_logprobs, ("recompute", "rollout"))
        _check_choice("algorithm.kl_penalty", self.kl_penalty.removesuffix("+"), KL_PENALTIES)
        _check_positive("algorithm.clip_ratio", self.clip_ratio)
        for key in ("clip_ratio_low", "clip_ratio_high"):
            if getattr(self, key) is not None:
                _check_positive(f"algorithm.{key}", getattr(self, key), allow_zero=True)
        if self.clip_ratio_c <= 1.0:
            raise ValueError(f"algorithm.clip_ratio_c={self.clip_ratio_c!r} is not allowed; it must be > 1")
        _check_positive("algorithm.supervised_weight", self.supervised_weight, allow_zero=True)
        if self.tasks_per_step is not None:
            _check_positive("algorithm.tasks_per_step", self.tasks_per_step)
        _check_positive("algorithm.kl_coef", self.kl_coef, allow_zero=True)
        _check_positive("algorithm.steps", self.steps, allow_zero=True)
        _check_positive("algorithm.max_collections_per_step", self.max_collections_per_step)
        for kind in self.samples:
            _check_choice("algorithm.samples[]", kind,
                          ("outcome_groups", "revision", "supervised", "distill", "rft", "step_groups"))
        if self.tree_branches < 2:
            raise ValueError(f"algorithm.tree_branches={self.tree_branches} is not allowed; a step group "
                             "needs at least 2 continuations")
        _check_choice("algorithm.tree_points", self.tree_points, TREE_POINTS)
