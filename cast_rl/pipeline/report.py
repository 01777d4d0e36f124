"""The pipeline's final report: pass^k before and after training, each configuration side by side.

It merges the ``eval_before`` and ``eval_after`` reports (schema of :mod:`cast_rl.eval.report`)
into one report whose configurations are labelled ``before: ...`` and ``after: ...``, written with
the same writer (``report.json``, ``summary.md``, pass^k-against-k plots) under
``<run_dir>/report/``, plus a short ``headline`` for the console.  Each configuration's label says
which critic it used (``critic B=1 (rule)`` before training, ``(trained)`` after, with
``critic.backend=trained``).  The held-out critic comparison of ``05_train_critic``
(``heldout_metrics.json``, :mod:`cast_rl.eval.critic_heldout`) is copied in as ``critic_heldout``
and gets its own table in ``summary.md``; so does the optional stage benefit's ``budgets.json``
(:mod:`cast_rl.eval.net_benefit`: pass^k per token per verification budget, the budget chosen)
as ``benefit``, with one headline line.

Paired differences with 95% intervals (:mod:`cast_rl.eval.uncertainty`) compare every
configuration after training with itself before, and with the critic against without it within
each stage.  The trajectory viewer of the whole run (:mod:`cast_rl.viewer`) is written to
``<run_dir>/report/viewer/index.html``, and ``summary.md`` links to it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cast_rl.envs.setup import is_unseen
from cast_rl.eval.critic_heldout import heldout_markdown
from cast_rl.eval.report import write_report
from cast_rl.eval.uncertainty import critic_comparisons, interval_metadata, stage_comparisons
from cast_rl.viewer import build_viewer
from cast_rl.viewer.sources import ViewerInputError

logger = logging.getLogger(__name__)


STAGE_TAGS = {"eval_before": "before", "eval_critic": "before", "eval_after": "after", "eval_rule": "after",
              "eval_rft": "rft"}
"""The tag each evaluation stage's configurations get in the merged report (their ``stage``)."""
TAG_LABELS = {"before": "before", "after": "after", "rft": "after (RFT)"}


def merge_reports(reports: dict[str, dict[str, Any] | None]) -> dict[str, Any]:
    """One report of the evaluation stages' reports (``stage -> report``, :data:`STAGE_TAGS`).

    A configuration is named ``<tag>_<name>``, with ``_trained`` when the trained critic was in
    the loop (``before_critic_b1`` is the rule critic before training, ``before_critic_b1_trained``
    the trained one, ``after_critic_b1_trained`` after training), so that ``after - before``
    pairs each configuration with the same critic, and ``CAST - RFT`` pairs CAST's after-training
    configuration with the RFT arm's."""
    merged: dict[str, Any] = {"schema_version": 1, "configurations": []}
    for stage, tag in STAGE_TAGS.items():
        report = reports.get(stage)
        if report is None:
            continue
        merged["success"] = report["success"]
        for config in report["configurations"]:
            trained = "_trained" if str(config.get("critic_used", "")).startswith("trained") else ""
            merged["configurations"].append(
                {**config, "name": f"{tag}_{config['name']}{trained}", "label": f"{TAG_LABELS[tag]}: {config['label']}",
                 "stage": tag}
            )
    configs = merged["configurations"]
    merged["uncertainty"] = interval_metadata()
    merged["comparisons"] = (stage_comparisons(configs) + stage_comparisons(configs, "after", "rft", "CAST - RFT")
                             + critic_comparisons(configs))
    return merged


def headline(report: dict[str, Any]) -> list[str]:
    """The console's summary: one line per configuration and domain/split (pass^1..pass^n; an
    unseen database's own group only when no pooled ``<domain>/unseen`` stands for it), the
    critic-in-the-loop figures of each configuration with a critic (correction rate, resistance,
    false-positive rate, unparsable rate), the paired after - before and CAST - RFT
    differences, tokens per character, then the held-out critics."""
    lines = []
    for config in report["configurations"]:
        for group, values in config["groups"].items():
            if is_unseen(values["split"]) and f"{values['domain']}/unseen" in config["groups"]:
                continue
            cis = values.get("pass^k_ci", {})
            cells = "  ".join(f"{k}={v:.3f}" + (f" [{cis[k][0]:.2f},{cis[k][1]:.2f}]" if k in cis else "")
                              for k, v in values["pass^k"].items())
            lines.append(f"{config['label']:<38} {group:<14} {cells}")
    for config in report["configurations"]:
        if config["verification_budget"]:
            m = config["critic"]
            lines.append(f"{config['label']:<38} critic in the loop: " + "  ".join(
                f"{name}={_rate(m.get(key))}" for name, key in (
                    ("correction", "correction_rate"), ("resistance", "resistance"),
                    ("fpr", "false_positive_rate"), ("unparsable", "unparsable_rate"))))
    for c in report.get("comparisons", []):
        if c["kind"] in ("after - before", "CAST - RFT") and not is_unseen(c["group"].split("/", 1)[1]):
            cells = "  ".join(f"{k}={d['difference']:+.3f} [{d['ci'][0]:+.2f},{d['ci'][1]:+.2f}]"
                              for k, d in c["pass^k"].items() if k in ("pass^1", "pass^4"))
            lines.append(f"{c['kind']:<14} {c['label']:<60} {c['group']:<14} {cells}")
    fit = report.get("tokenizer")
    if fit:
        lines.append(f"tokens per character: training database {fit['training']:.3f}, unseen "
                     + ", ".join(f"{s} {v:.3f}" for s, v in fit["unseen"].items())
                     + f" (ratio {fit['unseen_over_training']:.3f})")
    if report.get("benefit"):
        lines.append(benefit_line(report["benefit"]))
    for name, m in ((report.get("critic_heldout") or {}).get("critics") or {}).items():
        lines.append(f"held-out critic {name:<16} recall={m['recall']:.3f}  fpr={m['false_positive_rate']:.3f}  "
                     f"type_acc={m['type_accuracy']:.3f}  leakage={m['leakage_rate']:.3f}  "
                     f"unparsable={m['unparsable_rate']:.3f}")
    return lines


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def benefit_line(benefit: dict[str, Any]) -> str:
    """``verification budget chosen: B=1 by max pass^1 per 1k tokens (...)`` from ``budgets.json``."""
    k = str(benefit["passk_k"])
    cells = "  ".join(f"B={b}: {row['passk_per_1k_tokens'][k]:.3f}" for b, row in benefit["budgets"].items())
    return (f"verification budget chosen: B={benefit['chosen_budget']} by max pass^{k} per 1k tokens "
            f"({cells}; false-positive rate {benefit['fp_rate']})")


