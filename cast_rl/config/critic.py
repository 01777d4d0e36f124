"""Judging and teaching models: the critic that checks the policy's actions before they run, the
optional teacher LLM, and the labeller (rules, LLM verifier or both) of the label stage.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cast_rl.config._checks import _check_choice, _check_positive
from cast_rl.config.inference import InferenceConfig
from cast_rl.config.model import ModelConfig, _check_no_aliases

CRITIC_CHECKS = ("all", "tool_calls", "writes")
"""Which proposals the critic checks (``critic.checks``)."""


@dataclass(frozen=True)
class CriticConfig:
    """The critic that checks actions before they run."""

    backend: str = "rule"
    """rule (visible-information rules), model (the critic LLM at model.path) or trained (in the
    pipeline: the critic trained by stage train_critic, <run_dir>/05_train_critic/model, from
    model.path; stages that run before it is trained use the rule critic)."""
    model: ModelConfig = field(default_factory=lambda: ModelConfig(path="runs/models/tiny-critic"))
    """For backend=model: the critic model; for trained: the base model stage train_critic trains."""
    inference: InferenceConfig = field(
        default_factory=lambda: InferenceConfig(temperature=0.0, max_new_tokens=128)
    )
    """For backend=model or trained: the engine serving the critic."""
    structured: bool = True
    """For backend=model or trained: decode the critic's answer constrained to its format
    (structured decoding of cast_rl.critique.rationale.CRITIQUE_REGEX): every answer parses and
    its verdict agrees with its error type; False samples freely (an answer may be unparsable)."""
    on_unparsable: str = "allow"
    """What an answer the critic's output could not be read as does to the proposal: allow (it
    runs, as with no critic) or reject (sent back for revision like an invalid verdict). Either
    way it is counted (rollout/critic_unparsable)."""
    num_gpus_per_replica: float = 0.0
    """Ray GPUs per critic-service actor of backend=model or trained (set it on GPU clusters)."""
    verification_budget: int = 0
    """Critique-revise rounds per action (0 turns the critic off in rollouts)."""
    num_replicas: int = 1
    """Critic service actors."""
    max_retries: int = 3
    """Retries of a critique request after a service failure."""
    service: bool = False
    """Serve backend=rule from the critic-service actors too (backend=model always uses them);
    False checks rules in-process in each rollout worker."""
    timeout_s: float = 300.0
    """A critique request to a service actor taking longer is retried on the next actor (it
    counts against max_retries); keep it above critic.inference.request_timeout_s."""
    max_concurrency: int = 64
    """Critique requests one critic-service actor serves at once (its Ray ``max_concurrency``);
    a model critic batches them in its engine."""
    max_prompt_chars: int = 24_000
    """For backend=model or trained: the transcript shown to the critic LLM keeps at most this many
    characters (the oldest messages are dropped first; the policy is in its system prompt, see
    system_prompt)."""
    system_prompt: bool = True
    """For backend=model or trained: the critic reads its instructions and the policy (a system
    message) before the conversation and the proposed action; False shows it the conversation and
    the action alone, in its training data and when served.  For a critic trained on its labels,
    which learns the policy and the answer format from them: on the quickstart the 0.8M-parameter
    critic does not learn to compare a cancel's reason with the one its confirmation named behind
    the ~800 tokens of instructions and policy (1,300-token prompts; held-out recall 0.435), and
    learns it from the last 600 characters of the conversation alone (300 steps at 1e-3: recall
    1.0 at false-positive rate 0; docs/quickstart.md, "The CAST-Critic").  Keep True for a critic
    that is only prompted."""
    engine: str = "own"
    """For backend=model or trained: own (the critic-service actors serve the critic on engines of
    their own) or shared_with_policy (each rollout worker's policy engine serves the critic as a
    LoRA adapter beside the policy: one engine and one copy of the base weights per replica; the
    critic's model.path must hold a peft adapter of the policy's model, as a critic trained with
    learner.lora saves in <dir>/adapter, and inference.max_lora_rank must cover its rank)."""
    checks: str = "all"
    """Which proposals the critic checks: all (every well-formed action, tool calls and replies to
    the user), tool_calls (not the replies) or writes (the domain's write tools: the state-changing
    actions one wrong one of which ruins a task, a cancel of the wrong order).  A reply runs
    nothing, and the user answers a bad one; a flag on it costs a revision all the same.  Proposals
    outside the scope run unchecked and leave no verdict on their turn."""
    min_invalid_prob: float = 0.0
    """For backend=model or trained: an "invalid" verdict stands only when the critic gave its
    verdict's first token at least this probability (the token it chose; greedy decoding's
    argmax); below, the action is judged valid and the critique keeps the probability.  A flag
    the critic is unsure of costs the policy a revision.  0 lets every "invalid" stand."""

    def __post_init__(self) -> None:
        _check_choice("critic.backend", self.backend, ("rule", "model", "trained"))
        _check_choice("critic.checks", self.checks, CRITIC_CHECKS)
        if not 0.0 <= self.min_invalid_prob < 1.0:
            raise ValueError(f"critic.min_invalid_prob={self.min_invalid_prob!r} is not allowed; it must be in [0, 1)")
        _check_choice("critic.engine", self.engine, ("own", "shared_with_policy"))
        if self.engine == "shared_with_policy" and self.service:
            raise ValueError("critic.service=true is not allowed with critic.engine=shared_with_policy: the "
                             "rollout workers' own engines serve the critic, no critic-service actor does")
        _check_positive("critic.max_concurrency", self.max_concurrency)
        _check_positive("critic.max_prompt_chars", self.max_prompt_chars)
        _check_choice("critic.on_unparsable", self.on_unparsable, ("allow", "reject"))
        _check_positive("critic.num_gpus_per_replica", self.num_gpus_per_replica, allow_zero=True)
        _check_positive("critic.verification_budget", self.verification_budget, allow_zero=True)
        _check_positive("critic.num_replicas", self.num_replicas)
        _check_positive("critic.max_retries", self.max_retries, allow_zero=True)
        _check_positive("critic.timeout_s", self.timeout_s)


@dataclass(frozen=True)
class TeacherConfig:
    """An optional teacher LLM: it rewrites rule-based rationales in natural language
    (``enabled``) and, with ``pipeline.collect_policy=teacher``, plays stage collect's episodes."""

    enabled: bool = False
    """Rewrite rationales in the label stage (outputs failing the leakage check are dropped)."""
    model: ModelConfig = field(
        default_factory=lambda: ModelConfig(path="", make_tiny_if_missing=False)
    )
    """For inference.backend=vllm: the teacher's local HF directory; for openai: the model name."""
    inference: InferenceConfig = field(
        default_factory=lambda: InferenceConfig(temperature=0.0, max_new_tokens=512)
    )
    """The engine serving the teacher (vllm, or an OpenAI-compatible endpoint)."""
    max_prompt_chars: int = 24_000
    """The transcript shown to the teacher keeps at most this many characters (oldest dropped)."""
    rollouts_per_task: int = 5
    """pipeline.collect_policy=teacher: the teacher's trials per training task (the paper: 5)."""
    collect_temperature: float = 0.7
    """pipeline.collect_policy=teacher: the teacher's sampling temperature (the paper: 0.7)."""
    react: bool = False
    """pipeline.collect_policy=teacher: the teacher's system prompt asks for a short thought in a
    <think> block before each action (ReAct, the paper's teacher; needs inference.thinking=keep or
    strip); the thought is part of the turn the policy trains on."""
    num_workers: int = 1
    """Teacher rollout workers of pipeline.collect_policy=teacher (one teacher engine each)."""
    num_gpus: float = 0.0
    """Ray GPUs of each teacher actor (a collection worker, the rationale service): 0 on CPUs and
    for inference.backend=openai, else inference.tensor_parallel_size (set it on GPU clusters)."""
    num_cpus: float = 1.0
    """Ray CPUs of each teacher actor."""

    def __post_init__(self) -> None:
        _check_positive("teacher.max_prompt_chars", self.max_prompt_chars)
        _check_positive("teacher.rollouts_per_task", self.rollouts_per_task)
        _check_positive("teacher.collect_temperature", self.collect_temperature, allow_zero=True)
        _check_positive("teacher.num_workers", self.num_workers)
        _check_positive("teacher.num_cpus", self.num_cpus, allow_zero=True)
        _check_no_aliases("teacher", self.model)
        if self.inference.backend == "expert":
            raise ValueError("teacher.inference.backend='expert' is not allowed; serve the teacher with vllm "
                             "or openai")
        allowed = (0.0,) if self.inference.backend == "openai" else (0.0, float(self.inference.tensor_parallel_size))
        if self.num_gpus not in allowed:
            raise ValueError(
                f"teacher.num_gpus={self.num_gpus!r} is not allowed with teacher.inference.backend="
                f"{self.inference.backend} and tensor_parallel_size={self.inference.tensor_parallel_size}; "
                f"choose {' or '.join(f'{g:g}' for g in allowed)} (the engine's GPUs; 0 on CPUs)")
        if self.enabled and not self.model.path:
            raise ValueError("teacher.model.path='' is not allowed with teacher.enabled=true; "
                             "give the teacher's model directory or endpoint model name")


