"""``cast-rl label``: label every assistant action of rollout trajectories.

Run::

    cast-rl label [CONFIG] env.domain=retail env.data_dir=../shared/benchmarks/retail \\
        --trajectories runs/x/trajectories.jsonl --out runs/x/labels.jsonl

The domain data is the config's (``env.domain``, ``env.data_dir``, ``env.now``: the same keys the
rollouts ran with).  One output line per action: ``{"trajectory_index", "message_index", "action",
"verdict", "error_type", "rationale", "source"}`` (``source``: the rule that decided).  A summary (counts by verdict and error type, rationales
dropped by the leakage check) goes to stderr and to the metrics logger (``label/`` metrics under
``run_dir``, W&B mode ``logging.mode``).  With ``teacher.enabled=true`` a teacher LLM
(``teacher.inference.backend=openai`` for an OpenAI-compatible endpoint, or vllm for a local model at
``teacher.model.path``) rewrites each rationale; rewrites that fail the leakage check are
discarded and counted.  ``labeller.backend=llm`` (or ``hybrid``) labels with the LLM verification
framework of :mod:`cast_rl.critique.llm_verifier` instead of (or beside) the hand-written rules,
served by ``labeller.model.path`` in this process.
"""

from __future__ import annotations

import argparse
import sys

from cast_rl.config.args import add_config_arguments, config_from_args


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("label", help="label trajectory actions (verdict, error type, rationale)")
    add_config_arguments(parser, example="env.data_dir=../shared/benchmarks/retail")
    parser.add_argument("--trajectories", required=True, help="rollout trajectories (JSON Lines)")
    parser.add_argument("--out", required=True, help="labels to write (JSON Lines)")
    parser.set_defaults(func=_label)


def _label(args: argparse.Namespace) -> int:
    import asyncio
    from dataclasses import replace

    from cast_rl.critique.labeller import label_file, read_for_labelling, write_labels
    from cast_rl.critique.llm_verifier import label_trajectories
    from cast_rl.critique.teacher import rewrite_labels
    from cast_rl.envs.setup import load_env_data
    from cast_rl.telemetry.metrics import MetricsLogger

    cfg = config_from_args(args)
    data = load_env_data(cfg)
    if cfg.labeller.backend == "rules":
        labels, trajectories, labeller = label_file(data, args.trajectories, args.out)
        stats, metrics = labeller.stats, labeller.stats.metrics()
    else:
        trajectories = read_for_labelling(data, args.trajectories)
        labels, stats, metrics = asyncio.run(label_trajectories(cfg.labeller, data, trajectories, seed=cfg.seed))
        write_labels(args.out, labels)
    if cfg.teacher.enabled:
        metrics.update(asyncio.run(rewrite_labels(cfg.teacher, data, labels, trajectories, seed=cfg.seed)))
        write_labels(args.out, labels)
    print(f"labelled {len(labels)} actions of {stats.trajectories} trajectories -> {args.out}",
          file=sys.stderr)
    print("verdicts: " + ", ".join(f"{k}={v}" for k, v in sorted(stats.verdicts.items())), file=sys.stderr)
    print("error types: " + ", ".join(f"{k}={v}" for k, v in sorted(stats.error_types.items())),
          file=sys.stderr)
    print(f"leakage drops: {stats.leakage_drops}", file=sys.stderr)
    if "label/verifier_calls" in metrics:
        print(f"verifier ({cfg.labeller.backend}): {metrics['label/verifier_calls']} calls, parse rate "
              f"{metrics['label/verifier_parse_rate']:.3f}, leakage rate {metrics['label/verifier_leakage_rate']:.3f}",
              file=sys.stderr)
    if "label/teacher_rewritten" in metrics:
        print(f"teacher: {metrics['label/teacher_rewritten']} rewritten, "
              f"{metrics['label/teacher_discarded']} discarded", file=sys.stderr)
    logging_cfg = replace(cfg.logging, run_name=cfg.logging.run_name or "label")
    with MetricsLogger(logging_cfg, cfg.run_dir, job_type="label") as logger:
        logger.log(metrics)
    return 0
