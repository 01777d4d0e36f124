"""The critic's net benefit: helped/harmed at flagged actions, pass^k per token, the budget chosen.

Real episodes throughout (generated compact cancel tasks, scripted user, the runner's loop, the
rule critic): the policy is the noisy teacher, deferential (``defers=True``): after a rejection of
a cancel it believes right it switches to the other reason.  The rule critic is wrapped to also
reject valid proposals at a controlled rate p; the harm then comes from the branches' outcomes in
the environment, not from counting flags.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from cast_rl.critique.verifier import Critique, RuleVerifier, VerifyRequest
from cast_rl.eval.net_benefit import (
    FALSE_POSITIVE,
    BenefitRecord,
    FalsePositiveVerifier,
    benefit_metrics,
    choose_budget,
    measure_benefit,
)
from cast_rl.rollout.noisy_expert import NoisyExpertPolicy, draw_error, episode_seed
from cast_rl.rollout.runner import EpisodeRunner, EpisodeSpec

REPO = Path(__file__).resolve().parents[2]
FP_RATES = (0.0, 0.1, 0.3, 0.5)


@pytest.fixture(scope="module")
def sweep(compact_cancel):  # noqa: ANN001, ANN201
    """``sweep(p, defers=True)``: the benefit report at false-positive rate p (30 generated tasks,
    every episode with one teacher error, budgets 0 and 1, one trial, one continuation per branch)."""
    cfg, data, tok = compact_cancel(
        11, 30, "pipeline.benefit_error_rate=1.0", "pipeline.benefit_trials=1",
        "pipeline.benefit_budgets=[0,1]", "pipeline.benefit_k=1",
    )
    tasks = list(range(len(data.tasks("train"))))
    kinds = tuple(cfg.pipeline.benefit_errors)

    def run(p: float, defers: bool = True):  # noqa: ANN202
        c = replace(cfg, pipeline=replace(cfg.pipeline, benefit_fp_rate=p))

        def engine_for(spec: EpisodeSpec) -> NoisyExpertPolicy:
            error = draw_error(episode_seed(c.seed, spec.key), c.pipeline.benefit_error_rate, kinds)
            return NoisyExpertPolicy(tok, data.task(spec.split, spec.task_index), data.spec.write_tools, error,
                                     defers=defers)

        return asyncio.run(measure_benefit(c, data, tasks, engine_for, RuleVerifier({data.domain: data.tools}), tok))

    return run


def test_harm_rises_with_the_false_positive_rate_and_the_chosen_budget_falls(sweep) -> None:  # noqa: ANN001
    reports = {p: sweep(p) for p in FP_RATES}
    harmed = [reports[p].metrics["benefit/harmed"] for p in FP_RATES]
    chosen = [reports[p].chosen_budget for p in FP_RATES]
    print(json.dumps({"harmed": harmed, "chosen": chosen}))
    assert harmed[0] == 0 and all(a < b for a, b in zip(harmed, harmed[1:])), harmed
    assert chosen[0] >= 1 and chosen[-1] == 0 and all(a >= b for a, b in zip(chosen, chosen[1:])), chosen
    clean = reports[0.0].metrics
    # without false positives every flag is a real error, and catching the wrong cancels helps
    assert clean["benefit/false_positive_flags"] == 0 and clean["benefit/helped"] > 0
    assert clean["benefit/type/policy_violation/helped"] == clean["benefit/helped"]
    # with them, the harm is at flags the privileged labeller judges valid
    noisy = reports[0.5].metrics
    assert noisy[f"benefit/type/{FALSE_POSITIVE}/harmed"] == noisy["benefit/harmed"]
    # the same measurement of pass^1 per token the chooser read
    for report in reports.values():
        rows = report.budgets
        best = max(row["passk"]["1"] / row["tokens_per_episode"] for row in rows.values())
        assert rows[report.chosen_budget]["passk"]["1"] / rows[report.chosen_budget]["tokens_per_episode"] == best
        assert rows[0]["critic_tokens_per_episode"] == 0 < rows[1]["critic_tokens_per_episode"]


def test_false_flags_do_no_harm_to_a_policy_that_keeps_a_right_step(sweep) -> None:  # noqa: ANN001
    report = sweep(0.5, defers=False)
    assert report.metrics["benefit/false_positive_flags"] > 0
    assert report.metrics["benefit/harmed"] == 0


def test_deferential_teacher_switches_the_cancel_reason_after_a_rejection(compact_cancel) -> None:  # noqa: ANN001
    cfg, data, tok = compact_cancel(11, 6, "critic.verification_budget=1")
    task = data.task("train", 0)
    gold = next(a for a in task.actions if a.name == "cancel_pending_order")

    class RejectCancels:
        async def verify(self, requests: list[VerifyRequest]) -> list[Critique]:
            return [Critique("invalid", "hallucination", text="VERDICT: invalid\nERROR: hallucination")
                    if r.proposal["name"] == "cancel_pending_order" else Critique("valid", "none") for r in requests]

    ran = {}
    for defers in (False, True):
        engine = NoisyExpertPolicy(tok, task, data.spec.write_tools, None, defers=defers)
        traj = asyncio.run(EpisodeRunner(cfg, data, engine, RejectCancels()).run(EpisodeSpec("train", 0, 0)))
        (cancel,) = [t.action for t in traj.turns if t.executed and t.action["name"] == "cancel_pending_order"]
        ran[defers] = (cancel["kwargs"]["reason"], traj.reward)
    assert ran[False] == (gold.kwargs["reason"], 1.0)
    assert ran[True][0] != gold.kwargs["reason"] and ran[True][1] == 0.0


def test_helped_and_harmed_are_counted_per_seed_and_grouped_by_type() -> None:
    real = BenefitRecord(1, "train", 0, 0, 9, "policy_violation", "rule", {"name": "x", "kwargs": {}},
                         {"name": "y", "kwargs": {}}, proposal_valid=False)
    real.count([False, False, True, False], [True, True, True, False])
    assert (real.k, real.helped, real.harmed, real.unchanged) == (4, 2, 0, 2)
    assert (real.proposal_successes, real.revision_successes) == (1, 3)
    false = BenefitRecord(1, "train", 1, 0, 9, "hallucination", "rule+false_positive", {"name": "x", "kwargs": {}},
                          {"name": "y", "kwargs": {}}, proposal_valid=True)
    false.count([True, True, False, True], [False, True, True, False])
    assert (false.helped, false.harmed, false.unchanged, false.category) == (1, 2, 1, FALSE_POSITIVE)
    with pytest.raises(ValueError):
        false.count([True], [True, False])
    m = benefit_metrics([real, false])
    assert (m["benefit/helped"], m["benefit/harmed"], m["benefit/unchanged"], m["benefit/branch_pairs"]) == (3, 2, 3, 8)
    assert m["benefit/type/policy_violation/helped"] == 2 and m["benefit/type/false_positive/harmed"] == 2
    assert "benefit/type/hallucination/harmed" not in m  # the labeller's valid wins over the critic's type
    assert m["benefit/harm_rate"] == 2 / 8 and m["benefit/net_rate"] == 1 / 8


def _row(pass1: float, pass2: float, tokens: float) -> dict:
    return {"passk_per_1k_tokens": {"1": 1000 * pass1 / tokens, "2": 1000 * pass2 / tokens}}


def test_budget_chooser_takes_the_argmax_of_passk_per_token() -> None:
    table = {0: _row(0.60, 0.40, 200), 1: _row(0.90, 0.85, 250), 2: _row(0.95, 0.95, 320)}
    assert choose_budget(table, 1) == 1  # pass^1 per 1k tokens: 3.0, 3.6, 2.97
    assert choose_budget(table, 2) == 1  # pass^2: 2.0, 3.4, 2.97
    table[1] = _row(0.90, 0.50, 250)  # less consistent at budget 1
    assert choose_budget(table, 1) == 1 and choose_budget(table, 2) == 2  # pass^2: 2.0, 2.0, 2.97
    assert choose_budget({0: _row(0.5, 0.5, 100), 3: _row(1.0, 1.0, 200)}, 1) == 0  # a tie: the smaller budget
    with pytest.raises(ValueError):
        choose_budget(table, 3)


def test_false_positive_verifier_is_deterministic_nested_and_at_its_rate() -> None:
    class AllValid:
        async def verify(self, requests: list[VerifyRequest]) -> list[Critique]:
            return [Critique("invalid", "hallucination") if r.proposal["name"] == "bad" else Critique("valid", "none")
                    for r in requests]

    requests = [VerifyRequest("retail", "", [{"role": "user", "content": f"message {i}"}],
                              {"name": "respond", "kwargs": {"content": "hi"}}) for i in range(2000)]
    bad = VerifyRequest("retail", "", [], {"name": "bad", "kwargs": {}})

    def flagged(rate: float, seed: int = 0) -> set[int]:
        out = asyncio.run(FalsePositiveVerifier(AllValid(), rate, seed).verify([*requests, bad]))
        assert out[-1].verdict == "invalid" and out[-1].critic == ""  # the inner critic's own rejection
        return {i for i, c in enumerate(out[:-1]) if c.verdict == "invalid"}

    low, high = flagged(0.1), flagged(0.3)
    assert flagged(0.1) == low and low < high  # repeatable, and a higher rate flags a superset
    assert abs(len(low) / 2000 - 0.1) < 0.03 and abs(len(high) / 2000 - 0.3) < 0.04
    assert flagged(0.1, seed=1) != low and flagged(0.0) == set()
    critique = asyncio.run(FalsePositiveVerifier(AllValid(), 1.0).verify(requests[:1]))[0]
    assert critique.text.startswith("VERDICT: invalid") and critique.critic.endswith(FALSE_POSITIVE)


def test_benefit_command_writes_records_and_the_chosen_budget(tiny_model_dir: Path, tmp_path: Path) -> None:
    from cast_rl.envs.generate import write_retail

    data_dir = tmp_path / "retail"
    write_retail(data_dir, seed=11, num_tasks=8, kinds=("cancel",), compact=True)
    cmd = [sys.executable, "-m", "cast_rl.cli", "benefit", f"env.data_dir={data_dir}", "env.split=train",
           "env.max_steps=12", f"policy.path={tiny_model_dir}", f"run_dir={tmp_path / 'run'}", "logging.mode=disabled",
           "pipeline.benefit_policy=noisy_expert", "pipeline.benefit_error_rate=1.0", "pipeline.benefit_fp_rate=0.3",
           "pipeline.benefit_budgets=[0,1]", "pipeline.benefit_trials=2", "pipeline.benefit_k=1",
           "--out", str(tmp_path / "out")]
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "out" / "budgets.json").read_text())
    assert set(summary["budgets"]) == {"0", "1"} and summary["critic_tokens"] == "critique_text"
    assert summary["chosen_budget"] == choose_budget({int(b): r for b, r in summary["budgets"].items()}, 1)
    records = [json.loads(line) for line in (tmp_path / "out" / "benefit.jsonl").read_text().splitlines()]
    assert records and all(r["budget"] == 1 and r["k"] == 1 for r in records)
    assert summary["metrics"]["benefit/flags"] == len(records)
    assert any(r["category"] == FALSE_POSITIVE for r in records)
    assert f"chosen verification budget: {summary['chosen_budget']}" in result.stderr
