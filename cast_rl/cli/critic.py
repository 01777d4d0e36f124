"""``cast-rl critic ...``: build critic training data from labels; evaluate a critic.

Run::

    cast-rl critic build-data --labels L.jsonl --trajectories T.jsonl --out DIR
    cast-rl critic eval --data DIR/heldout.parquet --backend rule

``build-data`` writes ``DIR/train.parquet`` and ``DIR/heldout.parquet`` (see
:mod:`cast_rl.critique.datasets`); ``eval`` prints detection recall, precision, false-positive
rate, error-type accuracy, rationale leakage rate and unparsable rate of a critic backend on a
labelled Parquet file (the pipeline compares critics this way after ``05_train_critic``).
"""

from __future__ import annotations

import argparse
import json


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("critic", help="critic: build training data, evaluate")
    sub = parser.add_subparsers(dest="critic_command", required=True)

    build = sub.add_parser("build-data", help="labels + trajectories -> balanced Parquet splits")
    build.add_argument("--labels", required=True)
    build.add_argument("--trajectories", required=True)
    build.add_argument("--out", required=True, help="output directory")
    build.add_argument("--heldout-fraction", type=float, default=0.2)
    build.add_argument("--seed", type=int, default=0)
    build.set_defaults(func=_build)

    ev = sub.add_parser("eval", help="detection metrics of a critic on a labelled Parquet file")
    ev.add_argument("--data", required=True, help="a Parquet file written by build-data")
    ev.add_argument("--backend", default="rule", choices=["rule", "model"])
    ev.add_argument("--model-path", default=None, help="for --backend model: the critic model")
    ev.set_defaults(func=_eval)


def _build(args: argparse.Namespace) -> int:
    from cast_rl.critique.datasets import build_critic_data

    summary = build_critic_data(
        args.labels, args.trajectories, args.out, heldout_fraction=args.heldout_fraction, seed=args.seed
    )
    print(json.dumps(summary, indent=2))
    return 0


def _eval(args: argparse.Namespace) -> int:
    import asyncio

    from cast_rl.critique.datasets import read_requests
    from cast_rl.critique.metrics import evaluate_verifier
    from cast_rl.critique.verifier import ModelVerifier, RuleVerifier

    rows = read_requests(args.data)

    async def run() -> dict[str, float]:
        if args.backend == "rule":
            return await evaluate_verifier(RuleVerifier(), rows)
        if not args.model_path:
            raise SystemExit("--backend model needs --model-path")
        from cast_rl.config.schema import InferenceConfig
        from cast_rl.inference.vllm_engine import VLLMEngine

        engine = VLLMEngine(args.model_path, InferenceConfig(temperature=0.0))
        try:
            return await evaluate_verifier(ModelVerifier(engine), rows)
        finally:
            await engine.close()

    print(json.dumps(asyncio.run(run()), indent=2))
    return 0
