"""Learner configuration: the FSDP learner workers (optimiser, batching, checkpoints, placement) and
their optional LoRA adapters.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from cast_rl.config._checks import _check_choice, _check_positive, _check_ray_resources

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

    def with_micro_batch(self, wanted: int) -> LearnerConfig:
        """This config with the largest micro-batch of at most ``wanted`` sequences that divides a
        rank's share of global_batch_size (the constraint above)."""
        per_rank = self.global_batch_size // self.num_workers
        size = max(d for d in range(1, min(wanted, per_rank) + 1) if per_rank % d == 0)
        return dataclasses.replace(self, micro_batch_size=size)
