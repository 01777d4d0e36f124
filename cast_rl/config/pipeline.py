"""Pipeline configuration: the CAST pipeline's stages, their run directories, and how long and at
which learning-rate schedule each of its training phases trains.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from cast_rl.config._checks import _check_choice, _check_positive

PIPELINE_STAGES = (
    "warmstart", "eval_before", "collect", "label", "critic_data", "train_critic", "eval_critic", "benefit",
    "collect_with_critic", "optimise", "eval_after", "eval_rule", "optimise_rft", "eval_rft",
)
"""Every stage, in the order the pipeline runs them."""
OPTIONAL_STAGES = ("eval_critic", "benefit", "eval_rule", "optimise_rft", "eval_rft")
"""Stages that run only when ``pipeline.stages`` lists them (the default list leaves them out):
the starting policy with the trained critic in the loop, the critic's net benefit, the optimised
policy with the rule critic in the loop (when the pipeline serves the trained one), and the RFT
arm (rejection-sampling fine-tuning at CAST's cost, then its evaluation)."""
STAGE_DIRS = {
    **{stage: f"{i:02d}_{stage}" for i, stage in enumerate(s for s in PIPELINE_STAGES if s not in OPTIONAL_STAGES)},
    "eval_critic": "05a_eval_critic",
    "benefit": "05b_benefit",
    "eval_rule": "08c_eval_rule",
    "optimise_rft": "08a_optimise_rft",
    "eval_rft": "08b_eval_rft",
}
"""Each stage's directory under ``run_dir``: numbered in run order; an optional stage takes a
default stage's number and a letter, so adding one leaves the other stages' directories (and the
runs already on disk) as they were."""

LR_SCHEDULES = ("constant", "constant_with_warmup", "linear", "cosine", "cosine_with_min_lr")
"""transformers ``get_scheduler`` names a training phase may use (``pipeline.*_schedule.name``)."""
BALANCES = ("random", "per_action")
"""How stage critic_data draws valid critic examples (``pipeline.critic_balance``)."""
CRITIC_LOSSES = ("single", "two_term")
"""How critic training weighs the critic's answer (``pipeline.critic_loss``)."""


@dataclass(frozen=True)
class ScheduleConfig:
    """The learning-rate schedule of one supervised phase, over its steps (cast_rl.learner.schedule)."""

    name: str = "constant"
    """constant, constant_with_warmup, linear, cosine or cosine_with_min_lr (transformers'
    scheduler names): after the warm-up, linear and the cosines decay to 0 (cosine_with_min_lr to
    min_lr_rate x the peak) at the phase's last step; the peak is the phase's learning rate."""
    warmup_ratio: float = 0.0
    """Share of the phase's steps that warm up linearly from 0, rounded up (as transformers'
    Trainer does); the first step of a warm-up runs at learning rate 0."""
    warmup_steps: int | None = None
    """Warm-up steps instead of warmup_ratio (None: warmup_ratio decides)."""
    min_lr_rate: float = 0.0
    """cosine_with_min_lr only: the floor as a fraction of the peak learning rate."""

    def __post_init__(self) -> None:
        _check_choice("pipeline.*_schedule.name", self.name, LR_SCHEDULES)
        if not 0.0 <= self.warmup_ratio < 1.0:
            raise ValueError(f"pipeline.*_schedule.warmup_ratio={self.warmup_ratio!r} is not allowed; it must be in [0, 1)")
        if self.warmup_steps is not None:
            _check_positive("pipeline.*_schedule.warmup_steps", self.warmup_steps, allow_zero=True)
            if self.warmup_ratio:
                raise ValueError(f"pipeline.*_schedule.warmup_steps={self.warmup_steps} is not allowed with "
                                 f"warmup_ratio={self.warmup_ratio}; set one of the two")
        if self.name == "constant" and self.warmup(1_000_000):
            raise ValueError("pipeline.*_schedule.name='constant' is not allowed with a warm-up (transformers' "
                             "constant schedule has none); choose constant_with_warmup")
        if not 0.0 <= self.min_lr_rate < 1.0:
            raise ValueError(f"pipeline.*_schedule.min_lr_rate={self.min_lr_rate!r} is not allowed; it must be in [0, 1)")
        if self.min_lr_rate and self.name != "cosine_with_min_lr":
            raise ValueError(f"pipeline.*_schedule.min_lr_rate={self.min_lr_rate!r} is not allowed with "
                             f"name={self.name!r}; only cosine_with_min_lr has a floor")

    def warmup(self, total_steps: int) -> int:
        """Warm-up steps of a phase of ``total_steps`` steps."""
        if self.warmup_steps is not None:
            return self.warmup_steps
        return math.ceil(total_steps * self.warmup_ratio - 1e-9)  # 0.3 x 10 is 3, not 3.0000000000000004


@dataclass(frozen=True)
class PipelineConfig:
    """The CAST pipeline (``cast-rl pipeline``): which stages run and how long each trains."""

    stages: list[str] = field(default_factory=lambda: [s for s in PIPELINE_STAGES if s not in OPTIONAL_STAGES])
    """Stages to run, in pipeline order; a stage whose outputs exist is skipped.  The default is
    every stage but the optional ones (:data:`OPTIONAL_STAGES`: eval_critic, benefit, eval_rule,
    optimise_rft and eval_rft)."""
    warmstart_epochs: int = 0
    """Supervised epochs on expert demonstrations of env.train_split before anything else
    (the embedded default's tiny policy needs them; 0 skips the warm-start)."""
    train_split: str = "train"
    """Split the pipeline collects and trains on (env.split is the evaluation split)."""
    collect_trials: int = 2
    """Trials per training task in the collect stages (with collect_policy=policy)."""
    collect_policy: str = "policy"
    """Who plays stage collect's episodes: policy (the current policy, collect_trials trials per
    task) or teacher (teacher.model on its own GPUs, teacher.rollouts_per_task trials at
    teacher.collect_temperature; the policy's tokenizer writes the trajectories)."""
    train_tasks: int | None = None
    """Training tasks the collect and optimise stages use: the first N of train_split (None: all);
    the warm-start always uses every task of the split."""
    critic_train_steps: int = 0
    """Supervised steps of the critic model on the critic dataset (0 skips critic training;
    the rule-based critic then serves the loop unless critic.backend=model)."""
    critic_epochs: int | None = None
    """Epochs over the critic dataset instead of critic_train_steps (which must then be 0):
    ceil(epochs x examples / learner.global_batch_size) steps.  None: critic_train_steps decides."""
    collect_budget: int = 1
    """Verification budget of the collect_with_critic stage (and of optimise's collection); 0
    collects without the critic (e.g. outcome GRPO as a baseline)."""
    use_chosen_budget: bool = False
    """Replace collect_budget by the budget stage benefit chose (its DONE.json), and add that
    budget to eval.verification_budgets in eval_after; needs benefit in stages or run before."""
    sft_steps: int = 0
    """Supervised steps on successful critique-corrected trajectories (the paper's recipe) in
    the optimise stage, when algorithm.samples includes supervised."""
    sft_epochs: int | None = None
    """Epochs over the optimise stage's supervised samples instead of sft_steps (which must then
    be 0): ceil(epochs x samples / learner.global_batch_size) steps.  None: sft_steps decides."""
    sft_schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    """Learning-rate schedule of the optimise stage's fine-tuning (peak learner.lr; GRPO after it
    runs at the constant grpo_lr) and of optimise_rft's."""
    grpo_lr: float | None = None
    """Learning rate of the optimise stage's GRPO steps, after its fine-tuning at learner.lr
    (None: learner.lr).  A policy gradient wants a far smaller step than supervised
    fine-tuning: on the quickstart (samples distill, rft, outcome_groups), 4 GRPO steps at the
    fine-tuning's 5e-4 took unseen-database pass^1 from 0.747 (fine-tuning alone) to 0.403."""
    warmstart_lr: float = 1e-3
    """Learning rate of the warm-start (a tiny random model needs a large one)."""
    warmstart_schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    """Learning-rate schedule of the warm-start (peak warmstart_lr)."""
    warmstart_teacher: str = "expert"
    """Who demonstrates: expert (the task's gold actions) or noisy_expert (generated retail
    only: a teacher that makes CAST's errors at warmstart_error_rate; cast_rl.rollout.noisy_expert)."""
    warmstart_trials: int = 1
    """Demonstrations per training task (noisy_expert draws its error per trial)."""
    warmstart_loss: str = "policy"
    """policy (cross-entropy on the demonstrator's turns) or all (on every token of the
    transcript: far more signal per token for a model trained from scratch)."""
    warmstart_error_rate: float = 0.0
    """noisy_expert: share of demonstrations with one error of a kind from warmstart_errors."""
    warmstart_errors: list[str] = field(
        default_factory=lambda: ["missing_confirmation", "wrong_argument", "fabricated_id"]
    )
    """noisy_expert: the error kinds it makes."""
    warmstart_critic_share: float = 0.0
    """noisy_expert: share of demonstrations collected with the rule critic in the loop (budget 1),
    so the policy also sees critiques and the corrected step."""
    critic_lr: float = 1e-4
    """Learning rate of critic training."""
    critic_micro_batch_size: int | None = None
    """Critic examples per forward/backward pass in stage train_critic (None:
    learner.micro_batch_size).  A critic example is short (the conversation cut to
    critic.max_prompt_chars, the proposed action and the answer), so several share a pass, padded
    to the longest of them; learner.max_tokens_per_micro_batch still caps a pass's padded tokens.
    The same loss and gradient as one example per pass.  At most the rank's share of
    learner.global_batch_size, rounded down to a divisor of it."""
    critic_schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    """Learning-rate schedule of critic training (peak critic_lr)."""
    critic_loss: str = "single"
    """single (one cross-entropy token mean over the critic's whole answer) or two_term
    (critic_verdict_weight x the token mean over its VERDICT and ERROR lines + critic_explanation_weight
    x the token mean over the rest of the answer; cast_rl.learner.losses.critic_terms)."""
    critic_verdict_weight: float = 1.0
    """critic_loss=two_term: weight of the verdict term."""
    critic_explanation_weight: float = 1.0
    """critic_loss=two_term: weight of the explanation term."""
    critic_base: str = "model"
    """What stage train_critic starts from: model (critic.model.path, built tiny with
    make_tiny_if_missing) or warmstart (the warm-started policy, 00_warmstart/model: the domain's
    language already learned, as the paper's critic starts from a pretrained LLM; needs the
    warmstart stage).  On the quickstart, 60 steps from warmstart reach held-out recall 1.0 at
    false-positive rate 0.035; from a tiny model of the same size, recall 0.14."""
    critic_valid_answer: str = "full"
    """The critic's training answer for a valid action: full (the whole format) or verdict (the
    VERDICT and ERROR lines alone: parsed the same, a tenth of the tokens to serve;
    cast_rl.critique.datasets.VALID_ANSWERS)."""
    critic_valid_per_invalid: float = 1.0
    """Valid examples per invalid one in the critic's training split (stage critic_data, ``cast-rl
    critic build-data``); 1 balances the classes.  In the loop most actions are valid and each false
    flag costs a revision, so a critic for serving trains on more valid ones; the held-out split
    stays balanced."""
    critic_balance: str = "random"
    """How stage critic_data draws the valid examples of the training split (the held-out split
    always draws per_action, so its false-positive rate is measured on valid cancels): random (from every valid
    action) or per_action (first valid examples of the actions the invalid ones are, then the
    rest at random; cast_rl.critique.datasets.balance).  Drawn at random the quickstart's 143
    invalid cancels met 17 valid ones and its critic flagged 0.041 of valid actions in the loop;
    per_action gave 137 valid cancels, and after 60 steps the critic flagged few (held-out recall
    0.54 at false-positive rate 0.0, 49 flags in 480 episodes; docs/quickstart.md)."""
    critic_twins: bool = False
    """Stage critic_data adds to the training split the argument twins of every write it keeps:
    the same request with one argument set to each other value its tool's schema allows (an
    enum: a cancel's reason), labelled by the labeller (cast_rl.critique.twins).  A valid and an
    invalid cancel differ in one argument, which a critic trained on the actions alone never has
    to read: on the quickstart it called all 117 cancels with the wrong reason valid.  The
    held-out split gets none."""
    label_demonstrations: bool = False
    """Stage label also labels the warm-start's demonstrations (the teacher's trajectories, the
    paper's step 1), after 02_collect's, so the critic trains on both (``03_label/trajectories.jsonl``)."""
    critic_heldout_fraction: float = 0.2
    """Share of the labelled trajectories stage critic_data (and ``cast-rl critic build-data``)
    holds out of critic training, split by trajectory with the run's seed."""
    critic_heldout_eval: list[str] = field(default_factory=lambda: ["rule", "base", "trained"])
    """Critics measured on the held-out critic split after train_critic (rule: the rule critic;
    base: critic.model untrained; trained: the stage's model); empty skips the measurement."""
    blame_k: int = 0
    """Verified blame in the label stage (cast_rl.critique.blame): continuations from the
    corrected state per invalid label of a failed trajectory, with the collected policy; the
    records go to 03_label/blame.jsonl and blame/ metrics.  0 skips it."""
    critic_data_blame: str = "off"
    """off, or filter: critic_data leaves out of the critic's training split every invalid label
    that verified blame checked and did not confirm (needs blame_k > 0; the held-out split is
    kept whole, so held-out metrics compare like with like)."""
    benefit_budgets: list[int] = field(default_factory=lambda: [0, 1, 2, 3])
    """The critic's net benefit (cast_rl.eval.net_benefit, ``cast-rl benefit``): verification
    budgets compared by pass^k per token; the one maximising it is chosen."""
    benefit_trials: int = 4
    """Trials per task at each budget (the n of pass^k)."""
    benefit_k: int = 2
    """Continuations per branch (the proposal as it was, the revision) at each flagged action;
    0 only sweeps the budgets."""
    benefit_passk: int = 1
    """The k whose pass^k per token chooses the budget (1: successes per token, the inverse of
    the tokens paid per solved task; must be <= benefit_trials)."""
    benefit_fp_rate: float = 0.0
    """Wrap the critic so that it also rejects a valid proposal with this probability
    (deterministic per proposal; validation of the measurement, 0 in real runs)."""
    benefit_policy: str = "policy"
    """policy (policy.path served by inference.*) or noisy_expert (generated retail only: the
    deferential noisy teacher, errors at benefit_error_rate; cast_rl.rollout.noisy_expert)."""
    benefit_error_rate: float = 0.5
    """noisy_expert: share of episodes with one error of a kind from benefit_errors."""
    benefit_errors: list[str] = field(
        default_factory=lambda: ["missing_confirmation", "wrong_argument", "fabricated_id"]
    )
    """noisy_expert: the error kinds it makes."""
    benefit_tasks: int | None = None
    """Tasks measured: the first N (None: all) of env.split (``cast-rl benefit``) or of
    pipeline.train_split (stage benefit)."""

    def __post_init__(self) -> None:
        for stage in self.stages:
            _check_choice("pipeline.stages[]", stage, PIPELINE_STAGES)
        for stage, needs in (("optimise_rft", "optimise"), ("eval_rft", "optimise_rft")):
            if stage in self.stages and needs not in self.stages:
                raise ValueError(f"pipeline.stages={self.stages} is not allowed: {stage} needs {needs} in the "
                                 "same list (the RFT arm matches CAST's optimisation cost)")
        _check_positive("pipeline.blame_k", self.blame_k, allow_zero=True)
        _check_choice("pipeline.critic_data_blame", self.critic_data_blame, ("off", "filter"))
        if self.critic_data_blame == "filter" and not self.blame_k:
            raise ValueError("pipeline.critic_data_blame='filter' is not allowed with pipeline.blame_k=0; "
                             "verified blame must run to say which labels it confirms")
        _check_positive("pipeline.warmstart_epochs", self.warmstart_epochs, allow_zero=True)
        _check_positive("pipeline.collect_trials", self.collect_trials)
        _check_choice("pipeline.collect_policy", self.collect_policy, ("policy", "teacher"))
        if self.train_tasks is not None:
            _check_positive("pipeline.train_tasks", self.train_tasks)
        _check_positive("pipeline.critic_train_steps", self.critic_train_steps, allow_zero=True)
        _check_positive("pipeline.collect_budget", self.collect_budget, allow_zero=True)
        users = [s for s in ("collect_with_critic", "optimise", "eval_after") if s in self.stages]
        if self.use_chosen_budget and not users:
            raise ValueError(f"pipeline.use_chosen_budget=True is not allowed with pipeline.stages={self.stages}: "
                             "no stage uses a verification budget; add collect_with_critic, optimise or eval_after")
        _check_positive("pipeline.sft_steps", self.sft_steps, allow_zero=True)
        for steps, epochs in (("sft_steps", "sft_epochs"), ("critic_train_steps", "critic_epochs")):
            if getattr(self, epochs) is not None:
                _check_positive(f"pipeline.{epochs}", getattr(self, epochs))
                if getattr(self, steps):
                    raise ValueError(f"pipeline.{steps}={getattr(self, steps)} is not allowed with pipeline.{epochs}="
                                     f"{getattr(self, epochs)}; set one of the two ({steps}=0 to count in epochs)")
        if self.grpo_lr is not None:
            _check_positive("pipeline.grpo_lr", self.grpo_lr)
        _check_positive("pipeline.warmstart_lr", self.warmstart_lr)
        _check_choice("pipeline.warmstart_teacher", self.warmstart_teacher, ("expert", "noisy_expert"))
        _check_positive("pipeline.warmstart_trials", self.warmstart_trials)
        _check_choice("pipeline.warmstart_loss", self.warmstart_loss, ("policy", "all"))
        for key in ("warmstart_error_rate", "warmstart_critic_share"):
            if not 0.0 <= getattr(self, key) <= 1.0:
                raise ValueError(f"pipeline.{key}={getattr(self, key)!r} is not allowed; it must be in [0, 1]")
        for kind in self.warmstart_errors:
            _check_choice("pipeline.warmstart_errors[]", kind,
                          ("missing_confirmation", "wrong_argument", "fabricated_id"))
        _check_positive("pipeline.critic_lr", self.critic_lr)
        if self.critic_micro_batch_size is not None:
            _check_positive("pipeline.critic_micro_batch_size", self.critic_micro_batch_size)
        _check_choice("pipeline.critic_loss", self.critic_loss, CRITIC_LOSSES)
        for key in ("critic_verdict_weight", "critic_explanation_weight"):
            _check_positive(f"pipeline.{key}", getattr(self, key), allow_zero=True)
            if self.critic_loss == "single" and getattr(self, key) != 1.0:
                raise ValueError(f"pipeline.{key}={getattr(self, key)!r} is not allowed with pipeline.critic_loss="
                                 "'single' (one term, no weights); set pipeline.critic_loss=two_term")
        if not self.critic_verdict_weight + self.critic_explanation_weight:
            raise ValueError("pipeline.critic_verdict_weight=0 and pipeline.critic_explanation_weight=0 are not "
                             "allowed together; the critic would learn nothing")
        _check_choice("pipeline.critic_valid_answer", self.critic_valid_answer, ("full", "verdict"))
        _check_choice("pipeline.critic_base", self.critic_base, ("model", "warmstart"))
        _check_positive("pipeline.critic_valid_per_invalid", self.critic_valid_per_invalid)
        _check_choice("pipeline.critic_balance", self.critic_balance, BALANCES)
        if not 0.0 <= self.critic_heldout_fraction < 1.0:
            raise ValueError(f"pipeline.critic_heldout_fraction={self.critic_heldout_fraction!r} is not "
                             "allowed; it must be in [0, 1)")
        for critic in self.critic_heldout_eval:
            _check_choice("pipeline.critic_heldout_eval[]", critic, ("rule", "base", "trained"))
        if not self.benefit_budgets or len(set(self.benefit_budgets)) != len(self.benefit_budgets):
            raise ValueError(f"pipeline.benefit_budgets={self.benefit_budgets} is not allowed; list each budget "
                             "once, at least one, e.g. [0, 1, 2]")
        for b in self.benefit_budgets:
            _check_positive("pipeline.benefit_budgets[]", b, allow_zero=True)
        _check_positive("pipeline.benefit_trials", self.benefit_trials)
        _check_positive("pipeline.benefit_k", self.benefit_k, allow_zero=True)
        _check_positive("pipeline.benefit_passk", self.benefit_passk)
        if self.benefit_passk > self.benefit_trials:
            raise ValueError(f"pipeline.benefit_passk={self.benefit_passk} is not allowed with "
                             f"pipeline.benefit_trials={self.benefit_trials}; k must be <= the trials per task")
        for key in ("benefit_fp_rate", "benefit_error_rate"):
            if not 0.0 <= getattr(self, key) <= 1.0:
                raise ValueError(f"pipeline.{key}={getattr(self, key)!r} is not allowed; it must be in [0, 1]")
        _check_choice("pipeline.benefit_policy", self.benefit_policy, ("policy", "noisy_expert"))
        for kind in self.benefit_errors:
            _check_choice("pipeline.benefit_errors[]", kind, ("missing_confirmation", "wrong_argument", "fabricated_id"))
        if self.benefit_tasks is not None:
            _check_positive("pipeline.benefit_tasks", self.benefit_tasks)

    @property
    def trains_critic(self) -> bool:
        """Stage train_critic trains (critic_train_steps > 0 or critic_epochs set)."""
        return self.critic_train_steps > 0 or self.critic_epochs is not None
