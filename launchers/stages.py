"""The CAST stages, in order; each reads earlier stages' outputs and writes its own.

    warmstart            expert demonstrations of the train split -> supervised epochs
    eval_before          pass^k of the starting policy, without and with the critic
    collect              several trials per training task
    label                action-level labels, error types and rationales
    critic_data          balanced Parquet critic dataset + held-out split
    train_critic         supervised critic training (pipeline.critic_train_steps or critic_epochs), from
                         critic.model or the warm-started policy (pipeline.critic_base)
    benefit              optional: the critic's net benefit and the verification budget chosen
    collect_with_critic  trials with the critic in the loop (pipeline.collect_budget, or the
                         budget stage benefit chose with pipeline.use_chosen_budget)
    optimise             supervised fine-tuning on critique-corrected successes and/or GRPO
    eval_after           pass^k of the trained policy, without and with the critic
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tqdm import tqdm

from actors.critic_service import (
    CriticServiceClient,
    critic_actor,
    critic_client,
    private_critic_actor,
)
from actors.learner import LearnerGroup
from actors.teacher_service import rewrite_with_service
from actors.verifier_service import label_with_service
from cast_rl.config import to_dict
from cast_rl.config.schema import CriticConfig
from cast_rl.critique.blame import blame_metrics, confirmed_keys, count_failed, write_blame
from cast_rl.critique.datasets import build_configured_critic_data, read_requests
from cast_rl.critique.labeller import label_file, read_for_labelling, write_labels
from cast_rl.critique.service import critic_description
from cast_rl.critique.verifier import RuleVerifier
from cast_rl.envs.setup import episode_units
from cast_rl.envs.users import user_engine
from cast_rl.eval.critic_heldout import HELDOUT_METRICS, compare_critics, flat_heldout_metrics
from cast_rl.eval.net_benefit import (
    BenefitReport,
    measure_benefit,
    noisy_expert_policy,
    write_benefit,
)
from cast_rl.learner.loop import critic_learner_config, train_critic_phase, train_supervised
from cast_rl.learner.sample import Sample
from cast_rl.learner.schedule import phase_steps
from cast_rl.models.setup import ensure_model, training_corpus
from cast_rl.pipeline.context import (
    SERVING_STAGES,
    PipelineContext,
    resolve_critic,
    trained_critic_path,
    warmstart_model_path,
)
from cast_rl.records import EpisodeSummary, Trajectory, read_trajectories, write_trajectories
from cast_rl.rollout.demonstrations import collect_demonstrations
from cast_rl.rollout.noisy_expert import collect_noisy_demonstrations
from cast_rl.rollout.teacher import mark_teacher_trajectory
from cast_rl.rollout.verifiers import build_verifier
from cast_rl.samples.builders import SUPERVISED_KINDS, build_samples
from cast_rl.samples.parquet import supervised_from_parquet
from cast_rl.telemetry import MetricsLogger
from launchers.eval import run_eval
from launchers.train import train_policy

logger = logging.getLogger(__name__)


def _metrics(ctx: PipelineContext, stage: str) -> MetricsLogger:
    cfg = ctx.with_policy()
    log_cfg = dataclasses.replace(cfg.logging, run_name=f"{ctx.group_name}-{stage}")
    return MetricsLogger(log_cfg, ctx.root, config=to_dict(cfg), job_type=stage)


def _supervised(trajs: list[Trajectory], tag: str, every_token: bool = False) -> list[Sample]:
    """Demonstrations as cross-entropy samples: loss on the policy's turns, or on every token
    (``pipeline.warmstart_loss=all``: language modelling of whole transcripts)."""
    return [
        Sample(key=f"{tag}/{t.split}/{t.task_index}/{t.trial}", source="supervised",
               token_ids=list(t.token_ids), loss_mask=[1] * len(t.token_ids) if every_token else list(t.loss_mask),
               logprobs=[0.0] * len(t.token_ids), reward=t.reward, group=tag)
        for t in trajs if any(t.loss_mask)
    ]


def _learner(ctx: PipelineContext, lr: float, model_path: Path | None = None) -> Any:
    """A learner group on ``model_path`` (default: the current policy) at ``lr`` (the critic's:
    :func:`~cast_rl.learner.loop.critic_learner_config`)."""
    cfg = ctx.with_policy()
    policy = dataclasses.replace(cfg.policy, path=str(model_path or ctx.policy_path))
    return LearnerGroup(dataclasses.replace(cfg, policy=policy, learner=dataclasses.replace(cfg.learner, lr=lr)))


def _collect(ctx: PipelineContext, out: Path, budget: int,
             units: list[tuple[str, int, int]] | None = None, group: Any = None) -> list[Trajectory]:
    """Collect ``units`` (default: ``pipeline.collect_trials`` trials of every training task) at
    verification budget ``budget`` into ``<out>/trajectories.jsonl``, streamed as episodes end,
    on ``group`` (default: the shared rollout group)."""
    if units is None:
        cfg = ctx.train_cfg()
        units = episode_units(cfg, ctx.data, trials=cfg.pipeline.collect_trials)
    group = group if group is not None else ctx.rollout_group()
    group.set_verification_budget(budget)
    path = out / "trajectories.jsonl"
    path.write_text("")
    with tqdm(total=len(units), desc=f"collect (budget {budget})", unit="episode") as bar:

        def on_done(traj: Trajectory) -> None:
            write_trajectories(path, [traj], append=True)
            bar.update(1)

        trajs = group.collect(units, on_done=on_done)
    write_trajectories(path, trajs)  # in unit order, complete
    return trajs


def _rollout_summary(trajs: list[Trajectory]) -> dict[str, Any]:
    n = max(len(trajs), 1)
    rounds = [r for t in trajs for r in t.verification_rounds]
    return {
        "episodes": len(trajs),
        "reward_mean": sum(t.reward for t in trajs) / n,
        "critique_rounds": len(rounds),
        "episodes_with_critique": sum(1 for t in trajs if t.verification_rounds),
        "policy_tokens": sum(t.policy_tokens for t in trajs),
    }


# ---------------------------------------------------------------- stages


def warmstart(ctx: PipelineContext, out: Path) -> dict[str, Any]:
    from transformers import AutoTokenizer

    cfg = ctx.train_cfg()
    pipe = cfg.pipeline
    if pipe.warmstart_epochs == 0:
        return {"skipped": "pipeline.warmstart_epochs=0"}
    tok = AutoTokenizer.from_pretrained(ctx.policy_path)
    if pipe.warmstart_teacher == "noisy_expert":
        if ctx.data.spec.name != "retail":
            raise ValueError(f"pipeline.warmstart_teacher=noisy_expert is not allowed with env.domain="
                             f"{ctx.data.spec.name!r}; it demonstrates retail tasks only")
        # Every demonstration is kept, errors included: the policy inherits the teacher's mistakes.
        demos = collect_noisy_demonstrations(
            cfg, ctx.data, tok, pipe.train_split, pipe.warmstart_trials, pipe.warmstart_error_rate,
            tuple(pipe.warmstart_errors), pipe.warmstart_critic_share)
    else:
        demos = collect_demonstrations(cfg, ctx.data, tok, pipe.train_split)
    write_trajectories(out / "demonstrations.jsonl", demos)
    teacher = {"teacher": pipe.warmstart_teacher, "demo_reward_mean": sum(d.reward for d in demos) / max(len(demos), 1),
               "demo_errors": sum(1 for d in demos if d.info.get("teacher_error")),
               "demo_critique_rounds": sum(len(d.verification_rounds) for d in demos)}
    samples = _supervised(demos, "warmstart", every_token=pipe.warmstart_loss == "all")
    batch = cfg.learner.global_batch_size
    steps = max(1, cfg.pipeline.warmstart_epochs * len(samples) // batch)
    learner = _learner(ctx, cfg.pipeline.warmstart_lr)
    try:
        with _metrics(ctx, "warmstart") as log:
            losses = train_supervised(learner, samples, steps, batch, log, "warmstart", cfg.learner.seed,
                                      schedule=pipe.warmstart_schedule, lr=pipe.warmstart_lr)
        model = learner.save_hf(out / "model")
    finally:
        learner.shutdown()
    ctx.policy_moved(model)
    return {"demonstrations": len(demos), **teacher, "steps": steps, "loss_first": losses[0],
            "loss_last": losses[-1], "model": str(model)}


def _evaluate(ctx: PipelineContext, out: Path, stage: str, budgets: list[int] | None = None,
              critic: Any = None) -> dict[str, Any]:
    cfg = ctx.with_policy()
    if critic is not None:  # this evaluation's critic instead of the pipeline's current one
        cfg = dataclasses.replace(cfg, critic=dataclasses.replace(critic, verification_budget=cfg.critic.verification_budget))
    if budgets is not None:
        cfg = dataclasses.replace(cfg, eval=dataclasses.replace(cfg.eval, verification_budgets=budgets))
    cfg = dataclasses.replace(cfg, logging=dataclasses.replace(cfg.logging, run_name=f"{ctx.group_name}-{stage}"))
    # the shared rollout group serves every domain of eval.domains (its workers switch domain and
    # run_eval switches them back to the training domain at the end), with the current weights
    group = ctx.rollout_group()
    if critic is not None:
        group.set_critic(cfg.critic)  # the next stage's rollout_group() switches it back
    report = run_eval(cfg, out, group=group)
    return {
        "report": str(out / "report.json"),
        "policy": str(ctx.policy_path),
        "critic": critic_description(cfg.critic),
        "pass^k": {c["label"]: {g: v["pass^k"] for g, v in c["groups"].items()} for c in report["configurations"]},
    }


def eval_before(ctx: PipelineContext, out: Path) -> dict[str, Any]:
    return _evaluate(ctx, out, "eval_before")


def eval_after(ctx: PipelineContext, out: Path) -> dict[str, Any]:
    return _evaluate(ctx, out, "eval_after", budgets=ctx.eval_budgets())


def eval_critic(ctx: PipelineContext, out: Path) -> dict[str, Any]:
    """The policy before optimisation with the critic train_critic trained in the loop (the
    budgets > 0 of ``eval.verification_budgets``), whichever critic ``critic.backend`` has the
    other stages serve: beside 01_eval_before's configurations, what the trained critic adds
    before any policy training."""
    trained = resolve_critic(dataclasses.replace(ctx.cfg, critic=dataclasses.replace(ctx.cfg.critic, backend="trained")))
    if trained.backend != "trained":
        raise ValueError(f"stage eval_critic evaluates the trained critic: {trained_critic_path(ctx.cfg)} does not "
                         "exist; run train_critic (pipeline.critic_train_steps > 0 or critic_epochs) first")
    return _evaluate_with_critic(ctx, out, "eval_critic", trained)


def eval_rule(ctx: PipelineContext, out: Path) -> dict[str, Any]:
    """The optimised policy with the rule critic in the loop (the budgets > 0), when the pipeline
    serves another critic: with ``critic.backend=trained`` the report's rows are before and after
    training x no critic / rule critic / trained critic."""
    if ctx.critic_config().backend == "rule":
        return {"skipped": "the pipeline serves the rule critic: eval_after has its configurations"}
    return _evaluate_with_critic(ctx, out, "eval_rule", dataclasses.replace(ctx.cfg.critic, backend="rule"))


def _evaluate_with_critic(ctx: PipelineContext, out: Path, stage: str, critic: Any) -> dict[str, Any]:
    budgets = [b for b in ctx.cfg.eval.verification_budgets if b > 0]
    if not budgets:
        return {"skipped": "eval.verification_budgets has no budget > 0"}
    return _evaluate(ctx, out, stage, budgets=budgets, critic=critic)


def collect(ctx: PipelineContext, out: Path) -> dict[str, Any]:
    """Trials of every training task without the critic: by the policy (``pipeline.collect_trials``
    each), or with ``pipeline.collect_policy=teacher`` by the teacher model on its own workers
    (``teacher.rollouts_per_task`` each at ``teacher.collect_temperature``, written in the
    policy's tokens: :mod:`cast_rl.rollout.teacher`)."""
    if ctx.cfg.pipeline.collect_policy == "teacher":
        trajs = _collect_with_teacher(ctx, out)
    else:
        trajs = _collect(ctx, out, budget=0)
    with _metrics(ctx, "collect") as log:
        log.log({"rollout/reward_mean": _rollout_summary(trajs)["reward_mean"]})
    summary = _rollout_summary(trajs)
    if ctx.cfg.pipeline.collect_policy == "teacher":
        t = ctx.cfg.teacher
        summary.update({"collected_by": "teacher", "teacher": t.model.path, "trials": t.rollouts_per_task,
                        "temperature": t.collect_temperature, "react": t.react, "thinking": t.inference.thinking})
    return summary


def _collect_with_teacher(ctx: PipelineContext, out: Path) -> list[Trajectory]:
    cfg = ctx.train_cfg()
    units = episode_units(cfg, ctx.data, trials=cfg.teacher.rollouts_per_task)
    group = ctx.teacher_group()
    try:
        trajs = [mark_teacher_trajectory(t, cfg) for t in _collect(ctx, out, 0, units, group=group)]
    finally:
        group.shutdown()
    write_trajectories(out / "trajectories.jsonl", trajs)  # marked as the teacher's
    return trajs


def label(ctx: PipelineContext, out: Path) -> dict[str, Any]:
    source = ctx.stage_dir("collect") / "trajectories.jsonl"
    demos = ctx.stage_dir("warmstart") / "demonstrations.jsonl"
    if ctx.cfg.pipeline.label_demonstrations and demos.exists():
        # the teacher's trajectories too (the paper's step 1), after the collected ones: the
        # labels' trajectory_index is the position in this stage's trajectories.jsonl
        write_trajectories(out / "trajectories.jsonl", read_trajectories(source) + read_trajectories(demos))
        source = out / "trajectories.jsonl"
    if ctx.cfg.labeller.backend == "rules":
        labels, trajectories, labeller = label_file(ctx.data, source, out / "labels.jsonl")
        stats, metrics = labeller.stats, labeller.stats.metrics()
    else:  # the LLM verifier, on a service actor with its own resources (labeller.num_gpus)
        trajectories = read_for_labelling(ctx.data, source)
        labels, stats, metrics = label_with_service(ctx.cfg, trajectories)
        write_labels(out / "labels.jsonl", labels)
    # Failures the labels do not explain (no invalid action ran): listed for a person to read.
    with (out / "unexplained_failures.jsonl").open("w") as f:
        f.writelines(json.dumps(record) + "\n" for record in stats.unexplained)
    if ctx.cfg.teacher.enabled:  # on the teacher's own actor, once the rollout group freed its GPUs
        ctx.release_rollout_group()
        labels, rewrite = rewrite_with_service(ctx.with_policy(), labels, trajectories)
        metrics.update(rewrite)
        write_labels(out / "labels.jsonl", labels)
    summary = {"actions": len(labels), **{k.removeprefix("label/"): v for k, v in metrics.items()}}
    if ctx.cfg.pipeline.blame_k:
        blame = _verified_blame(ctx, out, [lab.to_json() for lab in labels], trajectories)
        metrics.update(blame)
        summary["blame"] = {k.removeprefix("blame/"): v for k, v in blame.items()}
    with _metrics(ctx, "label") as log:
        log.log(metrics)
    return summary


def _verified_blame(ctx: PipelineContext, out: Path, labels: list[dict[str, Any]],
                    trajectories: list[Trajectory]) -> dict[str, float]:
    """Verified blame of the collected policy's failures (``pipeline.blame_k`` continuations per
    invalid label, no critic in the loop): ``blame.jsonl`` and ``blame/`` metrics."""
    group = ctx.rollout_group()
    group.set_verification_budget(0)
    records = group.blame(trajectories, labels, ctx.cfg.pipeline.blame_k, ctx.cfg.seed)
    write_blame(out / "blame.jsonl", records)
    return blame_metrics(records, count_failed(trajectories))


def labelled_trajectories(ctx: PipelineContext) -> Path:
    """The trajectories stage label labelled, in the order its labels index them."""
    own = ctx.stage_dir("label") / "trajectories.jsonl"
    return own if own.exists() else ctx.stage_dir("collect") / "trajectories.jsonl"


def critic_data(ctx: PipelineContext, out: Path) -> dict[str, Any]:
    drop: set[tuple[int, int]] = set()
    if ctx.cfg.pipeline.critic_data_blame == "filter":

        checked, confirmed = confirmed_keys(ctx.stage_dir("label") / "blame.jsonl")
        drop = checked - confirmed  # invalid labels the counterfactual did not bear out
    return build_configured_critic_data(ctx.cfg, ctx.stage_dir("label") / "labels.jsonl", labelled_trajectories(ctx),
                                        out, data=ctx.data, drop_from_train=drop)


def train_critic(ctx: PipelineContext, out: Path) -> dict[str, Any]:
    from transformers import AutoTokenizer

    cfg = ctx.cfg
    pipe = cfg.pipeline
    if not pipe.trains_critic:
        return {"skipped": "pipeline.critic_train_steps=0", "critic": cfg.critic.backend}
    base = _critic_base(ctx)
    samples = supervised_from_parquet(ctx.stage_dir("critic_data") / "train.parquet", AutoTokenizer.from_pretrained(base),
                                      mark_verdict=True)
    learner = LearnerGroup(critic_learner_config(ctx.with_policy(), base))
    with _metrics(ctx, "train_critic") as log:
        try:
            losses = train_critic_phase(learner, samples, cfg, log)
            model = learner.save_hf(out / "model")
        finally:
            learner.shutdown()
        summary = {"examples": len(samples), "steps": len(losses), "loss_first": losses[0],
                   "loss_last": losses[-1], "model": str(model), "critic": critic_description(ctx.critic_config())}
        if cfg.pipeline.critic_heldout_eval:
            heldout = _heldout_critics(ctx, out, base, model)
            log.log(flat_heldout_metrics(heldout["critics"]))
            summary["heldout"] = {name: {k: m[k] for k in ("critic", *HELDOUT_METRICS)}
                                  for name, m in heldout["critics"].items()}
    return summary


def _critic_base(ctx: PipelineContext) -> Path:
    """The model train_critic starts from (``pipeline.critic_base``)."""
    if ctx.cfg.pipeline.critic_base == "model":
        return ensure_model(ctx.cfg.critic.model, training_corpus(ctx.data.data_dir))
    warm = warmstart_model_path(ctx.cfg)
    if not (warm / "config.json").exists():
        raise ValueError(f"pipeline.critic_base=warmstart trains the critic from the warm-started policy: {warm} "
                         "has no model (stage warmstart saves it, with pipeline.warmstart_epochs > 0)")
    return warm


def heldout_critic_configs(critic: Any, base: Path, trained: Path) -> dict[str, Any]:
    """The critic configs of the held-out comparison's model critics: ``base`` (the untrained
    model, prompted: it reads the instructions and the policy whatever ``critic.system_prompt``
    says, which is for the trained critic) and ``trained``, served as ``critic`` serves it."""
    return {
        "base": dataclasses.replace(critic, backend="model", system_prompt=True,
                                    model=dataclasses.replace(critic.model, path=str(base))),
        "trained": dataclasses.replace(critic, backend="trained", model=dataclasses.replace(
            critic.model, path=str(trained), make_tiny_if_missing=False)),
    }


def _serves_later(ctx: PipelineContext) -> bool:
    """Whether a later stage of this run serves the trained critic (``critic.backend=trained``
    and a stage with the critic in the loop after train_critic)."""
    stages = ctx.cfg.pipeline.stages
    later = stages[stages.index("train_critic") + 1:] if "train_critic" in stages else []
    return ctx.cfg.critic.backend == "trained" and any(s in later for s in SERVING_STAGES)


def _same_service(a: CriticConfig, b: CriticConfig) -> bool:
    """Whether two critic configs build the same critic service (the budget is the rollouts')."""
    return dataclasses.replace(a, verification_budget=0) == dataclasses.replace(b, verification_budget=0)


class _Unclosed:
    """A verifier whose owner does not close it (its critic actor outlives the caller)."""

    def __init__(self, verifier: Any) -> None:
        self.verify = verifier.verify


def _heldout_critics(ctx: PipelineContext, out: Path, base: Path, trained: Path) -> dict[str, Any]:
    """The critics of ``pipeline.critic_heldout_eval`` on the held-out split, side by side
    (:mod:`cast_rl.eval.critic_heldout`); written to ``heldout_metrics.json``."""
    cfg = ctx.cfg
    tools = {ctx.data.spec.name: ctx.data.tools}
    data = ctx.stage_dir("critic_data") / "heldout.parquet"
    rows = read_requests(data)
    models = heldout_critic_configs(cfg.critic, base, trained)
    # the trained critic a later stage serves is measured on the run's own critic actor (slot 0),
    # which the rollout workers then join by name instead of starting another engine
    served = ctx.critic_config()
    kept = _serves_later(ctx) and _same_service(served, models["trained"])

    def starter(name: str) -> Any:
        async def start() -> tuple[Any, str]:
            if name == "rule":
                return RuleVerifier(tools), "rule"
            critic = models[name]
            keep = name == "trained" and kept
            if keep:
                logger.info("held-out critic trained: served by the run's critic actor, kept for the later stages")
                handle = critic_actor(dataclasses.replace(cfg, critic=served), 0)
                ctx.keep(handle)
            else:
                handle = private_critic_actor(critic)
            await handle.ready.remote()  # the engine is up
            client = CriticServiceClient([handle], max_retries=0, timeout_s=critic.timeout_s)
            return (_Unclosed(client) if keep else client), critic.model.path
        return start

    critics = {name: starter(name) for name in cfg.pipeline.critic_heldout_eval}
    results = asyncio.run(compare_critics(critics, rows, tools)) if rows else {}
    if not rows:
        logger.warning("held-out critic evaluation skipped: %s has no examples", data)
    heldout = {"data": str(data), "examples": len(rows), "critics": results}
    (out / "heldout_metrics.json").write_text(json.dumps(heldout, indent=2))
    return heldout


def benefit(ctx: PipelineContext, out: Path) -> dict[str, Any]:
    """The critic's net benefit at flagged actions, pass^k per token per budget and the budget
    chosen (:mod:`cast_rl.eval.net_benefit`), on the first ``pipeline.benefit_tasks`` tasks of
    the train split (choosing on the evaluation split would flatter eval_after), with the current
    policy and the critic the pipeline serves now.  ``pipeline.benefit_policy=policy`` runs on the
    rollout group's first worker (its vLLM engine); ``noisy_expert`` runs here, in this process: the
    noisy teacher is a per-episode scripted engine, not weights a worker serves.  Later stages use
    the chosen budget with ``pipeline.use_chosen_budget`` (:meth:`PipelineContext.collect_budget`)."""
    cfg = ctx.train_cfg()
    pipe = cfg.pipeline
    tasks = list(range(len(ctx.data.tasks(pipe.train_split))))[: pipe.benefit_tasks]
    if pipe.benefit_policy == "noisy_expert":
        report = asyncio.run(_benefit_noisy_expert(ctx, cfg, tasks))
    else:
        group = ctx.rollout_group()
        group.set_verification_budget(max(pipe.benefit_budgets))  # the worker builds its verifier
        report = group.benefit(cfg, tasks, pipe.train_split)
    write_benefit(report, out)
    with _metrics(ctx, "benefit") as log:
        log.log(report.metrics)
    k, m = str(report.passk_k), report.metrics
    return {
        "chosen_budget": report.chosen_budget, "chosen_by": f"max pass^{k} per 1k tokens",
        "policy": pipe.benefit_policy, "critic": critic_description(cfg.critic), "fp_rate": report.fp_rate,
        "split": pipe.train_split, "tasks": len(tasks), "trials": pipe.benefit_trials,
        "budgets": {str(b): {"pass^k": row["passk"][k], "tokens_per_episode": row["tokens_per_episode"],
                             "pass^k_per_1k_tokens": row["passk_per_1k_tokens"][k]}
                    for b, row in report.budgets.items()},
        **{name: int(m[f"benefit/{name}"]) for name in ("flags", "false_positive_flags", "helped", "harmed")},
        **report.files,
    }


async def _benefit_noisy_expert(ctx: PipelineContext, cfg: Any, tasks: list[int]) -> BenefitReport:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(ctx.policy_path)
    checking = dataclasses.replace(cfg, critic=dataclasses.replace(cfg.critic, verification_budget=1))
    verifier = build_verifier(checking, ctx.data, connect=critic_client)
    users, complete = user_engine(cfg.user, seed=cfg.seed)
    try:
        return await measure_benefit(cfg, ctx.data, tasks, noisy_expert_policy(cfg, ctx.data, tokenizer), verifier,
                                     tokenizer, split=cfg.pipeline.train_split, user_complete=complete)
    finally:
        for closeable in (users, verifier):
            close = getattr(closeable, "close", None)
            if close is not None:
                await close()


def collect_with_critic(ctx: PipelineContext, out: Path) -> dict[str, Any]:
    before = ctx.rollout_group().metrics()
    budget = ctx.collect_budget()
    trajs = _collect(ctx, out, budget=budget)
    summary = _rollout_summary(trajs)
    summary["verification_budget"] = budget
    summary["budget_from"] = "benefit" if ctx.cfg.pipeline.use_chosen_budget else "pipeline.collect_budget"
    after = ctx.rollout_group().metrics()
    critiques, unparsable = (int(after.get(k, 0) - before.get(k, 0)) for k in ("rollout/critiques", "rollout/critic_unparsable"))
    summary.update({"critic": critic_description(ctx.critic_config()), "critiques": critiques,
                    "critic_unparsable": unparsable, "critic_unparsable_rate": unparsable / critiques if critiques else 0.0})
    with _metrics(ctx, "collect_with_critic") as log:
        log.log({"rollout/reward_mean": summary["reward_mean"], "critic/rounds": summary["critique_rounds"],
                 "critic/unparsable": unparsable, "critic/unparsable_rate": summary["critic_unparsable_rate"]})
    return summary


def optimise(ctx: PipelineContext, out: Path) -> dict[str, Any]:
    """Fine-tune on the supervised kinds of ``algorithm.samples``, then GRPO with the critic.

    Supervised kinds (``supervised``, ``distill``, ``rft``) train for ``pipeline.sft_steps`` (or
    ``pipeline.sft_epochs``) on the trajectories of the two collect stages, the learning rate
    following ``pipeline.sft_schedule`` from ``learner.lr``.  The RL kinds then run the train loop with the
    critic in the loop at ``pipeline.collect_budget`` (or the budget stage benefit chose, with
    ``pipeline.use_chosen_budget``) and at ``pipeline.grpo_lr``, so verdicts become turn-level credit,
    through the same driver as ``python -m launchers.train`` (:func:`launchers.train.train_policy`:
    replay buffer and its log under ``<stage>/replay``, supervisor).  The stage starts afresh
    when rerun (its directory is cleared), so it does not resume a checkpoint.
    """

    cfg = dataclasses.replace(ctx.train_cfg(), run_dir=str(out))
    summary: dict[str, Any] = {}
    group = ctx.rollout_group()
    learner = _learner(ctx, cfg.learner.lr)
    try:
        with _metrics(ctx, "optimise") as log:
            sft_kinds = [k for k in cfg.algorithm.samples if k in SUPERVISED_KINDS]
            if sft_kinds and (cfg.pipeline.sft_steps or cfg.pipeline.sft_epochs is not None):
                collected = [t for stage in ("collect_with_critic", "collect")
                             if (p := ctx.stage_dir(stage) / "trajectories.jsonl").exists()
                             for t in read_trajectories(p)]
                sft_cfg = dataclasses.replace(cfg, algorithm=dataclasses.replace(cfg.algorithm, samples=sft_kinds))
                samples = build_samples(collected, sft_cfg, "sft")
                summary["sft_samples"] = {k: sum(s.key.endswith(f"/{k}") for s in samples) for k in sft_kinds}
                if samples:
                    batch = cfg.learner.global_batch_size
                    steps = phase_steps(cfg.pipeline.sft_steps, cfg.pipeline.sft_epochs, len(samples), batch)
                    losses = train_supervised(learner, samples, steps, batch, log, "sft", cfg.learner.seed,
                                              schedule=cfg.pipeline.sft_schedule, lr=cfg.learner.lr)
                    summary["sft_loss_first"], summary["sft_loss_last"] = losses[0], losses[-1]
                    summary["sft_steps"] = len(losses)
                    ctx.sync_policy(*learner.publish_weights())
                else:
                    logger.warning("optimise: no %s samples in the collected trajectories", "/".join(sft_kinds))
            rl = [k for k in cfg.algorithm.samples if k not in SUPERVISED_KINDS]
            if rl and cfg.algorithm.steps:
                budget = ctx.collect_budget()
                group.set_verification_budget(budget)
                rl_cfg = dataclasses.replace(cfg, algorithm=dataclasses.replace(cfg.algorithm, samples=rl))
                tasks = list(cfg.env.task_indices or range(len(ctx.data.tasks(cfg.env.split))))
                grpo_lr = cfg.learner.lr if cfg.pipeline.grpo_lr is None else cfg.pipeline.grpo_lr
                learner.set_lr(grpo_lr)
                summary["grpo_lr"] = grpo_lr
                run = train_policy(rl_cfg, _VersionedCollector(group, ctx), tasks, cfg.env.split, log,
                                   lambda: _learner(ctx, grpo_lr), learner=learner, resume=False)
                learner = run.loop.learner  # the supervisor may have rebuilt the group
                summary["grpo_steps"] = run.loop.state.step
                summary["grpo_episodes"] = int(sum(h.get("train/episodes", 0) for h in run.history))
                summary["verification_budget"] = budget
                summary["learner_restarts"] = len(run.failures)
                for key in ("train/reward_mean", "rollout/critique_rounds", "rollout/zero_variance_group_frac"):
                    summary[key.split("/")[1] + "_per_step"] = [round(h.get(key, float("nan")), 4) for h in run.history]
        model = learner.save_hf(out / "model")
    finally:
        learner.shutdown()
    ctx.policy_path = model  # the rollout group already serves these weights
    summary["model"] = str(model)
    summary["policy_version"] = ctx.policy_version
    return summary


def optimise_rft(ctx: PipelineContext, out: Path) -> dict[str, Any]:
    """The paper's baseline beside CAST, at CAST's cost: rejection-sampling fine-tuning.

    From the policy CAST's optimisation started from (the warm-start's model), with no critic
    anywhere: the episodes of 02_collect plus as many more critic-free episodes of the same
    training tasks as CAST collected after it (06_collect_with_critic's and the GRPO steps'), so
    both arms see equal collection episodes; then ``rft`` samples only (successes, loss on every
    policy turn) for as many optimizer steps as CAST took (its fine-tuning steps plus its GRPO
    steps), same learning rate, schedule (``pipeline.sft_schedule``, over all those steps) and batch.  Needs optimise to have run (it sets the cost)."""
    cast = ctx.done("optimise")
    if cast is None:
        raise ValueError("stage optimise_rft matches optimise's cost: run optimise first")
    start = Path((ctx.done("warmstart") or {}).get("model") or ctx.cfg.policy.path)
    after_collect = (ctx.done("collect_with_critic") or {}).get("episodes", 0) + cast.get("grpo_episodes", 0)
    steps = (cast.get("sft_steps") or 0) + cast.get("grpo_steps", 0)
    ctx.policy_moved(start)  # the shared group serves the starting policy again
    cfg = ctx.train_cfg()
    units = episode_units(cfg, ctx.data, trials=cfg.pipeline.collect_trials)
    rounds = -(-after_collect // max(len(units), 1))  # whole passes over the training tasks
    extra_units = [(s, i, t + cfg.pipeline.collect_trials * (r + 1)) for r in range(rounds)
                   for s, i, t in units][:after_collect]
    extra = _collect(ctx, out, budget=0, units=extra_units)
    collected = read_trajectories(ctx.stage_dir("collect") / "trajectories.jsonl") + extra
    rft_cfg = dataclasses.replace(cfg, algorithm=dataclasses.replace(cfg.algorithm, samples=["rft"]))
    samples = build_samples(collected, rft_cfg, "rft")
    if not samples:  # as optimise does: no success to learn from, the weights stay
        logger.warning("optimise_rft: no rft samples in %d collected trajectories", len(collected))
    learner = _learner(ctx, cfg.learner.lr, model_path=start)
    try:
        with _metrics(ctx, "optimise_rft") as log:
            losses = train_supervised(learner, samples, steps, cfg.learner.global_batch_size, log, "rft",
                                      cfg.learner.seed, schedule=cfg.pipeline.sft_schedule,
                                      lr=cfg.learner.lr) if steps and samples else []
        if losses:  # untrained, the group already serves the starting weights
            ctx.sync_policy(*learner.publish_weights())
        model = learner.save_hf(out / "model")
    finally:
        learner.shutdown()
    ctx.policy_path = model  # the rollout group serves these weights (eval_rft evaluates them)
    return {"model": str(model), "started_from": str(start), "episodes": len(collected),
            "cast_episodes": (ctx.done("collect") or {}).get("episodes", 0) + after_collect,
            "rft_samples": len(samples), "steps": steps, "cast_steps": steps, "trained_steps": len(losses),
            "loss_first": losses[0] if losses else None, "loss_last": losses[-1] if losses else None}


def eval_rft(ctx: PipelineContext, out: Path) -> dict[str, Any]:
    """pass^k of the RFT arm's policy without the critic (``eval.verification_budgets`` 0):
    the report pairs it with CAST's after-training configuration, task by task."""
    if ctx.done("optimise_rft") is None:
        raise ValueError("stage eval_rft evaluates optimise_rft's policy: run optimise_rft first")
    return _evaluate(ctx, out, "eval_rft", budgets=[0])


class _VersionedCollector:
    """The rollout group as the train loop's collector, keeping the pipeline's version."""

    def __init__(self, group: Any, ctx: PipelineContext) -> None:
        self.group, self.ctx = group, ctx

    def collect(self, units: list[tuple[str, int, int]], tree: tuple[int, str] | None = None) -> list[Trajectory]:
        return self.group.collect(units, tree=tree)

    def collect_refs(self, units: list[tuple[str, int, int]],
                     tree: tuple[int, str] | None = None) -> tuple[list[Any], list[EpisodeSummary]]:
        return self.group.collect_refs(units, tree=tree)

    def update_weights(self, version: int, weights: Any, checksum: str) -> Any:
        self.ctx.sync_policy(version, weights, checksum)
        return version


STAGES: dict[str, Callable[[PipelineContext, Path], dict[str, Any]]] = {
    "warmstart": warmstart,
    "eval_before": eval_before,
    "collect": collect,
    "label": label,
    "critic_data": critic_data,
    "train_critic": train_critic,
    "eval_critic": eval_critic,
    "eval_rule": eval_rule,
    "benefit": benefit,
    "collect_with_critic": collect_with_critic,
    "optimise": optimise,
    "eval_after": eval_after,
    "optimise_rft": optimise_rft,
    "eval_rft": eval_rft,
}
