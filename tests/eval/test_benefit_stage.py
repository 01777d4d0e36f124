"""Stage benefit of the pipeline: it writes its files, and the budget it chose reaches the later stages.

Real episodes throughout (generated compact cancel tasks, scripted user, rule critic): stage
benefit runs in-process with the deferential noisy teacher (``pipeline.benefit_policy=noisy_expert``),
and the rollout group is replaced by one that plays the same teacher here, in this process, at
the verification budget the stage sets, so collect_with_critic's episodes show which budget ran.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from cast_rl.config import ConfigError, load_config
from cast_rl.critique.verifier import RuleVerifier
from cast_rl.eval.net_benefit import noisy_expert_policy
from cast_rl.pipeline.context import PipelineContext
from cast_rl.pipeline.report import write_pipeline_report
from cast_rl.records import Trajectory, read_trajectories
from cast_rl.rollout.runner import EpisodeRunner, EpisodeSpec
from launchers.stages import STAGES


class InProcessTeacherGroup:
    """The rollout group's interface over the noisy teacher (one engine per episode) and the rule
    critic, in this process; records every budget it is set to."""

    def __init__(self, cfg: Any, data: Any, tokenizer: Any) -> None:
        self.cfg, self.data, self.tokenizer = cfg, data, tokenizer
        self.critic = cfg.critic
        self.budgets = [cfg.critic.verification_budget]

    def collect(self, units: list[tuple[str, int, int]], tree: Any = None, *, on_done: Any = None) -> list[Trajectory]:
        budget = self.budgets[-1]
        cfg = replace(self.cfg, critic=replace(self.critic, verification_budget=budget))
        engine_for = noisy_expert_policy(cfg, self.data, self.tokenizer)
        verifier = RuleVerifier({self.data.domain: self.data.tools}) if budget else None

        async def run() -> list[Trajectory]:
            specs = [EpisodeSpec(*unit) for unit in units]
            return list(await asyncio.gather(
                *(EpisodeRunner(cfg, self.data, engine_for(s), verifier).run(s) for s in specs)))

        trajs = asyncio.run(run())
        for traj in trajs:
            if on_done is not None:
                on_done(traj)
        return trajs

    def set_critic(self, critic: Any) -> str:
        self.critic = critic
        return critic.backend

    def set_verification_budget(self, budget: int) -> None:
        self.budgets.append(budget)

    def metrics(self) -> dict[str, float]:
        return {}

    def shutdown(self) -> None:
        pass


@pytest.fixture(scope="module")
def pipeline(compact_cancel, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN001, ANN201
    """``pipeline(p, use_chosen)``: stages benefit then collect_with_critic, as run_pipeline runs
    them, on generated cancel tasks (the train split of 30) whose every episode holds one teacher error; the rule critic wrongly
    flags valid proposals at rate p in the benefit measurement.  Returns (ctx, summaries, group)."""
    _, data, tok = compact_cancel(11, 30)
    data_dir = data.data_dir

    def run(p: float, use_chosen: bool) -> tuple[PipelineContext, dict[str, Any], InProcessTeacherGroup]:
        root = tmp_path_factory.mktemp(f"benefit-{p}-{use_chosen}")
        cfg = load_config(None, [
            f"run_dir={root}", f"env.data_dir={data_dir}", "env.split=train", "env.max_steps=12",
            f"policy.path={tiny_model_dir}", "logging.mode=disabled",
            "pipeline.stages=[benefit,collect_with_critic,eval_after]", "pipeline.collect_trials=1",
            "pipeline.collect_budget=3", f"pipeline.use_chosen_budget={use_chosen}", "eval.verification_budgets=[0,2]",
            "pipeline.benefit_policy=noisy_expert", "pipeline.benefit_error_rate=1.0", "pipeline.benefit_trials=1",
            "pipeline.benefit_budgets=[0,1]", "pipeline.benefit_k=1", f"pipeline.benefit_fp_rate={p}",
        ])
        groups: list[InProcessTeacherGroup] = []

        def make_group(c: Any) -> InProcessTeacherGroup:
            groups.append(InProcessTeacherGroup(c, data, tok))
            return groups[-1]

        ctx = PipelineContext(cfg, data, make_group=make_group)
        summaries = {stage: ctx.finish(stage, STAGES[stage](ctx, ctx.begin(stage)))
                     for stage in ("benefit", "collect_with_critic")}
        return ctx, summaries, groups[0]

    return run


def test_the_stage_writes_its_files_and_a_harmful_critic_gets_budget_0(pipeline) -> None:  # noqa: ANN001
    ctx, summaries, group = pipeline(0.5, True)
    out = ctx.stage_dir("benefit")
    assert out.name == "05b_benefit"
    budgets = json.loads((out / "budgets.json").read_text())
    records = [json.loads(line) for line in (out / "benefit.jsonl").read_text().splitlines()]
    assert set(budgets["budgets"]) == {"0", "1"} and records
    assert summaries["benefit"]["chosen_budget"] == budgets["chosen_budget"] == 0
    assert summaries["benefit"]["harmed"] > 0  # the wrong flags cost outcomes
    collected = summaries["collect_with_critic"]
    assert collected["verification_budget"] == 0 and collected["budget_from"] == "benefit"
    assert group.budgets[-1] == 0
    trajs = read_trajectories(ctx.stage_dir("collect_with_critic") / "trajectories.jsonl")
    assert len(trajs) == len(ctx.data.tasks("train")) and not any(t.verification_rounds for t in trajs)  # no critic
    assert ctx.eval_budgets() == [0, 2]  # 0 was already there
    # the report carries the choice: one headline line and a summary.md section
    paths = write_pipeline_report(ctx.root, {}, benefit=out / "budgets.json")
    summary = Path(paths["summary"]).read_text()
    assert "verification budget chosen: B=0 by max pass^1 per 1k tokens" in summary
    assert "| 0 (chosen) |" in summary


def test_a_clean_critic_gets_a_budget_and_collection_runs_with_it(pipeline) -> None:  # noqa: ANN001
    ctx, summaries, group = pipeline(0.0, True)
    chosen = summaries["benefit"]["chosen_budget"]
    assert chosen >= 1 and summaries["benefit"]["harmed"] == 0
    assert summaries["collect_with_critic"]["verification_budget"] == chosen == group.budgets[-1]
    trajs = read_trajectories(ctx.stage_dir("collect_with_critic") / "trajectories.jsonl")
    assert sum(len(t.verification_rounds) for t in trajs) == summaries["collect_with_critic"]["critique_rounds"] > 0
    assert ctx.eval_budgets() == [0, 2, chosen]


def test_without_use_chosen_budget_collection_keeps_collect_budget(pipeline) -> None:  # noqa: ANN001
    _, summaries, group = pipeline(0.5, False)
    assert summaries["benefit"]["chosen_budget"] == 0
    collected = summaries["collect_with_critic"]
    assert collected["verification_budget"] == 3 == group.budgets[-1]
    assert collected["budget_from"] == "pipeline.collect_budget" and collected["critique_rounds"] > 0


def test_use_chosen_budget_needs_the_benefit_stage(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no stage uses a verification budget"):
        load_config(None, ["pipeline.stages=[collect,label]", "pipeline.use_chosen_budget=true"])
    cfg = load_config(None, [f"run_dir={tmp_path}", "pipeline.stages=[collect_with_critic]",
                             "pipeline.use_chosen_budget=true"])
    with pytest.raises(ConfigError, match="no chosen budget"):
        PipelineContext(cfg, None, make_group=lambda c: None)  # type: ignore[arg-type]
    # a benefit stage that finished earlier is enough (a resumed run)
    done = tmp_path / "05b_benefit"
    done.mkdir()
    (done / "DONE.json").write_text(json.dumps({"chosen_budget": 2}))
    ctx = PipelineContext(cfg, None, make_group=lambda c: None)  # type: ignore[arg-type]
    assert ctx.collect_budget() == 2


@pytest.mark.slow
def test_the_stage_measures_the_served_policy_on_the_rollout_group(
    ray_local, tiny_model_dir: Path, retail_data_dir: Path, tmp_path: Path  # noqa: ANN001
) -> None:
    """benefit_policy=policy: the sweep runs on the rollout group's worker (vLLM, the tiny random
    policy, the rule critic), and collect_with_critic collects at the budget it chose."""
    from launchers.pipeline import run_pipeline

    run = tmp_path / "run"
    cfg = load_config(None, [
        f"run_dir={run}", f"env.data_dir={retail_data_dir}", "env.split=train", "env.max_steps=3",
        f"policy.path={tiny_model_dir}", "policy.make_tiny_if_missing=false",
        "inference.max_model_len=8192", "inference.max_new_tokens=24",
        "rollout.num_workers=1", "rollout.num_cpus_per_worker=1", "rollout.episodes_in_flight=8",
        "pipeline.stages=[benefit,collect_with_critic]", "pipeline.train_tasks=2", "pipeline.collect_trials=1",
        "pipeline.benefit_tasks=2", "pipeline.benefit_trials=1", "pipeline.benefit_budgets=[0,1]",
        "pipeline.benefit_k=1", "pipeline.use_chosen_budget=true", "pipeline.collect_budget=3",
        "cluster.num_cpus=2", "logging.mode=disabled",
    ])
    result = run_pipeline(cfg)
    chosen = result["stages"]["benefit"]["chosen_budget"]
    budgets = json.loads((run / "05b_benefit" / "budgets.json").read_text())
    assert budgets["chosen_budget"] == chosen in (0, 1) and set(budgets["budgets"]) == {"0", "1"}
    assert budgets["budgets"]["0"]["episodes"] == 2 and budgets["budgets"]["0"]["policy_tokens_per_episode"] > 0
    assert result["stages"]["collect_with_critic"]["verification_budget"] == chosen  # not collect_budget=3
    assert any(line.startswith("verification budget chosen: B=") for line in result["headline"])
