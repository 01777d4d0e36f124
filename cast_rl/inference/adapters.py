"""LoRA adapters as weight updates: what a learner with ``learner.lora`` sends to an engine.

An :class:`AdapterUpdate` is one adapter at one version: its tensors under peft's own names
(``base_model.model.<module>.lora_A.weight``; what ``peft.get_peft_model_state_dict`` returns and
``save_pretrained`` writes), its peft ``adapter_config.json`` as a dict, and the sha256 of the
tensors (:func:`cast_rl.inference.weight_sync.state_checksum`, the same checksum as a full-weight
update).  For a model of a few hundred million parameters it is megabytes where full weights are
gigabytes.

An engine takes an update only after the checksum of what arrived matches the one the learner
computed, and only when its version is newer than the one it serves under that name
(:meth:`cast_rl.inference.vllm_engine.VLLMEngine.load_adapter`); it writes the adapter as a peft
directory (:func:`write_adapter`), which vLLM's LoRA loader reads.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from cast_rl.inference.weight_sync import WeightSyncError, state_checksum

ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"


@dataclass
class AdapterUpdate:
    """One LoRA adapter at one version (see the module doc)."""

    name: str
    """The adapter's name in the engine: ``policy`` or ``critic``; requests name it in
    :attr:`cast_rl.inference.base.Sampling.adapter`."""
    version: int
    """Rises with every update of this adapter; an engine refuses one not newer than it serves."""
    tensors: dict[str, torch.Tensor]
    """peft's names -> tensors (CPU)."""
    config: dict[str, Any]
    """peft's adapter_config.json (r, lora_alpha, target_modules, ...)."""
    checksum: str = ""
    """sha256 of ``tensors`` computed by the sender (:func:`state_checksum`)."""
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())

    @classmethod
    def build(cls, name: str, version: int, tensors: Mapping[str, torch.Tensor],
              config: Mapping[str, Any]) -> AdapterUpdate:
        """An update with its checksum, tensors moved to the CPU and made contiguous."""
        cpu = {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}
        return cls(name=name, version=version, tensors=cpu, config=dict(config), checksum=state_checksum(cpu))

    def verify(self) -> None:
        """Raise :class:`WeightSyncError` unless the tensors are what the sender checksummed."""
        if not self.tensors:
            raise WeightSyncError(f"adapter {self.name!r} version {self.version} has no tensors")
        got = state_checksum(self.tensors)
        if got != self.checksum:
            raise WeightSyncError(f"adapter {self.name!r} version {self.version}: checksum {got[:12]} of what "
                                  f"arrived differs from the sender's {self.checksum[:12]}; refused")


def write_adapter(directory: str | Path, update: AdapterUpdate) -> Path:
    """``update`` as a peft adapter directory (safetensors weights and adapter_config.json)."""
    from safetensors.torch import save_file

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    save_file(update.tensors, str(out / ADAPTER_WEIGHTS))
    (out / ADAPTER_CONFIG).write_text(json.dumps(update.config, indent=2, default=list))
    return out


def read_adapter(directory: str | Path, name: str, version: int) -> AdapterUpdate:
    """A peft adapter directory (as ``save_pretrained`` writes it) as an update."""
    from safetensors.torch import load_file

    src = Path(directory)
    if not (src / ADAPTER_WEIGHTS).exists() or not (src / ADAPTER_CONFIG).exists():
        raise FileNotFoundError(f"{src} is not a peft adapter directory: it needs {ADAPTER_WEIGHTS} and "
                                f"{ADAPTER_CONFIG}")
    return AdapterUpdate.build(name, version, load_file(str(src / ADAPTER_WEIGHTS)),
                               json.loads((src / ADAPTER_CONFIG).read_text()))
