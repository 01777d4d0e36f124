"""Learning-rate schedules of supervised phases: warm-up and decay per step, epochs as steps,
resume, and the config keys (values worked out by hand in each test)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from cast_rl.config import load_config
from cast_rl.config.schema import LoggingConfig, ScheduleConfig
from cast_rl.learner.engine import LearnerEngine
from cast_rl.learner.sample import Sample
from cast_rl.learner.schedule import PhaseSchedule, epoch_steps, phase_steps
from cast_rl.telemetry import MetricsLogger

COS_QUARTER = (1 + math.sqrt(0.5)) / 2  # (1 + cos(pi/4)) / 2 = 0.8535...
COS_THREE_QUARTERS = (1 - math.sqrt(0.5)) / 2  # (1 + cos(3 pi/4)) / 2 = 0.1464...


def _lrs(config: ScheduleConfig, lr: float, total: int) -> list[float]:
    """The rate of each of ``total`` steps on a one-parameter AdamW."""
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=123.0)
    schedule = PhaseSchedule.build(optimizer, config, lr, total)
    out = []
    for _ in range(total):
        out.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()
    return out


def test_warmup_then_cosine_decay_per_step() -> None:
    # warm-up of 2: t/2 for t = 0, 1; then (1 + cos(pi (t - 2) / 4)) / 2 for t = 2..5
    got = _lrs(ScheduleConfig(name="cosine", warmup_steps=2), 1e-2, 6)
    expected = [0.0, 0.5e-2, 1e-2, COS_QUARTER * 1e-2, 0.5e-2, COS_THREE_QUARTERS * 1e-2]
    assert got == pytest.approx(expected, abs=1e-12)


def test_linear_constant_and_min_lr_schedules() -> None:
    # warm-up 1 of 5, then 1 - (t - 1) / 4
    assert _lrs(ScheduleConfig(name="linear", warmup_steps=1), 2.0, 5) == pytest.approx([0.0, 2.0, 1.5, 1.0, 0.5])
    assert _lrs(ScheduleConfig(), 3e-4, 4) == [3e-4] * 4  # the default: today's constant rate
    assert _lrs(ScheduleConfig(name="constant_with_warmup", warmup_ratio=0.5), 1.0, 4) == pytest.approx(
        [0.0, 0.5, 1.0, 1.0])
    # no warm-up, floor 0.2: 0.2 + 0.8 x (1 + cos(pi t / 4)) / 2
    got = _lrs(ScheduleConfig(name="cosine_with_min_lr", min_lr_rate=0.2), 1.0, 4)
    assert got == pytest.approx([1.0, 0.2 + 0.8 * COS_QUARTER, 0.6, 0.2 + 0.8 * COS_THREE_QUARTERS])


def test_warmup_ratio_rounds_up_and_epochs_count_steps() -> None:
    assert ScheduleConfig("cosine", warmup_ratio=0.3).warmup(10) == 3  # not 4 from 3.0000000000000004
    assert ScheduleConfig("cosine", warmup_ratio=0.1).warmup(25) == 3  # 2.5 rounded up
    assert ScheduleConfig("cosine", warmup_steps=7).warmup(25) == 7
    assert epoch_steps(3, 50, 16) == 10  # 150 samples / 16 = 9.4
    assert epoch_steps(2, 8, 8) == 2
    assert epoch_steps(1, 3, 16) == 1
    assert phase_steps(7, None, 50, 16) == 7
    assert phase_steps(0, 3, 50, 16) == 10


def _batch(n: int = 2) -> list[Sample]:
    return [Sample(f"s{i}", "supervised", list(range(5 + i, 15 + i)), [0] * 4 + [1] * 6, [0.0] * 10)
            for i in range(n)]


def test_engine_steps_the_schedule_reports_the_rate_and_resumes_it(make_cfg, tmp_path: Path) -> None:
    """The lr each step ran at, a checkpoint after step 3, and a fresh engine loading it: the
    last three steps run at the same rates as without the interruption."""
    schedule = ScheduleConfig(name="cosine", warmup_steps=2)
    engine = LearnerEngine(make_cfg())
    engine.set_schedule(schedule, 1e-2, 6)
    batch = _batch()
    first = [engine.train_step(batch)["lr"] for _ in range(3)]
    engine.save_checkpoint(tmp_path / "ckpt")
    rest = [engine.train_step(batch)["lr"] for _ in range(3)]
    assert first + rest == pytest.approx([0.0, 0.5e-2, 1e-2, COS_QUARTER * 1e-2, 0.5e-2, COS_THREE_QUARTERS * 1e-2])

    resumed = LearnerEngine(make_cfg())
    resumed.load_checkpoint(tmp_path / "ckpt", version=3)
    assert resumed.schedule is not None and resumed.schedule.config == schedule
    assert [resumed.train_step(batch)["lr"] for _ in range(3)] == pytest.approx(rest, abs=1e-15)

    resumed.set_lr(1e-3)  # the GRPO phase: a constant rate, the schedule ends
    assert resumed.schedule is None
    assert [resumed.train_step(batch)["lr"] for _ in range(2)] == [1e-3, 1e-3]


def test_a_checkpoint_without_a_schedule_keeps_the_constant_rate(make_cfg, tmp_path: Path) -> None:
    engine = LearnerEngine(make_cfg("learner.lr=2e-3"))
    engine.train_step(_batch())
    engine.save_checkpoint(tmp_path / "ckpt")
    assert not (tmp_path / "ckpt" / "schedule.pt").exists()
    resumed = LearnerEngine(make_cfg("learner.lr=2e-3"))
    resumed.set_schedule(ScheduleConfig(name="linear"), 5e-3, 4)
    resumed.load_checkpoint(tmp_path / "ckpt", version=1)
    assert resumed.schedule is None and resumed.train_step(_batch())["lr"] == 2e-3


class _RecordingLearner:
    """Records what train_supervised asks of a learner (the loop's logic only)."""

    def __init__(self) -> None:
        self.schedules: list[tuple[ScheduleConfig, float, int]] = []
        self.seen: list[str] = []
        self.lr = 0.0

    def set_schedule(self, schedule: ScheduleConfig, lr: float, total_steps: int) -> None:
        self.schedules.append((schedule, lr, total_steps))

    def train_step(self, batch: list[Sample]) -> dict[str, float]:
        self.seen += [s.key for s in batch]
        return {"supervised_loss": 1.0, "grad_norm": 1.0, "tokens_per_s": 1.0, "lr": self.lr}


def test_train_supervised_sets_the_phase_schedule_and_epochs_see_each_sample_that_often(tmp_path: Path) -> None:
    from cast_rl.learner.loop import train_supervised

    samples = [Sample(f"k{i}", "supervised", [1, 2, 3], [0, 1, 1], [0.0] * 3) for i in range(12)]
    learner = _RecordingLearner()
    schedule = ScheduleConfig(name="cosine", warmup_ratio=0.1)
    steps = epoch_steps(3, len(samples), 4)
    assert steps == 9
    with MetricsLogger(LoggingConfig(mode="disabled"), tmp_path) as log:
        losses = train_supervised(learner, samples, steps, 4, log, "critic", seed=0, schedule=schedule, lr=5e-6)
    assert len(losses) == 9
    assert learner.schedules == [(schedule, 5e-6, 9)]
    assert sorted(learner.seen) == sorted([s.key for s in samples] * 3)  # three whole passes
    with MetricsLogger(LoggingConfig(mode="disabled"), tmp_path) as log, pytest.raises(ValueError, match="lr"):
        train_supervised(learner, samples, 1, 4, log, "critic", seed=0, schedule=schedule)


@pytest.mark.parametrize(("overrides", "message"), [
    (["pipeline.sft_steps=200", "pipeline.sft_epochs=3"],
     r"pipeline.sft_steps=200 is not allowed with pipeline.sft_epochs=3; set one of the two"),
    (["pipeline.critic_train_steps=5", "pipeline.critic_epochs=1"],
     r"pipeline.critic_train_steps=5 is not allowed with pipeline.critic_epochs=1"),
    (["pipeline.critic_epochs=0"], r"pipeline.critic_epochs=0 is not allowed; it must be > 0"),
    (["pipeline.sft_schedule.name=cosine_annealing"], r"_schedule.name='cosine_annealing' is not allowed"),
    (["pipeline.sft_schedule.name=constant", "pipeline.sft_schedule.warmup_ratio=0.1"],
     r"choose constant_with_warmup"),
    (["pipeline.critic_schedule.name=cosine", "pipeline.critic_schedule.warmup_ratio=0.1",
      "pipeline.critic_schedule.warmup_steps=3"], r"warmup_steps=3 is not allowed with warmup_ratio=0.1"),
    (["pipeline.critic_schedule.name=cosine", "pipeline.critic_schedule.min_lr_rate=0.1"],
     r"only cosine_with_min_lr has a floor"),
    (["pipeline.warmstart_schedule.warmup_ratio=1.0"], r"warmup_ratio=1.0 is not allowed; it must be in \[0, 1\)"),
])
def test_schedule_and_epoch_config_errors_name_the_keys(overrides: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_config(None, overrides)


def test_defaults_keep_a_constant_rate_and_epochs_count_as_training_the_critic() -> None:
    cfg = load_config(None, [])
    for schedule in (cfg.pipeline.warmstart_schedule, cfg.pipeline.sft_schedule, cfg.pipeline.critic_schedule):
        assert schedule == ScheduleConfig(name="constant", warmup_ratio=0.0, warmup_steps=None, min_lr_rate=0.0)
    assert cfg.pipeline.sft_epochs is None and cfg.pipeline.critic_epochs is None
    assert not cfg.pipeline.trains_critic
    cfg = load_config(None, ["critic.backend=trained", "pipeline.critic_epochs=3"])
    assert cfg.pipeline.trains_critic
