"""Learning-rate schedules of a supervised phase (transformers' schedulers), and epochs as steps.

A phase (the warm-start, the policy's fine-tuning, critic training) runs a known number of
optimizer steps.  Its :class:`~cast_rl.config.schema.ScheduleConfig` names one of transformers'
schedules, built by ``transformers.get_scheduler`` on the learner's AdamW: a ``LambdaLR`` that
the learner steps once after every optimizer step, so step ``t`` (from 0) runs at
``lr x lambda(t)``.  With a warm-up of ``w`` steps, ``lambda(t) = t / w`` (the first step runs
at 0, as in transformers' Trainer); after it, cosine is ``(1 + cos(pi x p)) / 2`` with
``p = (t - w) / (total - w)``, linear ``1 - p``, constant 1.

A phase's :class:`PhaseSchedule` is part of the learner's checkpoint (its state dict), so a
resumed run continues the schedule where it stopped.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch

from cast_rl.config.schema import ScheduleConfig


def epoch_steps(epochs: int, samples: int, batch_size: int) -> int:
    """Optimizer steps of ``epochs`` passes over ``samples`` in global batches of ``batch_size``:
    ceil(epochs x samples / batch_size) (the last batch is topped up from the next shuffled pass)."""
    return -(-epochs * samples // batch_size)


def phase_steps(steps: int, epochs: int | None, samples: int, batch_size: int) -> int:
    """A phase's optimizer steps: ``epochs`` passes over its samples when given, else ``steps``
    (the config refuses both at once)."""
    return steps if epochs is None else epoch_steps(epochs, samples, batch_size)


@dataclass
class PhaseSchedule:
    """One phase's schedule on one optimizer: what built it, and transformers' scheduler."""

    config: ScheduleConfig
    lr: float
    """The peak learning rate (the phase's own: warmstart_lr, learner.lr, critic_lr)."""
    total_steps: int
    scheduler: Any
    """The ``torch.optim.lr_scheduler.LambdaLR`` transformers built."""

    @classmethod
    def build(cls, optimizer: torch.optim.Optimizer, config: ScheduleConfig, lr: float, total_steps: int) -> PhaseSchedule:
        """The schedule of a phase of ``total_steps`` steps peaking at ``lr``; sets the rate of the
        next step."""
        from transformers import get_scheduler

        for group in optimizer.param_groups:
            group["lr"] = lr
            # LambdaLR scales initial_lr, and keeps one an earlier scheduler set (setdefault)
            group["initial_lr"] = lr
        extra = {"min_lr_rate": config.min_lr_rate} if config.name == "cosine_with_min_lr" else None
        scheduler = get_scheduler(config.name, optimizer, num_warmup_steps=config.warmup(total_steps),
                                  num_training_steps=total_steps, scheduler_specific_kwargs=extra)
        return cls(config, lr, total_steps, scheduler)

    def step(self) -> None:
        """After an optimizer step: the rate of the next one."""
        self.scheduler.step()

    def state_dict(self) -> dict[str, Any]:
        return {"config": asdict(self.config), "lr": self.lr, "total_steps": self.total_steps,
                "scheduler": self.scheduler.state_dict()}

    @classmethod
    def from_state_dict(cls, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> PhaseSchedule:
        """The schedule :meth:`state_dict` saved, at the step it had reached, on ``optimizer``."""
        schedule = cls.build(optimizer, ScheduleConfig(**state["config"]), state["lr"], state["total_steps"])
        schedule.scheduler.load_state_dict(state["scheduler"])
        for group, lr in zip(optimizer.param_groups, schedule.scheduler.get_last_lr()):
            group["lr"] = lr
        return schedule
