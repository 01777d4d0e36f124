"""Held-out critic quality: several critics side by side on the critic data's held-out split.

The pipeline runs it right after ``05_train_critic`` (``pipeline.critic_heldout_eval``) on
``04_critic_data/heldout.parquet``, whose rows carry the labeller's verdict and error type for
each action, and writes ``05_train_critic/heldout_metrics.json``; the final report copies it.
The critics compared are, by name:

- ``rule``: the visible-information rule critic (in-process);
- ``base``: ``critic.model`` before training (the model the stage starts from);
- ``trained``: the model the stage saved.

Model critics are served by critic-service actors (one critic's engines at a time, each shut
down before the next starts).  Per critic (see :func:`cast_rl.critique.metrics.evaluate_verifier`):
``recall``, ``precision``, ``false_positive_rate``, ``contested_false_positive_rate`` (each
action's false-positive rate weighted by its invalid examples), ``type_accuracy``, ``leakage_rate``,
``unparsable_rate`` and ``examples``, plus ``critic``: what answered (``rule`` or the model
directory).  Logged to W&B as ``critic/heldout/<critic>/<metric>``.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from cast_rl.critique.metrics import evaluate_verifier
from cast_rl.critique.verifier import Verifier, VerifyRequest

logger = logging.getLogger(__name__)

HELDOUT_METRICS = (
    "recall", "precision", "false_positive_rate", "contested_false_positive_rate", "type_accuracy", "leakage_rate",
    "unparsable_rate",
)
"""The metrics reports show, in this order (each also under ``critic/<name>`` in the raw output)."""

VerifierFactory = Callable[[], Awaitable[tuple[Verifier, str]]]
"""Starts a critic: returns (verifier, what answered); a verifier with ``close()`` is closed after."""


async def compare_critics(
    critics: dict[str, VerifierFactory],
    rows: list[tuple[VerifyRequest, str, str]],
    tools: dict[str, list[dict[str, Any]]] | None = None,
    batch_size: int = 32,
) -> dict[str, dict[str, Any]]:
    """Critic name -> held-out metrics, one critic at a time (each closed before the next)."""
    out: dict[str, dict[str, Any]] = {}
    for name, start in critics.items():
        verifier, answered_by = await start()
        try:
            metrics = await evaluate_verifier(verifier, rows, batch_size=batch_size, tools=tools)
        finally:
            close = getattr(verifier, "close", None)
            if close is not None:
                await close()
        out[name] = {"critic": answered_by, **{k.removeprefix("critic/"): v for k, v in metrics.items()}}
        logger.info("held-out critic %s (%s): %s", name, answered_by,
                    ", ".join(f"{k}={out[name][k]:.3f}" for k in HELDOUT_METRICS))
    return out


def flat_heldout_metrics(results: dict[str, dict[str, Any]]) -> dict[str, float]:
    """``critic/heldout/<critic>/<metric>`` for the metrics logger."""
    return {
        f"critic/heldout/{name}/{key}": float(value)
        for name, metrics in results.items()
        for key, value in metrics.items()
        if isinstance(value, (int, float))
    }


def heldout_markdown(heldout: dict[str, Any]) -> list[str]:
    """The summary's section: one row per critic (``heldout`` as written to heldout_metrics.json)."""
    critics = heldout.get("critics") or {}
    if not critics:
        return []
    header = ["critic", "answered by", "examples", *(k.replace("_", " ") for k in HELDOUT_METRICS)]
    lines = [
        "## Critic on the held-out split", "",
        f"{heldout.get('examples', 0)} labelled actions of `{Path(str(heldout.get('data', ''))).name}` "
        "(invalid is the positive class; leakage: readable critiques citing what the agent could not see).", "",
        "| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|",
    ]
    for name, m in critics.items():
        cells = [name, f"`{m['critic']}`", str(int(m.get("examples", 0))),
                 *(f"{float(m[k]):.3f}" if k in m else "-" for k in HELDOUT_METRICS)]  # "-": a run before the metric
        lines.append("| " + " | ".join(cells) + " |")
    return lines + [""]
