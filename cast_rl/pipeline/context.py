"""What the pipeline's stages share: the run directory, the data, and long-lived Ray groups.

Every stage writes under ``<run_dir>/<NN>_<stage>/`` and ends by writing ``DONE.json`` with its
summary; a stage whose ``DONE.json`` exists is skipped, so a run resumes where it stopped and a
stage reruns when its directory is removed.  Starting vLLM engines is the expensive part, so one
rollout group serves every stage that generates (evaluation, collection, GRPO) and follows the
policy through weight updates.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
from pathlib import Path
from typing import Any

from cast_rl.config import to_dict
from cast_rl.config.schema import PIPELINE_STAGES, CastConfig
from cast_rl.envs.core import DomainData

logger = logging.getLogger(__name__)


class PipelineContext:
    """Directories, data, the current policy and the shared rollout group of one pipeline run."""

    def __init__(self, cfg: CastConfig, data: DomainData) -> None:
        self.cfg = cfg
        self.data = data
        self.root = Path(cfg.run_dir)
        self.root.mkdir(parents=True, exist_ok=True)
        self.policy_path = Path(cfg.policy.path)
        """The policy the next stage starts from (the warm-start and optimise stages move it)."""
        self.policy_version = 0
        self._group: Any = None
        self.group_name = cfg.logging.group or self.root.name
        (self.root / "config.json").write_text(json.dumps(to_dict(cfg), indent=2))

    def stage_dir(self, stage: str) -> Path:
        return self.root / f"{PIPELINE_STAGES.index(stage):02d}_{stage}"

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

    def with_policy(self, cfg: CastConfig | None = None) -> CastConfig:
        """A config whose policy is the current one (and the pipeline's W&B group)."""
        cfg = cfg or self.cfg
        return dataclasses.replace(
            cfg,
            policy=dataclasses.replace(cfg.policy, path=str(self.policy_path)),
            logging=dataclasses.replace(cfg.logging, group=self.group_name),
        )

    def train_cfg(self) -> CastConfig:
        """The config of the training stages: the pipeline's train split."""
        cfg = self.with_policy()
        pipe = self.cfg.pipeline
        n = len(self.data.tasks(pipe.train_split))
        indices = list(range(min(pipe.train_tasks, n))) if pipe.train_tasks else []
        return dataclasses.replace(cfg, env=dataclasses.replace(cfg.env, split=pipe.train_split, task_indices=indices))

    def rollout_group(self) -> Any:
        """The shared rollout group, started on first use with the current policy."""
        if self._group is None:
            from cast_rl.rollout.group import RolloutGroup

            self._group = RolloutGroup(self.with_policy())
        return self._group

    def sync_policy(self, version: int, state_ref: Any, checksum: str) -> None:
        """Publish new weights to the rollout group (if one runs) under a new version."""
        if self._group is not None:
            self._group.update_weights(version, state_ref, checksum)
        self.policy_version = version

    def policy_moved(self, path: Path) -> None:
        """The current policy is now the HF directory ``path``; a running group is restarted
        lazily so that it serves it (only between stages, never mid-collection)."""
        self.policy_path = path
        if self._group is not None:
            self._group.shutdown()
            self._group = None

    def close(self) -> None:
        if self._group is not None:
            self._group.shutdown()
            self._group = None
