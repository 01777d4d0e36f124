"""Inference engines (vLLM, OpenAI-compatible) behind one interface."""

from cast_rl.inference.base import Completion, GenerationTimeout, InferenceEngine, Sampling
from cast_rl.inference.expert import ExpertTokenizer

__all__ = ["Completion", "GenerationTimeout", "InferenceEngine", "Sampling", "build_engine"]


def build_engine(model_path: str, cfg, seed: int = 0, dtype: str | None = None,
                 weight_transfer: bool = False) -> InferenceEngine:
    """The engine named by ``cfg.backend`` (an :class:`InferenceConfig`); ``dtype`` is the served
    model's ``model.dtype`` (vLLM only; None keeps vLLM's choice: float32 on CPUs, the
    checkpoint's dtype on GPUs); ``weight_transfer``: a vLLM engine takes updates through vLLM's
    weight-transfer API (``rollout.weight_sync=vllm_api``)."""
    if cfg.backend == "vllm":
        from cast_rl.inference.vllm_engine import VLLMEngine

        return VLLMEngine(model_path, cfg, seed=seed, dtype=dtype, weight_transfer=weight_transfer)
    if cfg.backend == "openai":
        from cast_rl.inference.openai_engine import OpenAIEngine

        return OpenAIEngine(model_path, cfg)
    if cfg.backend == "expert":  # a policy of its own: only the tokenizer is loaded
        return ExpertTokenizer(model_path)
    raise ValueError(f"inference.backend={cfg.backend!r} is not allowed; choose vllm, openai or expert")
