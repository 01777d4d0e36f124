"""Typed configuration: one frozen dataclass per component, defaults in code.

YAML files in ``configs/`` and dotted command-line overrides (``learner.lr=1e-6``) only override
these defaults; :mod:`cast_rl.config.loader` merges them and rejects unknown keys and bad values
with an error that names the key.  Validation that types cannot express lives in
``__post_init__`` and raises :class:`ValueError` naming the key, the value and what is allowed.

Each component's dataclasses live in a module of their own (:mod:`cast_rl.config.model`,
``inference``, ``env``, ``critic``, ``rollout``, ``learner``, ``algorithm``, ``cluster``,
``eval``, ``pipeline``); this module assembles them into the root :class:`CastConfig` and
re-exports every public name, so ``from cast_rl.config.schema import X`` reaches them all.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from cast_rl.config.algorithm import (
    KL_PENALTIES,
    LOSS_AGG_MODES,
    OUTCOME_ADV_ESTIMATORS,
    TREE_POINTS,
    AlgorithmConfig,
)
from cast_rl.config.cluster import (
    ClusterConfig,
    LoggingConfig,
)
from cast_rl.config.critic import (
    LABELLER_BACKENDS,
    CriticConfig,
    LabellerConfig,
    TeacherConfig,
)
from cast_rl.config.env import (
    DOMAIN_NAMES,
    RETAIL_AUTH_CHOICES,
    RETAIL_TASK_KINDS,
    USER_TRAITS,
    EnvConfig,
    UserConfig,
)
from cast_rl.config.eval import (
    EvalConfig,
)
from cast_rl.config.inference import (
    THINKING_MODES,
    VLLM_LORA_RANKS,
    InferenceConfig,
)
from cast_rl.config.learner import (
    LORA_TARGETS_ALL_LINEAR,
    LearnerConfig,
    LoraConfig,
)
from cast_rl.config.model import (
    ModelConfig,
    TinyConfig,
)
from cast_rl.config.pipeline import (
    CRITIC_LOSSES,
    LR_SCHEDULES,
    OPTIONAL_STAGES,
    PIPELINE_STAGES,
    STAGE_DIRS,
    PipelineConfig,
    ScheduleConfig,
)
from cast_rl.config.rollout import (
    ReplayBufferConfig,
    RolloutConfig,
)

__all__ = [
    "AlgorithmConfig",
    "CRITIC_LOSSES",
    "CastConfig",
    "ClusterConfig",
    "CriticConfig",
    "DOMAIN_NAMES",
    "EnvConfig",
    "EvalConfig",
    "InferenceConfig",
    "KL_PENALTIES",
    "LABELLER_BACKENDS",
    "LORA_TARGETS_ALL_LINEAR",
    "LOSS_AGG_MODES",
    "LR_SCHEDULES",
    "LabellerConfig",
    "LearnerConfig",
    "LoggingConfig",
    "LoraConfig",
    "ModelConfig",
    "OPTIONAL_STAGES",
    "OUTCOME_ADV_ESTIMATORS",
    "PIPELINE_STAGES",
    "PipelineConfig",
    "RETAIL_AUTH_CHOICES",
    "RETAIL_TASK_KINDS",
    "ReplayBufferConfig",
    "RolloutConfig",
    "STAGE_DIRS",
    "ScheduleConfig",
    "THINKING_MODES",
    "TREE_POINTS",
    "TeacherConfig",
    "TinyConfig",
    "USER_TRAITS",
    "UserConfig",
    "VLLM_LORA_RANKS",
    "field_docs",
]


@dataclass(frozen=True)
class CastConfig:
    """The whole run."""

    run_dir: str = "runs/default"
    """Everything a run writes goes under this directory."""
    seed: int = 0
    """Global seed."""
    policy: ModelConfig = field(default_factory=ModelConfig)
    """The policy model."""
    inference: InferenceConfig = field(default_factory=InferenceConfig)
    """The engine serving the policy."""
    env: EnvConfig = field(default_factory=EnvConfig)
    """The tool-calling environment."""
    user: UserConfig = field(default_factory=UserConfig)
    """The user simulator."""
    critic: CriticConfig = field(default_factory=CriticConfig)
    """The critic and the verification loop."""
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    """The optional teacher that rewrites rationales and can collect the training trajectories."""
    labeller: LabellerConfig = field(default_factory=LabellerConfig)
    """Who labels actions: the rules, the LLM verifier or both (stage label, ``cast-rl label``)."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Rollout workers."""
    replay: ReplayBufferConfig = field(default_factory=ReplayBufferConfig)
    """The replay buffer."""
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    """FSDP learner workers."""
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    """Policy optimisation."""
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    """Metrics logging."""
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    """Ray cluster."""
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    """The CAST pipeline's stages."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """Evaluation (pass^k, critic budget sweep)."""

    def __post_init__(self) -> None:
        if not self.run_dir:
            raise ValueError("run_dir='' is not allowed; give a directory for the run's outputs")
        if self.critic.backend == "trained" and not self.pipeline.trains_critic:
            raise ValueError(
                "critic.backend='trained' is not allowed with pipeline.critic_train_steps=0: no critic "
                "is trained; set pipeline.critic_train_steps > 0 (or pipeline.critic_epochs) or choose "
                "critic.backend=rule or model"
            )
        if self.eval.unseen_seeds and self.env.data_dir:
            raise ValueError(
                f"eval.unseen_seeds={self.eval.unseen_seeds} is not allowed with env.data_dir="
                f"{self.env.data_dir!r}: unseen databases are generated retail; leave env.data_dir empty"
            )
        if self.env.generated_seed in self.eval.unseen_seeds:
            raise ValueError(
                f"eval.unseen_seeds={self.eval.unseen_seeds} is not allowed with env.generated_seed="
                f"{self.env.generated_seed}: training reads that database, so it is not unseen"
            )
        if self.pipeline.collect_policy == "teacher" and not self.teacher.model.path:
            raise ValueError("pipeline.collect_policy='teacher' is not allowed with teacher.model.path=''; give "
                             "the teacher's model directory (or endpoint model name) in teacher.model.path")
        if self.pipeline.collect_policy == "teacher" and self.teacher.react and self.teacher.inference.thinking == "off":
            raise ValueError("teacher.react=true is not allowed with teacher.inference.thinking='off' and "
                             "pipeline.collect_policy='teacher': the thought is a <think> block; set "
                             "teacher.inference.thinking=keep or strip, or teacher.react=false")
        if self.critic.engine == "shared_with_policy" and (self.inference.backend != "vllm"
                                                          or not self.inference.max_lora_rank):
            raise ValueError(
                f"critic.engine=shared_with_policy is not allowed with inference.backend={self.inference.backend!r} "
                f"and inference.max_lora_rank={self.inference.max_lora_rank}: the policy's vllm engine serves the "
                "critic as an adapter; set inference.max_lora_rank to the critic adapter's rank or more"
            )
        lora = self.learner.lora
        if lora.enabled and lora.sync == "adapter" and (self.inference.backend != "vllm"
                                                         or self.inference.max_lora_rank < (lora.rank or 0)):
            raise ValueError(
                f"learner.lora.sync=adapter is not allowed with inference.backend={self.inference.backend!r} and "
                f"inference.max_lora_rank={self.inference.max_lora_rank}: the policy engines serve the adapter, "
                f"so they must be vllm with inference.max_lora_rank >= learner.lora.rank={lora.rank}"
            )
        n = self.rollout.trials_per_task if self.eval.trials is None else self.eval.trials
        if self.eval.k_values and max(self.eval.k_values) > n:
            raise ValueError(
                f"eval.k_values={self.eval.k_values} is not allowed with n={n} trials per task; "
                "every k must be <= n (raise eval.trials or rollout.trials_per_task)"
            )


def field_docs(cls: type) -> dict[str, str]:
    """Field name -> docstring, read from the class source (shown by ``config show --doc``)."""
    import ast
    import inspect
    import textwrap

    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for node, nxt in zip(body, body[1:]):
        is_field = isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
        if is_field and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant):
            docs[node.target.id] = " ".join(str(nxt.value.value).split())
    return {f.name: docs.get(f.name, "") for f in fields(cls)}
