"""Make sure the models a run needs exist (building tiny offline ones for the embedded default)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from cast_rl.config.schema import CastConfig, ModelConfig
from cast_rl.models.aliases import alias_tokens
from cast_rl.models.tiny import corpus_from_paths, make_tiny_model

logger = logging.getLogger(__name__)


def ensure_model(model: ModelConfig, corpus_dirs: list[Path] | None = None) -> Path:
    """The model directory; with ``make_tiny_if_missing`` a tiny model is built there first."""
    path = Path(model.path)
    if (path / "config.json").exists():
        return path
    if not model.make_tiny_if_missing:
        raise FileNotFoundError(
            f"model directory {path} has no config.json; give a local Hugging Face model "
            "directory or set make_tiny_if_missing=true"
        )

    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    make_tiny_model(tmp, model.tiny, seed=model.seed, extra_corpus=corpus_from_paths(corpus_dirs or []),
                    extra_tokens=alias_tokens(list(model.entity_aliases)))
    try:
        tmp.rename(path)
    except OSError:  # built concurrently elsewhere
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return path


def training_corpus(data_dir: Path) -> list[Path]:
    """What a tiny model's tokenizer is trained on: the training data directory (database,
    policy, tool schemas, tasks).  An unseen database (``eval.unseen_seeds``) is a directory of its
    own and never part of it, so its text is tokenized as a new database's would be.

    The in-database test split stays in: left out, the quickstart's warm-start (which sits near a
    cliff) trained into a policy that fine-tuning then broke (pass^1 0.0 after training).
    """
    return [Path(data_dir)]


def ensure_policy_model(cfg: CastConfig, data) -> Path:  # noqa: ANN001 (DomainData: envs sits above models)
    return ensure_model(cfg.policy, training_corpus(data.data_dir))
