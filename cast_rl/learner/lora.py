"""LoRA adapters in the learner (``learner.lora``): peft wrapping and the merged weights it publishes.

With ``learner.lora.rank`` set, :class:`~cast_rl.learner.engine.LearnerEngine` wraps the Hugging
Face model with :func:`wrap` (peft's ``get_peft_model``) before FSDP2 shards it: every base weight
is frozen and only the adapters (``lora_A``, ``lora_B``) train, so the optimizer, its state and a
checkpoint hold the adapters alone.  The KL reference is the same model with its adapters
disabled (no second copy).

Everything downstream of the learner (weight sync into vLLM, the Hugging Face directory a stage
hands to the next) reads the *merged* weights under the plain Hugging Face names: each adapted
weight becomes ``W + scaling x B @ A`` (peft's own ``merge_and_unload`` arithmetic), computed on
the fly from the gathered parameters by :func:`merged`, one module at a time.  The adapter itself
is saved in peft's format beside them (``<model dir>/adapter``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch

from cast_rl.config.schema import LoraConfig

ADAPTER = "default"
"""peft's name of the one adapter the learner trains."""
PEFT_PREFIX = "base_model.model."
"""What peft puts in front of the Hugging Face model's own parameter names."""
ADAPTER_DIR = "adapter"
"""Subdirectory of a saved model directory that holds the adapter (peft format)."""


def wrap(model: torch.nn.Module, cfg: LoraConfig) -> Any:
    """``model`` with fresh LoRA adapters on ``cfg.target_modules`` (base weights frozen); the
    adapters' A matrices are drawn from torch's global RNG (seed it first), B starts at zero."""
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    assert cfg.rank is not None
    return get_peft_model(model, PeftLoraConfig(
        r=cfg.rank, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout,
        target_modules=list(cfg.target_modules), bias="none", task_type="CAUSAL_LM",
    ))


def scalings(model: torch.nn.Module) -> dict[str, float]:
    """Module name (as ``named_modules`` spells it) -> alpha / rank of each adapted layer."""
    from peft.tuners.lora import LoraLayer

    return {name: float(m.scaling[ADAPTER]) for name, m in model.named_modules() if isinstance(m, LoraLayer)}


def plain_name(name: str) -> str:
    """The Hugging Face name of a peft model's base parameter."""
    name = name.removeprefix(PEFT_PREFIX)
    return name.replace(".base_layer.", ".")


def is_adapter(name: str) -> bool:
    return ".lora_A." in name or ".lora_B." in name


def merged(named: Iterable[tuple[str, torch.Tensor]], scale: dict[str, float]) -> Iterator[tuple[str, torch.Tensor]]:
    """(plain name, tensor) for the base weights of a peft model's (name, full tensor) stream,
    each adapted weight merged with its adapter (W + scaling x B @ A).  A module's parameters
    come together in ``named_parameters`` and ``state_dict`` order (base weight, bias, A, B), so
    this holds one module's tensors at most; the output keeps the order of the base names."""
    pending: dict[str, dict[str, tuple[str, torch.Tensor]]] = {}
    for name, tensor in named:
        module = _adapted_module(name, scale)
        if module is None:
            yield plain_name(name), tensor
            continue
        parts = pending.setdefault(module, {})
        parts[name[len(module) + 1:]] = (name, tensor)
        a, b = parts.get(f"lora_A.{ADAPTER}.weight"), parts.get(f"lora_B.{ADAPTER}.weight")
        if a is None or b is None or "base_layer.weight" not in parts:
            continue
        del pending[module]
        for part, (full_name, value) in parts.items():
            if part == "base_layer.weight":
                # peft's get_delta_weight: (B @ A) * scaling, added to W (fan_in_fan_out is False
                # for the Linear layers of Hugging Face decoders)
                delta = (b[1].to(value.dtype) @ a[1].to(value.dtype)) * scale[module]
                yield plain_name(full_name), value + delta
            elif part.startswith("base_layer."):
                yield plain_name(full_name), value
    if pending:
        raise ValueError(f"LoRA modules without both adapter matrices: {sorted(pending)}")


def base_params(named: Iterable[tuple[str, Any]]) -> Iterator[tuple[str, Any]]:
    """(plain name, parameter) of a peft model's base weights: the names and shapes :func:`merged`
    yields, in the same order."""
    for name, param in named:
        if not is_adapter(name):
            yield plain_name(name), param


def saved_name(name: str) -> str:
    """peft's saved name of an adapter parameter (what ``save_pretrained`` writes and vLLM's LoRA
    loader reads): the adapter's own name dropped, ``...q_proj.lora_A.default.weight`` ->
    ``...q_proj.lora_A.weight``."""
    return name.replace(f".lora_A.{ADAPTER}.", ".lora_A.").replace(f".lora_B.{ADAPTER}.", ".lora_B.")


def adapter_config(model: Any) -> dict[str, Any]:
    """The adapter's adapter_config.json as a plain dict (what ``save_pretrained`` writes)."""
    import json

    config = model.peft_config[ADAPTER]
    return json.loads(json.dumps(config.to_dict(), default=lambda v: sorted(v) if isinstance(v, set) else str(v)))


def adapter_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The adapter entries of a peft model's full state dict."""
    return {k: v for k, v in state.items() if is_adapter(k)}


def _adapted_module(name: str, scale: dict[str, float]) -> str | None:
    """The adapted module ``name`` belongs to (its base layer or one of its adapters), or None."""
    for marker in (".base_layer.", ".lora_A.", ".lora_B."):
        if marker in name:
            module = name.split(marker, 1)[0]
            if module in scale:
                return module
    return None
