"""Versioned weight sync: checksums and the vLLM worker extension that loads weights in place.

The learner publishes ``(version, state_dict, checksum)``; a rollout worker verifies the checksum
before it loads anything and refuses versions that are not newer than what it serves.  The
worker extension is vLLM's documented mechanism for RL weight updates: vLLM mixes
:class:`WeightSyncExtension` into its GPU/CPU worker, and ``collective_rpc`` calls its methods by
name inside every worker process.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import torch


class WeightSyncError(RuntimeError):
    """A weight update was refused or did not take effect; never ignored."""


def state_checksum(state: Mapping[str, torch.Tensor]) -> str:
    """sha256 over parameter names, dtypes, shapes and bytes, in sorted name order."""
    digest = hashlib.sha256()
    for name in sorted(state):
        tensor = state[name].detach().to("cpu").contiguous()
        digest.update(name.encode())
        digest.update(str(tensor.dtype).encode())
        digest.update(str(tuple(tensor.shape)).encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return digest.hexdigest()


Packed = list[tuple[str, str, tuple[int, ...], bytes]]


def pack_state(state: Mapping[str, torch.Tensor]) -> Packed:
    """Tensors as (name, dtype, shape, raw bytes): what crosses vLLM's engine-process RPC intact."""
    packed = []
    for name, tensor in state.items():
        t = tensor.detach().to("cpu").contiguous()
        raw = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
        packed.append((name, str(t.dtype).removeprefix("torch."), tuple(t.shape), raw))
    return packed


def unpack_state(packed: Packed) -> dict[str, torch.Tensor]:
    out = {}
    for name, dtype, shape, raw in packed:
        dt = getattr(torch, dtype)
        flat = torch.frombuffer(bytearray(raw), dtype=dt) if raw else torch.empty(0, dtype=dt)
        out[name] = flat.reshape(shape)
    return out


class WeightSyncExtension:
    """Mixed into vLLM workers (``worker_extension_cls``); methods run in the worker process."""

    def cast_rl_load_weights(self, packed: Packed) -> int:
        """Load Hugging Face-named weights in place; returns how many tensors were loaded."""
        state = unpack_state(packed)
        # reload_weights (not model.load_weights) re-applies the post-load processing that
        # backends such as the CPU one do to linear layers, so an in-place reload is exact.
        self.model_runner.reload_weights(  # type: ignore[attr-defined]
            weights_iterator=iter(state.items()), is_checkpoint_format=True
        )
        return len(state)

    def cast_rl_param_checksum(self) -> str:
        """A checksum of the served parameters (vLLM names), to see that an update landed."""
        model = self.model_runner.model  # type: ignore[attr-defined]
        return state_checksum(dict(model.named_parameters()))
