"""Evaluation configuration: n trials per task, pass^k, the critic-in-the-loop budget sweep, and the
domains, splits and unseen databases evaluated.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cast_rl.config._checks import _check_choice, _check_positive
from cast_rl.config.env import DOMAIN_NAMES


@dataclass(frozen=True)
class EvalConfig:
    """Evaluation: n trials per task, pass^k, and the critic-in-the-loop budget sweep."""

    trials: int | None = None
    """Trials per task (the n of pass^k); None means rollout.trials_per_task."""
    k_values: list[int] = field(default_factory=list)
    """k of pass^k to report; empty means 1..n (every k must be <= n)."""
    verification_budgets: list[int] = field(default_factory=lambda: [0, 1, 2])
    """Configurations compared: 0 runs without the critic; B > 0 runs the critic in the loop
    with B critique-revise rounds per action."""
    with_critic: bool = True
    """Run the budgets > 0 (False keeps only the no-critic configuration)."""
    domains: list[str] = field(default_factory=list)
    """Domains to evaluate, each from <data_root>/<domain>; empty means env.domain (env.data_dir)."""
    data_root: str = ""
    """With domains: the directory holding one data directory per domain (e.g. ../shared/benchmarks)."""
    splits: list[str] = field(default_factory=list)
    """Task splits to evaluate; empty means env.split."""
    sample_trajectories: int = 4
    """Trajectories per configuration in the W&B table of samples with their critiques."""
    in_domain: list[str] = field(default_factory=lambda: ["retail"])
    """Domains the evaluated policy trained on: the report marks each domain in- or
    out-of-domain (the paper trains on retail)."""
    unseen_seeds: list[int] = field(default_factory=list)
    """Generated retail (env.data_dir empty) only: also evaluate on databases generated with these
    seeds, which nothing in training reads (not the tokenizer, not a demonstration, not a
    collection): split ``unseen-<seed>`` each, pooled as ``retail/unseen`` in the report.  Must
    be disjoint from env.generated_seed."""
    unseen_tasks: int = 24
    """Tasks generated per unseen database, all evaluated (env.task_indices does not apply)."""

    def __post_init__(self) -> None:
        if self.trials is not None:
            _check_positive("eval.trials", self.trials)
        for domain in self.in_domain:
            _check_choice("eval.in_domain[]", domain, DOMAIN_NAMES)
        _check_positive("eval.sample_trajectories", self.sample_trajectories, allow_zero=True)
        for k in self.k_values:
            _check_positive("eval.k_values[]", k)
        if not self.verification_budgets:
            raise ValueError("eval.verification_budgets=[] is not allowed; give at least one budget, e.g. [0, 1]")
        for b in self.verification_budgets:
            _check_positive("eval.verification_budgets[]", b, allow_zero=True)
        if len(set(self.verification_budgets)) != len(self.verification_budgets):
            raise ValueError(f"eval.verification_budgets={self.verification_budgets} is not allowed; list each budget once")
        if not self.with_critic and 0 not in self.verification_budgets:
            raise ValueError(
                f"eval.with_critic=False with eval.verification_budgets={self.verification_budgets} leaves "
                "nothing to run; add 0 (no critic) to the budgets or set with_critic=True"
            )
        for domain in self.domains:
            _check_choice("eval.domains[]", domain, DOMAIN_NAMES)
        _check_positive("eval.unseen_tasks", self.unseen_tasks)
        if self.unseen_seeds and self.domains:
            raise ValueError(f"eval.unseen_seeds={self.unseen_seeds} is not allowed with eval.domains={self.domains}: "
                             "unseen databases are generated retail; evaluate the benchmark domains as they are")
        if len(set(self.unseen_seeds)) != len(self.unseen_seeds):
            raise ValueError(f"eval.unseen_seeds={self.unseen_seeds} is not allowed; list each seed once")
        if self.domains and not self.data_root:
            raise ValueError("eval.data_root='' is not allowed with eval.domains; give the directory holding <domain>/ data")
