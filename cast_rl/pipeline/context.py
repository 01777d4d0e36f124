"""What the pipeline's stages share: the run directory, the data, and long-lived Ray groups.

Every stage writes under ``<run_dir>/<NN>_<stage>/`` and ends by writing ``DONE.json`` with its
summary; a stage whose ``DONE.json`` exists is skipped, so a run resumes where it stopped and a
stage reruns when its directory is removed.  Starting vLLM engines is the expensive part, so one
rollout group serves every stage that generates (evaluation, collection, GRPO) and follows the
policy through weight updates.

The critic a stage uses is :meth:`PipelineContext.critic_config`: ``critic.backend=rule`` or
``model`` as configured; with ``trained``, the model ``05_train_critic`` saved once it exists
(stages 06 and later), and the rule critic before that (``01_eval_before`` runs before any critic
is trained).  The rollout group is switched to it whenever a stage asks for the group.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from cast_rl.config import ConfigError, to_dict
from cast_rl.config.schema import STAGE_DIRS, CastConfig, CriticConfig
from cast_rl.critique.service import critic_description
from cast_rl.envs.core import DomainData
from cast_rl.records import Trajectory
from cast_rl.rollout.collector import Collector, Tree, Unit
from cast_rl.rollout.teacher import teacher_rollout_config

logger = logging.getLogger(__name__)


def train_split_config(cfg: CastConfig, data: DomainData) -> CastConfig:
    """``cfg`` on the pipeline's training tasks: split ``pipeline.train_split``, its first
    ``pipeline.train_tasks`` tasks (``env.task_indices`` empty, i.e. all of them, when None)."""
    pipe = cfg.pipeline
    n = len(data.tasks(pipe.train_split))
    indices = [] if pipe.train_tasks is None else list(range(min(pipe.train_tasks, n)))
    return dataclasses.replace(cfg, env=dataclasses.replace(cfg.env, split=pipe.train_split, task_indices=indices))


class StageGroup(Collector, Protocol):
    """What the stages need of a rollout group (``actors.rollout_group.RolloutGroup``): the one
    collector protocol (:class:`~cast_rl.rollout.collector.Collector`), streaming trajectories
    to ``on_done`` as they arrive, and the switches between stages."""

    critic: CriticConfig
    cfg: CastConfig
    """The config its episodes run under (``env``: the domain it serves now)."""

    def collect(self, units: list[Unit], tree: Tree | None = None, *,
                on_done: Callable[[Trajectory], None] | None = None) -> list[Trajectory]: ...

    def set_domain(self, cfg: CastConfig) -> None: ...

    def load_policy(self, cfg: CastConfig) -> bool: ...

    def set_critic(self, critic: CriticConfig) -> str: ...

    def set_verification_budget(self, budget: int) -> None: ...

    def metrics(self) -> dict[str, float]: ...

    def benefit(self, cfg: CastConfig, tasks: list[int], split: str) -> Any: ...

    def shutdown(self) -> None: ...


def stage_dir(cfg: CastConfig, stage: str) -> Path:
    """``<run_dir>/<NN>_<stage>`` (:data:`~cast_rl.config.schema.STAGE_DIRS`)."""
    return Path(cfg.run_dir) / STAGE_DIRS[stage]


def trained_critic_path(cfg: CastConfig) -> Path:
    """Where ``05_train_critic`` saves the critic it trains."""
    return stage_dir(cfg, "train_critic") / "model"


def warmstart_model_path(cfg: CastConfig) -> Path:
    """Where ``00_warmstart`` saves the warm-started policy (``pipeline.critic_base=warmstart``
    trains the critic from it)."""
    return stage_dir(cfg, "warmstart") / "model"


def resolve_critic(cfg: CastConfig) -> CriticConfig:
    """The critic to serve now (module docstring): for ``critic.backend=trained``, the model
    ``05_train_critic`` saved once it exists (``critic.model.path`` then points at it), else the
    rule critic; other backends as configured."""
    critic = cfg.critic
    if critic.backend != "trained":
        return critic
    trained = trained_critic_path(cfg)
    if not (trained / "config.json").exists():
        return dataclasses.replace(critic, backend="rule")
    model = dataclasses.replace(critic.model, path=str(trained), make_tiny_if_missing=False)
    return dataclasses.replace(critic, model=model)


SERVING_STAGES = ("eval_critic", "collect_with_critic", "optimise", "eval_after")
"""The stages that run episodes with :func:`resolve_critic`'s critic in the loop (with
``critic.backend=trained``: the critic stage train_critic trained)."""


def check_trained_critic(cfg: CastConfig) -> None:
    """With ``critic.backend=trained``, a stage that serves the critic needs stage train_critic to
    run first or to have run (else it would quietly get the rule critic): raise ConfigError."""
    serving = [s for s in SERVING_STAGES if s in cfg.pipeline.stages]
    if (cfg.critic.backend != "trained" or not serving or "train_critic" in cfg.pipeline.stages
            or (trained_critic_path(cfg) / "config.json").exists()):
        return
    raise ConfigError(
        f"config error: critic.backend=trained but pipeline.stages has no train_critic and "
        f"{trained_critic_path(cfg)} does not exist, so {serving[0]} would have no trained critic; "
        "add train_critic to pipeline.stages or choose critic.backend=rule or model"
    )


def check_critic_base(cfg: CastConfig) -> None:
    """With ``pipeline.critic_base=warmstart``, stage train_critic needs the warm-started policy:
    the warmstart stage runs first or saved it earlier, else ConfigError before anything starts."""
    pipe = cfg.pipeline
    if (pipe.critic_base != "warmstart" or "train_critic" not in pipe.stages or not pipe.trains_critic
            or ("warmstart" in pipe.stages and pipe.warmstart_epochs > 0)
            or (warmstart_model_path(cfg) / "config.json").exists()
            or (stage_dir(cfg, "train_critic") / "DONE.json").exists()):
        return
    raise ConfigError(
        f"config error: pipeline.critic_base=warmstart but {warmstart_model_path(cfg)} does not exist "
        "and no warm-start runs before train_critic (pipeline.stages with warmstart, pipeline.warmstart_epochs > 0); "
        "add it or set pipeline.critic_base=model"
    )


def check_chosen_budget(cfg: CastConfig) -> None:
    """With ``pipeline.use_chosen_budget``, stage benefit must run in this pipeline or have run
    (its ``DONE.json`` holds the chosen budget): raise ConfigError otherwise."""
    pipe = cfg.pipeline
    if not pipe.use_chosen_budget or "benefit" in pipe.stages or (stage_dir(cfg, "benefit") / "DONE.json").exists():
        return
    raise ConfigError(
        f"config error: pipeline.use_chosen_budget=True but pipeline.stages has no benefit and "
        f"{stage_dir(cfg, 'benefit')} holds no finished run, so there is no chosen budget; add benefit to "
        "pipeline.stages or set pipeline.use_chosen_budget=false"
    )


class PipelineContext:
    """Directories, data, the current policy and the shared rollout group of one pipeline run."""

    def __init__(self, cfg: CastConfig, data: DomainData,
                 make_group: Callable[..., StageGroup]) -> None:
        self.cfg = cfg
        self.make_group = make_group
        """Starts the shared rollout group for a config (the launcher passes ``RolloutGroup``), or
        with ``kind="teacher"`` the teacher's workers (:meth:`teacher_group`)."""
        self.data = data
        self.root = Path(cfg.run_dir)
        self.root.mkdir(parents=True, exist_ok=True)
        self.policy_path = Path(cfg.policy.path)
        """The policy the next stage starts from (the warm-start and optimise stages move it)."""
        self.policy_version = 0
        self._group: StageGroup | None = None
        self._kept: list[Any] = []
        self.group_name = cfg.logging.group or self.root.name
        check_trained_critic(cfg)
        check_critic_base(cfg)
        check_chosen_budget(cfg)
        (self.root / "config.json").write_text(json.dumps(to_dict(cfg), indent=2))

    def stage_dir(self, stage: str) -> Path:
        return stage_dir(self.cfg, stage)

    def done(self, stage: str) -> dict[str, Any] | None:
        marker = self.stage_dir(stage) / "DONE.json"
        return json.loads(marker.read_text()) if marker.exists() else None

    def begin(self, stage: str) -> Path:
        """A clean directory for a stage that did not finish (a half-written one is discarded)."""
        out = self.stage_dir(stage)
        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        return out

    def finish(self, stage: str, summary: dict[str, Any]) -> dict[str, Any]:
        (self.stage_dir(stage) / "DONE.json").write_text(json.dumps(summary, indent=2))
        return summary

    def chosen_budget(self) -> int:
        """The verification budget stage benefit chose (its ``DONE.json``); raises if it has not run."""
        summary = self.done("benefit")
        if summary is None or "chosen_budget" not in summary:
            raise RuntimeError(f"pipeline.use_chosen_budget=True but stage benefit has not finished "
                               f"({self.stage_dir('benefit')} has no DONE.json with a chosen_budget)")
        return int(summary["chosen_budget"])

    def collect_budget(self) -> int:
        """The budget of the stages that collect with the critic: ``pipeline.collect_budget``, or
        with ``pipeline.use_chosen_budget`` the one stage benefit chose."""
        pipe = self.cfg.pipeline
        return self.chosen_budget() if pipe.use_chosen_budget else pipe.collect_budget

    def eval_budgets(self) -> list[int]:
        """``eval.verification_budgets``, plus the chosen budget with ``pipeline.use_chosen_budget``."""
        budgets = list(self.cfg.eval.verification_budgets)
        if self.cfg.pipeline.use_chosen_budget and self.chosen_budget() not in budgets:
            budgets.append(self.chosen_budget())
        return budgets

    def critic_config(self) -> CriticConfig:
        """The critic stages use now: :func:`resolve_critic` of the run's config."""
        return resolve_critic(self.cfg)

    def with_policy(self, cfg: CastConfig | None = None) -> CastConfig:
        """A config whose policy is the current one, whose critic is :meth:`critic_config` (and
        the pipeline's W&B group)."""
        cfg = cfg or self.cfg
        return dataclasses.replace(
            cfg,
            policy=dataclasses.replace(cfg.policy, path=str(self.policy_path)),
            critic=dataclasses.replace(self.critic_config(), verification_budget=cfg.critic.verification_budget),
            logging=dataclasses.replace(cfg.logging, group=self.group_name),
        )

    def train_cfg(self) -> CastConfig:
        """The config of the training stages: the pipeline's train split."""
        return train_split_config(self.with_policy(), self.data)

    def rollout_group(self) -> StageGroup:
        """The shared rollout group, started on first use with the current policy, consulting
        the current critic (:meth:`critic_config`)."""
        if self._group is None:
            self._group = self.make_group(self.with_policy())
        critic = self.with_policy().critic
        if self._group.critic != critic:
            logger.info("rollout group: critic is now %s", critic_description(critic))
            self._group.set_critic(critic)
        return self._group

    def teacher_group(self) -> StageGroup:
        """Rollout workers that play the teacher model on the training tasks
        (``pipeline.collect_policy=teacher``, :mod:`cast_rl.rollout.teacher`), on ``teacher.num_gpus``
        each: the shared rollout group gives its resources back first.  The caller shuts them down."""
        self.release_rollout_group()
        return self.make_group(teacher_rollout_config(self.train_cfg()), kind="teacher")

    def sync_policy(self, version: int, state_ref: Any, checksum: str) -> None:
        """Publish new weights to the rollout group (if one runs) under a new version."""
        if self._group is not None:
            self._group.update_weights(version, state_ref, checksum)
        self.policy_version = version

    def policy_moved(self, path: Path) -> None:
        """The current policy is now the HF directory ``path`` (only between stages, never
        mid-collection): a running group loads its weights in place when its engines serve the
        same model (:meth:`StageGroup.load_policy`), else it is shut down and restarted lazily
        on ``path``."""
        self.policy_path = path
        if self._group is not None and self._group.load_policy(self.with_policy()):
            logger.info("rollout group: now serves %s (loaded in place)", path)
            return
        self.release_rollout_group()

    def release_rollout_group(self) -> None:
        """Shut the shared rollout group down (its resources are needed elsewhere); the next
        :meth:`rollout_group` starts it again from :attr:`policy_path`."""
        if self._group is not None:
            self._group.shutdown()
            self._group = None

    def keep(self, handle: Any) -> None:
        """Hold a Ray actor handle until the run ends: an actor a stage starts for later stages
        (the trained critic's service, which the rollout workers join by name) lives as long as
        a handle to it does."""
        self._kept.append(handle)

    def close(self) -> None:
        self.release_rollout_group()
        self._kept.clear()
