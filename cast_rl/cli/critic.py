"""``cast-rl critic ...``: build critic training data from labels; evaluate a critic.

Run::

    cast-rl critic build-data [CONFIG] [pipeline.critic_heldout_fraction=0.2] \\
        --labels L.jsonl --trajectories T.jsonl --out DIR
    cast-rl critic eval [CONFIG] [critic.backend=model critic.model.path=M] --data DIR/heldout.parquet

``build-data`` writes ``DIR/train.parquet`` and ``DIR/heldout.parquet`` (see
:mod:`cast_rl.critique.datasets`), holding out ``pipeline.critic_heldout_fraction`` of the
trajectories with the config's ``seed``, as the pipeline's ``critic_data`` stage does.  ``eval``
prints detection recall, precision, false-positive rate, error-type accuracy, rationale leakage
rate and unparsable rate of the configured critic (``critic.backend``, ``critic.model``,
``critic.inference``) on a labelled Parquet file; the rule critic checks tool arguments against
the tools of the config's domain data (``env.*``), as in rollouts.
"""

from __future__ import annotations

import argparse
import json

from cast_rl.config.args import add_config_arguments, config_from_args


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("critic", help="critic: build training data, evaluate")
    sub = parser.add_subparsers(dest="critic_command", required=True)

    build = sub.add_parser("build-data", help="labels + trajectories -> balanced Parquet splits")
    add_config_arguments(build, example="pipeline.critic_heldout_fraction=0.25")
    build.add_argument("--labels", required=True)
    build.add_argument("--trajectories", required=True)
    build.add_argument("--out", required=True, help="output directory")
    build.set_defaults(func=_build)

    ev = sub.add_parser("eval", help="detection metrics of a critic on a labelled Parquet file")
    add_config_arguments(ev, example="critic.backend=model")
    ev.add_argument("--data", required=True, help="a Parquet file written by build-data")
    ev.set_defaults(func=_eval)


def _build(args: argparse.Namespace) -> int:
    from cast_rl.critique.datasets import build_configured_critic_data

    summary = build_configured_critic_data(config_from_args(args), args.labels, args.trajectories, args.out)
    print(json.dumps(summary, indent=2))
    return 0


def _eval(args: argparse.Namespace) -> int:
    import asyncio

    from cast_rl.critique.datasets import read_requests
    from cast_rl.critique.metrics import evaluate_verifier
    from cast_rl.critique.service import build_verifier
    from cast_rl.envs.setup import load_env_data

    cfg = config_from_args(args)
    rows = read_requests(args.data)
    data = load_env_data(cfg)

    async def run() -> dict[str, float]:
        verifier = build_verifier(cfg.critic, {data.domain: data.tools})
        try:
            return await evaluate_verifier(verifier, rows)
        finally:
            close = getattr(verifier, "close", None)
            if close is not None:
                await close()

    print(json.dumps(asyncio.run(run()), indent=2))
    return 0