LABELLER_BACKENDS = ("rules", "llm", "hybrid")
"""Who decides the label stage's verdicts (:mod:`cast_rl.critique.llm_verifier`)."""


@dataclass(frozen=True)
class LabellerConfig:
    """Who labels the actions of the label stage and ``cast-rl label``."""

    backend: str = "rules"
    """rules (the hand-written rules per domain plus the replay against the gold actions), llm (the
    LLM verification framework of cast_rl.critique.llm_verifier: rule and tool extractors,
    hallucination, domain-violation and tool-call checkers that read the gold actions, the outcome
    and the final-state difference, and a final verdict) or hybrid (the rules' verdict where a rule
    fires, the LLM's where none does, and the LLM writes every rationale; a rationale that fails
    the leakage check falls back to the rules' one)."""
    model: ModelConfig = field(default_factory=lambda: ModelConfig(path="", make_tiny_if_missing=False))
    """For backend=llm or hybrid: the verifier's local HF directory (inference.backend=vllm) or the
    endpoint's model name (openai)."""
    inference: InferenceConfig = field(
        default_factory=lambda: InferenceConfig(temperature=0.0, max_new_tokens=384, max_model_len=4096,
                                                request_timeout_s=3600.0, compact_json=True)
    )
    """The engine serving the verifier; every answer is decoded under its role's JSON schema
    (vLLM's structured outputs), so max_new_tokens only has to cover the schemas' string limits.
    A call waits in the engine's queue behind the others (all of a stage are sent at once), hence
    the long request timeout."""
    max_prompt_chars: int = 6000
    """The transcript shown to each role keeps at most this many characters (oldest dropped)."""
    max_concurrency: int = 32
    """LLM calls in flight at once (the engine batches them)."""
    num_gpus: float = 0.0
    """Ray GPUs of the verifier-service actor the pipeline's label stage starts (set it on GPU
    clusters); the CLI runs the verifier in its own process."""
    num_cpus: float = 1.0
    """Ray CPUs of the verifier-service actor."""

    def __post_init__(self) -> None:
        _check_choice("labeller.backend", self.backend, LABELLER_BACKENDS)
        if self.backend != "rules" and not self.model.path:
            raise ValueError(f"labeller.model.path='' is not allowed with labeller.backend={self.backend}; "
                             "give the verifier's model directory or endpoint model name")
        if self.inference.backend == "expert":
            raise ValueError("labeller.inference.backend='expert' is not allowed; serve the verifier "
                             "with vllm or openai")
        _check_positive("labeller.max_prompt_chars", self.max_prompt_chars)
        _check_positive("labeller.max_concurrency", self.max_concurrency)
        _check_positive("labeller.num_gpus", self.num_gpus, allow_zero=True)
        _check_positive("labeller.num_cpus", self.num_cpus, allow_zero=True)
        _check_no_aliases("labeller", self.model)
