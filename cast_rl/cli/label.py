"""``cast-rl label``: label every assistant action of rollout trajectories.

Run::

    cast-rl label --domain retail --data-dir ../shared/benchmarks/retail \\
        --trajectories runs/x/trajectories.jsonl --out runs/x/labels.jsonl

One output line per action: ``{"trajectory_index", "message_index", "action", "verdict",
"error_type", "rationale"}``.  A summary (counts by verdict and error type, rationales dropped by
the leakage check) goes to stderr and to the metrics logger (``label/`` metrics, W&B offline by
default under ``--run-dir``).  With ``--teacher-endpoint`` (an OpenAI-compatible server) or
``--teacher-model-path`` (a local model served by vLLM), a teacher LLM rewrites each rationale;
rewrites that fail the leakage check are discarded and counted.
"""

from __future__ import annotations

import argparse
import sys


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("label", help="label trajectory actions (verdict, error type, rationale)")
    parser.add_argument("--domain", required=True, choices=["retail", "airline", "telecom", "telehealth"])
    parser.add_argument("--data-dir", required=True, help="the domain data directory the rollouts used")
    parser.add_argument("--trajectories", required=True, help="rollout trajectories (JSON Lines)")
    parser.add_argument("--out", required=True, help="labels to write (JSON Lines)")
    parser.add_argument("--now", default=None, help="ISO time the tools read as now (as in the rollouts)")
    parser.add_argument("--run-dir", default="runs/label", help="where the metrics logger writes")
    parser.add_argument("--wandb-mode", default="offline", choices=["offline", "online", "disabled"])
    parser.add_argument("--teacher-endpoint", default=None, help="OpenAI-compatible base URL")
    parser.add_argument("--teacher-model", default="teacher", help="model name at the endpoint")
    parser.add_argument("--teacher-model-path", default=None, help="local HF model served by vLLM")
    parser.set_defaults(func=_label)


def _label(args: argparse.Namespace) -> int:
    import asyncio

    from cast_rl.config.schema import LoggingConfig
    from cast_rl.critique.labeller import label_file, write_labels
    from cast_rl.envs.core import fixed_clock, load_domain_data
    from cast_rl.telemetry.metrics import MetricsLogger

    clock = fixed_clock(args.now) if args.now else None
    data = load_domain_data(args.domain, args.data_dir, clock=clock)
    labels, trajectories, labeller = label_file(data, args.trajectories, args.out)
    metrics = labeller.stats.metrics()
    if args.teacher_endpoint or args.teacher_model_path:
        rewritten, discarded = asyncio.run(_teach(args, data, labels, trajectories))
        metrics["label/teacher_rewritten"] = rewritten
        metrics["label/teacher_discarded"] = discarded
        write_labels(args.out, labels)
    stats = labeller.stats
    print(f"labelled {len(labels)} actions of {stats.trajectories} trajectories -> {args.out}",
          file=sys.stderr)
    print("verdicts: " + ", ".join(f"{k}={v}" for k, v in sorted(stats.verdicts.items())), file=sys.stderr)
    print("error types: " + ", ".join(f"{k}={v}" for k, v in sorted(stats.error_types.items())),
          file=sys.stderr)
    print(f"leakage drops: {stats.leakage_drops}", file=sys.stderr)
    if "label/teacher_rewritten" in metrics:
        print(f"teacher: {metrics['label/teacher_rewritten']} rewritten, "
              f"{metrics['label/teacher_discarded']} discarded", file=sys.stderr)
    with MetricsLogger(LoggingConfig(mode=args.wandb_mode, run_name="label"), args.run_dir,
                       job_type="label") as logger:
        logger.log(metrics)
    return 0


async def _teach(args: argparse.Namespace, data, labels, trajectories) -> tuple[int, int]:  # noqa: ANN001
    from cast_rl.critique.labeller import teacher_items
    from cast_rl.critique.teacher import OpenAIChat, Teacher

    if args.teacher_endpoint:
        engine = OpenAIChat(args.teacher_endpoint, args.teacher_model)
    else:
        from cast_rl.config.schema import InferenceConfig
        from cast_rl.inference.vllm_engine import VLLMEngine

        engine = VLLMEngine(args.teacher_model_path, InferenceConfig())
    teacher = Teacher(engine)
    try:
        items = teacher_items(data, labels, trajectories)
        results = await teacher.rewrite_many([item for _, item in items])
        for (pos, _), rationale in zip(items, results):
            if rationale is not None:
                labels[pos].rationale = rationale.to_json()
    finally:
        await engine.close()
    return teacher.stats.rewritten, teacher.stats.discarded
