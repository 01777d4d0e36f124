"""``cast-rl benefit``: the critic's net benefit at flagged actions and the verification budget chosen.

Run::

    cast-rl benefit configs/quickstart.yaml policy.path=runs/x/policy \\
        pipeline.benefit_budgets=[0,1,2,3] pipeline.benefit_trials=4 pipeline.benefit_k=2 --out runs/x/benefit

    # validation without a trained policy: the deferential noisy teacher on generated retail tasks,
    # the rule critic wrongly flagging 30% of valid proposals
    cast-rl benefit env.data_dir=D env.split=train policy.path=TOKENIZER_DIR \\
        pipeline.benefit_policy=noisy_expert pipeline.benefit_error_rate=1.0 pipeline.benefit_fp_rate=0.3 --out OUT

Each task of ``env.split`` (the first ``pipeline.benefit_tasks``; None: all) runs
``pipeline.benefit_trials`` trials at every budget of ``pipeline.benefit_budgets`` with the critic
of ``critic.*`` (in this process; wrapped to add false positives at ``pipeline.benefit_fp_rate``).
At every flagged action both branches (the proposal run unchecked, the revision) continue
``pipeline.benefit_k`` times.  ``--out`` gets ``benefit.jsonl`` (one record per flag) and
``budgets.json`` (pass^k, tokens and pass^k per 1000 tokens per budget, the chosen budget);
``benefit/`` metrics go to the metrics logger.  See :mod:`cast_rl.eval.net_benefit`.
"""

from __future__ import annotations

import argparse
import sys

from cast_rl.config.args import add_config_arguments, config_from_args


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "benefit", help="the critic's net benefit at flagged actions; pass^k per token per budget; the budget chosen"
    )
    add_config_arguments(parser, example="pipeline.benefit_budgets=[0,1,2]")
    parser.add_argument("--out", required=True, help="directory for benefit.jsonl and budgets.json")
    parser.set_defaults(func=_benefit)


def _benefit(args: argparse.Namespace) -> int:
    import asyncio
    from dataclasses import replace

    from cast_rl.critique.service import build_verifier
    from cast_rl.envs.setup import load_env_data
    from cast_rl.envs.users import user_engine
    from cast_rl.eval.net_benefit import measure_benefit
    from cast_rl.telemetry.metrics import MetricsLogger

    cfg = config_from_args(args)
    data = load_env_data(cfg)
    tasks = list(range(len(data.tasks(cfg.env.split))))
    tasks = tasks[: cfg.pipeline.benefit_tasks]

    async def run():  # noqa: ANN202
        verifier = build_verifier(cfg.critic, {data.domain: data.tools})
        users, complete = user_engine(cfg.user, seed=cfg.seed)
        engine = None
        try:
            if cfg.pipeline.benefit_policy == "noisy_expert":
                tokenizer, engine_for = _noisy_expert(cfg, data)
            else:
                from cast_rl.inference import build_engine

                engine = build_engine(cfg.policy.path, cfg.inference, seed=cfg.seed, dtype=cfg.policy.dtype)
                tokenizer, engine_for = engine.tokenizer, lambda _spec: engine
            return await measure_benefit(cfg, data, tasks, engine_for, verifier, tokenizer, out_dir=args.out,
                                         user_complete=complete)
        finally:
            for closeable in (engine, users, verifier):
                close = getattr(closeable, "close", None)
                if close is not None:
                    await close()

    report = asyncio.run(run())
    m = report.metrics
    print(f"benefit: {int(m['benefit/flags'])} flagged actions ({int(m['benefit/false_positive_flags'])} valid by "
          f"the labeller), helped {int(m['benefit/helped'])}, harmed {int(m['benefit/harmed'])}, unchanged "
          f"{int(m['benefit/unchanged'])} of {int(m['benefit/branch_pairs'])} branch pairs -> {args.out}",
          file=sys.stderr)
    k = str(report.passk_k)
    for budget, row in report.budgets.items():
        print(f"  B={budget}: pass^{k} {row['passk'][k]:.3f}, {row['tokens_per_episode']:.0f} tokens/episode "
              f"({row['critic_tokens_per_episode']:.0f} critic, {row['critic_tokens']}), pass^{k} per 1k tokens "
              f"{row['passk_per_1k_tokens'][k]:.3f}", file=sys.stderr)
    print(f"chosen verification budget: {report.chosen_budget} (max pass^{k} per token)", file=sys.stderr)
    with MetricsLogger(replace(cfg.logging, run_name=cfg.logging.run_name or "benefit"), cfg.run_dir,
                       job_type="benefit") as logger:
        logger.log(m)
    return 0


def _noisy_expert(cfg, data):  # noqa: ANN001, ANN202
    """The deferential noisy teacher and the tokenizer at ``policy.path`` it writes its turns with."""
    from transformers import AutoTokenizer

    from cast_rl.config import ConfigError
    from cast_rl.eval.net_benefit import noisy_expert_policy

    if not cfg.policy.path:
        raise ConfigError("policy.path='' is not allowed with pipeline.benefit_policy=noisy_expert; give a "
                          "directory holding the tokenizer the teacher writes its turns with")
    tokenizer = AutoTokenizer.from_pretrained(cfg.policy.path)
    return tokenizer, noisy_expert_policy(cfg, data, tokenizer)