def benefit_markdown(benefit: dict[str, Any]) -> list[str]:
    """The ``summary.md`` section of stage benefit: the choice, then one row per budget."""
    k = str(benefit["passk_k"])
    lines = ["## The critic's net benefit and the verification budget chosen", "", benefit_line(benefit) + ".",
             f"Critic tokens counted as {benefit['critic_tokens']}.", "",
             f"| budget | pass^{k} | tokens/episode | critic tokens/episode | pass^{k} per 1k tokens |",
             "|---|---|---|---|---|"]
    for b, row in benefit["budgets"].items():
        lines.append(f"| {b}{' (chosen)' if int(b) == benefit['chosen_budget'] else ''} | {row['passk'][k]:.3f} | "
                     f"{row['tokens_per_episode']:.0f} | {row['critic_tokens_per_episode']:.0f} | "
                     f"{row['passk_per_1k_tokens'][k]:.3f} |")
    m = benefit.get("metrics", {})
    if "benefit/branch_pairs" in m:
        lines += ["", f"At {int(m['benefit/flags'])} flagged actions ({int(m['benefit/false_positive_flags'])} valid "
                  f"by the labeller), {int(m['benefit/branch_pairs'])} branch pairs: helped {int(m['benefit/helped'])}, "
                  f"harmed {int(m['benefit/harmed'])}, unchanged {int(m['benefit/unchanged'])}."]
    return lines + [""]


def write_pipeline_report(
    run_dir: Path, evals: Mapping[str, Path | None], heldout: Path | None = None,
    benefit: Path | None = None, tokenizer: dict[str, Any] | None = None,
) -> dict[str, Path]:
    """``evals``: evaluation stage -> its ``report.json`` (:data:`STAGE_TAGS`); ``tokenizer``:
    :func:`cast_rl.eval.tokenizer_fit.tokenizer_fit` of the policy's tokenizer."""
    load = lambda p: json.loads(p.read_text()) if p is not None and p.exists() else None  # noqa: E731
    merged = merge_reports({stage: load(path) for stage, path in evals.items()})
    if tokenizer is not None:
        merged["tokenizer"] = tokenizer
    viewer = _viewer(run_dir)
    if viewer is not None:
        merged["viewer"] = viewer.relative_to(run_dir / "report").as_posix()
    critics = load(heldout)
    if critics is not None:
        merged["critic_heldout"] = critics
    budgets = load(benefit)
    if budgets is not None:
        merged["benefit"] = budgets
    paths = write_report(merged, run_dir / "report")
    if viewer is not None:
        paths["viewer"] = viewer
    if critics is not None:
        with paths["summary"].open("a") as f:
            f.write("\n" + "\n".join(heldout_markdown(critics)))
    if budgets is not None:
        with paths["summary"].open("a") as f:
            f.write("\n" + "\n".join(benefit_markdown(budgets)))
    if tokenizer is not None:
        with paths["summary"].open("a") as f:
            f.write("\n## The tokenizer on unseen databases\n\n| text | tokens per character |\n|---|---|\n"
                    f"| training database ({tokenizer['text']}) | {tokenizer['training']:.4f} |\n"
                    + "".join(f"| {split} | {v:.4f} |\n" for split, v in tokenizer["unseen"].items())
                    + f"\nUnseen over training: {tokenizer['unseen_over_training']:.4f}.\n")
    return paths


def _viewer(run_dir: Path) -> Path | None:
    """Write the run's trajectory viewer under ``report/viewer``; None when there are no episodes."""
    try:
        return build_viewer(run_dir, run_dir / "report" / "viewer")
    except ViewerInputError as exc:  # e.g. a run of the warm-start alone
        logger.info("no trajectory viewer: %s", exc)
        return None
