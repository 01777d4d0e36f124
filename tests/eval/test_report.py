"""The evaluation report, summary and plots from synthetic trajectories; the budget switch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cast_rl.eval.critic import critic_metrics
from cast_rl.eval.report import (
    EvalRun,
    build_report,
    flat_metrics,
    render_markdown,
    sample_rows,
    write_report,
)
from cast_rl.records import Trajectory

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def traj(task: int, trial: int, reward: float, rounds: list[dict] | None = None, **info: float) -> Trajectory:
    messages = [{"role": "system", "content": "policy"}, {"role": "user", "content": "hi"}]
    return Trajectory(
        domain="retail", split="test", task_index=task, trial=trial, reward=reward, policy_version=0,
        messages=messages, verification_rounds=rounds or [],
        info={"policy_tokens": 10, "prompt_tokens": 100, "wall_s": 0.5, "termination": "user_stop", **info},
    )


def flag(index: int, proposal: dict, revision: dict | None) -> dict:
    critique = {"verdict": "invalid", "error_type": "hallucination", "rationale": {}, "text": "No."}
    return {"message_index": index, "proposal": proposal, "critique": critique, "revision": revision}


A = {"name": "cancel_pending_order", "kwargs": {"order_id": "#W1"}}
B = {"name": "get_order_details", "kwargs": {"order_id": "#W1"}}


@pytest.fixture
def runs() -> list[EvalRun]:
    # n = 3; no critic: c = 1, 0, 3;  critic B=2: c = 2, 1, 3
    rewards0 = {0: [1.0, 0.0, 0.0], 1: [0.0, 0.0, 0.0], 2: [1.0, 1.0, 1.0]}
    rewards2 = {0: [1.0, 1.0, 0.0], 1: [0.0, 1.0 - 1e-7, 0.0], 2: [1.0, 1.0, 1.0]}
    rounds = {
        (0, 0): [flag(3, A, B)],                                          # B at 5: not checked again
        (0, 1): [flag(3, A, A), flag(5, A, {"malformed": "Error: ..."})],  # repeated, then malformed
        (1, 1): [flag(3, B, None)],                                       # the episode ended
    }
    no_critic = [traj(t, i, r) for t, rs in rewards0.items() for i, r in enumerate(rs)]
    critic = [
        traj(t, i, r, rounds.get((t, i)), policy_tokens=20, prompt_tokens=300, wall_s=1.5)
        for t, rs in rewards2.items() for i, r in enumerate(rs)
    ]
    return [EvalRun(0, no_critic, critiques=0), EvalRun(2, critic, critiques=8)]


VALID, INVALID = ("valid", "none"), ("invalid", "hallucination")
TRUTH = {(0, 0): {3: INVALID, 5: VALID}, (0, 1): {3: VALID, 5: INVALID}, (1, 1): {3: INVALID}}


def judge(t: Trajectory) -> dict[int, tuple[str, str]]:
    """True verdicts by message index; every other trajectory has one valid action at 3."""
    return TRUTH.get((t.task_index, t.trial), {3: VALID})


def test_critic_metrics_by_hand(runs: list[EvalRun]) -> None:
    trajectories = runs[1].trajectories
    # without a judge: a revision no later round checked counts as corrected (B, the malformed
    # one); the repeated A was criticised again, so not corrected -> 2 of 3 revisions
    assert critic_metrics(trajectories, 2, critiques=8) == {
        "critiques": 8, "flags": 4, "flags_per_episode": 4 / 9, "flag_rate": 0.5,
        "correction_rate": 2 / 3, "resistance": 1 / 4, "false_positive_rate": None,
        "unparsable": None, "unparsable_rate": None,
    }
    # with a judge: B is valid, the malformed revision is not -> 1 of 3; checked valid actions:
    # B at 5 of (0, 0), A at 3 of (0, 1) (flagged: the one false positive), six unflagged -> 1/8
    m = critic_metrics(trajectories, 2, critiques=8, judge=judge)
    assert m["correction_rate"] == pytest.approx(1 / 3) and m["resistance"] == 0.25
    assert m["false_positive_rate"] == pytest.approx(1 / 8)
    # at B=1 a revision after one flag was never checked: B at 5 drops out -> 1/7
    assert critic_metrics(trajectories, 1, judge=judge)["false_positive_rate"] == pytest.approx(1 / 7)
    none = critic_metrics(runs[0].trajectories, 0, critiques=0, judge=judge)
    assert none["flags"] == 0 and none["flag_rate"] is None
    assert none["correction_rate"] is None and none["false_positive_rate"] is None


def test_report_json_summary_and_plots(runs: list[EvalRun], tmp_path: Path) -> None:
    from PIL import Image

    report = build_report(runs)
    paths = write_report(report, tmp_path)
    loaded = json.loads(paths["report"].read_text())
    assert loaded == json.loads(json.dumps(report))
    configs = {c["name"]: c for c in loaded["configurations"]}
    assert list(configs) == ["no_critic", "critic_b2"]
    for c in configs.values():
        assert list(c["groups"]["retail/test"]["pass^k"]) == ["pass^1", "pass^2", "pass^3"]
        assert c["groups"]["retail/test"]["tasks"] == 3 and c["groups"]["retail/test"]["n"] == 3
    assert configs["no_critic"]["groups"]["retail/test"]["pass^k"] == pytest.approx(
        {"pass^1": (1 / 3 + 0 + 1) / 3, "pass^2": 1 / 3, "pass^3": 1 / 3}
    )
    assert configs["critic_b2"]["groups"]["retail/test"]["pass^k"] == pytest.approx(
        {"pass^1": (2 / 3 + 1 / 3 + 1) / 3, "pass^2": (1 / 3 + 0 + 1) / 3, "pass^3": 1 / 3}
    )
    assert configs["critic_b2"]["cost"] == {"policy_tokens": 20, "prompt_tokens": 300, "tokens": 320, "wall_s": 1.5}
    assert configs["critic_b2"]["critic"]["flags"] == 4
    assert configs["critic_b2"]["critic"]["false_positive_rate"] is None  # no judge given
    judged = build_report(runs, judge=judge)["configurations"][1]["critic"]
    assert judged["false_positive_rate"] == pytest.approx(1 / 8)

    summary = paths["summary"].read_text()
    assert "| configuration | budget | pass^1 | pass^2 | pass^3 | reward mean | MDD pass^1/pass^2/pass^3 |" in summary
    # per-task pass^1 of critic B=2 is 2/3, 1/3, 1: with 3 tasks the expanded percentile
    # interval reaches the extremes a resample can take, all-1/3 and all-1
    assert "| critic B=2 | 2 | 0.667 [0.333, 1.000] | 0.444 [" in summary
    assert "| no critic | 0 | 0.444 [0.000, 1.000] | 0.333 [" in summary
    assert "| critic B=2 - no critic | retail/test | 3 | +0.222 [+0.000, +0.333] **(includes 0)** |" in summary
    assert configs["critic_b2"]["groups"]["retail/test"]["task_successes"] == {"0": 2, "1": 1, "2": 3}
    assert configs["critic_b2"]["groups"]["retail/test"]["pass^k_ci"]["pass^1"] == pytest.approx([1 / 3, 1.0])
    (comparison,) = loaded["comparisons"]
    assert (comparison["a"], comparison["b"], comparison["tasks"]) == ("critic_b2", "no_critic", 3)
    assert comparison["pass^k"]["pass^1"]["difference"] == pytest.approx(2 / 9)
    plots = sorted((tmp_path / "plots").glob("*.png"))
    assert [p.name for p in plots] == ["passk_vs_budget_retail_test.png", "passk_vs_k_retail_test.png"]
    for p in plots:
        assert p.read_bytes()[:8] == PNG_MAGIC
        with Image.open(p) as image:
            image.verify()
        with Image.open(p) as image:
            assert image.size[0] > 100 and image.size[1] > 100
        assert f"](plots/{p.name})" in summary


def test_report_errors_and_k_values(runs: list[EvalRun]) -> None:
    report = build_report(runs, k_values=[2])
    assert all(list(c["groups"]["retail/test"]["pass^k"]) == ["pass^2"] for c in report["configurations"])
    with pytest.raises(ValueError, match="k=4 is not allowed"):
        build_report(runs, k_values=[4])
    with pytest.raises(ValueError, match="evaluated once"):
        build_report([runs[0], runs[0]])
    with pytest.raises(ValueError, match="same number of trials"):
        build_report([EvalRun(0, runs[0].trajectories[:-1])])


def test_metrics_samples_and_markdown_without_critic(runs: list[EvalRun]) -> None:
    report = build_report(runs)
    metrics = flat_metrics(report)
    assert metrics["eval/critic_b2/retail/test/pass^1"] == pytest.approx(2 / 3)
    assert metrics["eval/no_critic/flags"] == 0
    assert "eval/no_critic/correction_rate" not in metrics  # None is not logged
    assert all(k.startswith("eval/") for k in metrics)
    rows = sample_rows(runs, per_run=2)
    assert len(rows) == 4
    assert rows[2][0] == "critic B=2" and "cancel_pending_order" in rows[2][7]  # critiques first
    text = render_markdown(build_report(runs[:1]))
    assert "| no critic | 0 |" in text and "## Plots" not in text


def test_worker_switches_verification_budget(retail_data_dir: Path) -> None:
    """The budget switch the evaluation relies on, on the plain library worker (no engine runs)."""
    from types import SimpleNamespace

    from cast_rl.config import load_config
    from cast_rl.critique.verifier import GuardedVerifier, RuleVerifier
    from cast_rl.envs.core import load_domain_data
    from cast_rl.rollout.worker import RolloutWorker

    cfg = load_config(None, [f"env.data_dir={retail_data_dir}", "critic.backend=rule"])
    worker = RolloutWorker(cfg, load_domain_data("retail", retail_data_dir), SimpleNamespace(tokenizer=None))
    assert worker.runner.verifier is None and worker.runner.budget == 0
    worker.set_verification_budget(2)
    verifier = worker.runner.verifier  # the rules, behind the guard that counts unparsable answers
    assert isinstance(verifier, GuardedVerifier) and isinstance(verifier.inner, RuleVerifier)
    assert worker.runner.budget == 2
    assert worker.runner.cfg.critic.verification_budget == 2
    worker.set_verification_budget(0)
    assert worker.runner.budget == 0
    worker.set_verification_budget(1)
    assert worker.runner.verifier is verifier and worker.runner.budget == 1
    with pytest.raises(ValueError, match="must be >= 0"):
        worker.set_verification_budget(-1)


def test_unseen_databases_pool_into_one_group() -> None:
    import dataclasses

    def on(split: str, task: int, rewards: list[float]) -> list[Trajectory]:
        return [dataclasses.replace(traj(task, i, r), split=split) for i, r in enumerate(rewards)]

    # the same task indices on two databases are different tasks
    trajs = on("test", 0, [1, 1]) + on("unseen-7", 0, [1, 1]) + on("unseen-7", 1, [0, 0]) + on("unseen-8", 0, [1, 0])
    groups = build_report([EvalRun(0, trajs)])["configurations"][0]["groups"]
    assert set(groups) == {"retail/test", "retail/unseen-7", "retail/unseen-8", "retail/unseen"}
    pooled = groups["retail/unseen"]
    assert pooled["tasks"] == 3 and pooled["databases"] == ["unseen-7", "unseen-8"]
    assert pooled["task_successes"] == {"unseen-7/0": 2, "unseen-7/1": 0, "unseen-8/0": 1}
    assert pooled["pass^k"]["pass^1"] == pytest.approx(0.5) and pooled["pass^k"]["pass^2"] == pytest.approx(1 / 3)
    # one unseen database: only the pooled group, named retail/unseen
    one = build_report([EvalRun(0, on("test", 0, [1, 1]) + on("unseen-7", 0, [1, 0]))])["configurations"][0]["groups"]
    assert set(one) == {"retail/test", "retail/unseen"} and one["retail/unseen"]["databases"] == ["unseen-7"]
