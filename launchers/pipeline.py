"""Run the CAST pipeline, stage by stage, resumable.

    cast-rl pipeline configs/quickstart.yaml [key=value ...]
    python -m launchers.pipeline configs/quickstart.yaml            # the module ray job submit runs
    ray job submit --address http://HEAD:8265 --working-dir . -- \\
        python -m launchers.pipeline configs/paper/qwen3_4b_1x8gpu.yaml cluster.address=auto

Stages (``pipeline.stages``; see :mod:`launchers.stages`) write under ``run_dir``; a stage
with a ``DONE.json`` is skipped, so rerunning the command resumes a stopped run.  Each stage is its
own W&B run, all in one group (``logging.group``, default the run directory's name).  The last
lines printed say where the report, plots and W&B runs are.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

from actors.rollout_group import RolloutGroup
from cast_rl.config.schema import PIPELINE_STAGES, CastConfig
from cast_rl.envs.core import DomainData
from cast_rl.envs.setup import load_env_data, unseen_data_dirs
from cast_rl.eval.tokenizer_fit import tokenizer_fit
from cast_rl.models.setup import ensure_policy_model
from cast_rl.pipeline.context import PipelineContext
from cast_rl.pipeline.report import STAGE_TAGS, headline, write_pipeline_report
from launchers import commands
from launchers.cluster import check_resources, init_ray
from launchers.stages import STAGES

logger = logging.getLogger(__name__)


def run_pipeline(cfg: CastConfig) -> dict[str, Any]:
    """Run every configured stage in order; returns the stage summaries and report paths."""
    t0 = time.perf_counter()
    data = load_env_data(cfg)
    ensure_policy_model(cfg, data)
    init_ray(cfg, parts=actor_parts(cfg))
    if teacher_parts(cfg):  # the teacher's actors run once the policy's rollout group is released
        check_resources(cfg, teacher_parts(cfg))
    ctx = PipelineContext(cfg, data, make_group=RolloutGroup)
    try:
        summaries = run_stages(ctx, cfg.pipeline.stages, STAGES)
    finally:
        ctx.close()
    report = write_pipeline_report(
        ctx.root,
        {stage: ctx.stage_dir(stage) / "report.json" for stage in STAGE_TAGS if stage in summaries},
        ctx.stage_dir("train_critic") / "heldout_metrics.json" if "train_critic" in summaries else None,
        ctx.stage_dir("benefit") / "budgets.json" if "benefit" in summaries else None,
        tokenizer=_tokenizer_fit(cfg, data, ctx.policy_path),
    )
    result = {
        "run_dir": str(ctx.root),
        "stages": summaries,
        "report": str(report["report"]),
        "summary": str(report["summary"]),
        "plots": sorted(str(v) for k, v in report.items() if k.startswith("plot:")),
        "viewer": str(report["viewer"]) if "viewer" in report else None,
        "wandb": str(ctx.root / "wandb"),
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    (ctx.root / "pipeline.json").write_text(json.dumps(result, indent=2))
    result["headline"] = headline(json.loads(Path(report["report"]).read_text()))
    return result


MOVES_POLICY = ("warmstart", "optimise", "optimise_rft")
"""Stages whose ``model`` the later stages start from."""


def run_stages(ctx: Any, stages: list[str], run: dict[str, Any]) -> dict[str, Any]:
    """The stages of ``stages``, in pipeline order (``run[stage](ctx, out)``); returns their
    summaries.  A stage with a ``DONE.json`` is skipped.  Every finished stage that moves the
    policy (:data:`MOVES_POLICY`), listed or not, moves it on a resumed run too, so that a stage
    run on its own in an existing run directory (``pipeline.stages=[eval_critic]``) starts from
    the policy the run holds at that point, not from ``policy.path``."""
    summaries: dict[str, Any] = {}
    for stage in PIPELINE_STAGES:
        summary = ctx.done(stage)
        if stage not in stages:
            if summary is not None and stage in MOVES_POLICY and "model" in summary:
                ctx.policy_moved(Path(summary["model"]))
            continue
        if summary is None:
            logger.info("stage %s: running", stage)
            start = time.perf_counter()
            summary = run[stage](ctx, ctx.begin(stage))
            summary["wall_s"] = round(time.perf_counter() - start, 1)
            ctx.finish(stage, summary)
        else:
            logger.info("stage %s: done earlier, skipped", stage)
            if "model" in summary and stage in MOVES_POLICY:
                ctx.policy_moved(Path(summary["model"]))  # a resumed run starts from it
        summaries[stage] = summary
    return summaries


def _tokenizer_fit(cfg: CastConfig, data: DomainData, policy: Path) -> dict[str, Any] | None:
    """Tokens per character of the training database's text and of each unseen database's
    (:mod:`cast_rl.eval.tokenizer_fit`); None without unseen databases."""
    unseen = unseen_data_dirs(cfg)
    if not unseen:
        return None
    from transformers import AutoTokenizer

    root = data.data_dir
    train = [root / "db", root / f"tasks_{cfg.pipeline.train_split}.json"]
    return tokenizer_fit(AutoTokenizer.from_pretrained(policy), train,
                         {split: [path / "db", path / f"tasks_{split}.json"] for split, path in unseen.items()})


def actor_parts(cfg: CastConfig) -> tuple[str, ...]:
    """The actor kinds alive at the same time in this pipeline (for the resource pre-flight)."""
    pipe = cfg.pipeline
    trains = (
        ("warmstart" in pipe.stages and pipe.warmstart_epochs > 0)
        or ("train_critic" in pipe.stages and pipe.trains_critic)
        or "optimise" in pipe.stages
    )
    return ("rollout", "critic", "learner") if trains else ("rollout", "critic")


def teacher_parts(cfg: CastConfig) -> tuple[str, ...]:
    """The actor kinds alive while the teacher's actors run (collect with
    ``pipeline.collect_policy=teacher``, label with ``teacher.enabled``); empty when none do."""
    pipe = cfg.pipeline
    collects = pipe.collect_policy == "teacher" and "collect" in pipe.stages
    rewrites = cfg.teacher.enabled and "label" in pipe.stages
    return ("critic", "teacher") if collects or rewrites else ()


def print_result(result: dict[str, Any]) -> None:
    print("\npass^k (success: reward within 1e-6 of 1; brackets: 95% interval over tasks)")
    for line in result["headline"]:
        print("  " + line)
    print(f"\nreport:  {result['report']}")
    print(f"summary: {result['summary']}")
    for plot in result["plots"]:
        print(f"plot:    {plot}")
    if result.get("viewer"):
        print(f"trajectory viewer: {result['viewer']}  (open in a browser)")
    print(f"W&B offline runs: {result['wandb']}  (upload: wandb sync {result['wandb']}/offline-run-*)")
    print(f"wall time: {result['wall_s']} s")


def command(args: argparse.Namespace, cfg: CastConfig) -> int:
    """``cast-rl pipeline`` and ``python -m launchers.pipeline`` (:mod:`launchers.commands`)."""
    print_result(run_pipeline(cfg))
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m launchers.pipeline``: the same as ``cast-rl pipeline``."""
    return commands.main("pipeline", command, argv, description=__doc__)


if __name__ == "__main__":
    sys.exit(main())
