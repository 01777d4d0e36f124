"""The report across domains: per-domain groups marked in- or out-of-domain, and overall pass^k.

Expected values worked out by hand: n = 2 trials; retail tasks with 2, 1 successes, telecom
tasks with 0, 2.  Per task pass^1 = c/2 and pass^2 = C(c,2)/C(2,2).

Run: .venv/bin/python -m pytest tests/eval/test_report_domains.py -q
"""

from __future__ import annotations

import pytest

from cast_rl.config import load_config
from cast_rl.eval.report import EvalRun, build_report, render_markdown
from cast_rl.records import Trajectory


def traj(domain: str, task: int, trial: int, reward: float) -> Trajectory:
    return Trajectory(
        domain=domain, split="test", task_index=task, trial=trial, reward=reward, policy_version=0,
        messages=[{"role": "system", "content": "policy"}, {"role": "user", "content": "hi"}],
        info={"policy_tokens": 1, "prompt_tokens": 1, "wall_s": 0.1, "termination": "user_stop"},
    )


def _run() -> EvalRun:
    rewards = {("retail", 0): [1.0, 1.0], ("retail", 1): [1.0, 0.0],
               ("telecom", 0): [0.0, 0.0], ("telecom", 1): [1.0, 1.0]}
    return EvalRun(0, [traj(d, t, i, r) for (d, t), rs in rewards.items() for i, r in enumerate(rs)])


def test_groups_are_marked_and_overall_pools_every_task() -> None:
    report = build_report([_run()], in_domain=["retail"])
    config = report["configurations"][0]
    assert config["groups"]["retail/test"]["in_domain"] is True
    assert config["groups"]["telecom/test"]["in_domain"] is False
    assert config["groups"]["retail/test"]["pass^k"] == {"pass^1": 0.75, "pass^2": 0.5}
    assert config["groups"]["telecom/test"]["pass^k"] == {"pass^1": 0.5, "pass^2": 0.5}
    # overall: tasks with c = 2, 1, 0, 2 -> pass^1 = (1 + .5 + 0 + 1) / 4, pass^2 = (1 + 0 + 0 + 1) / 4
    # with 4 tasks, one never and two always solved, the 95% interval spans every resample's mean
    assert config["overall"].pop("pass^k_ci") == {"pass^1": [0.0, 1.0], "pass^2": [0.0, 1.0]}
    assert config["overall"] == {"tasks": 4, "n": 2, "success_rate": 0.625,
                                 "pass^k": {"pass^1": 0.625, "pass^2": 0.5}}
    text = render_markdown(report)
    assert "retail/test (2 tasks, n = 2 trials each, in-domain)" in text
    assert "telecom/test (2 tasks, n = 2 trials each, out-of-domain)" in text
    assert "## pass^k: overall (4 tasks of every domain/split)" in text


def test_one_domain_has_no_overall_and_no_marks_without_in_domain() -> None:
    run = EvalRun(0, [t for t in _run().trajectories if t.domain == "retail"])
    config = build_report([run])["configurations"][0]
    assert "overall" not in config and "in_domain" not in config["groups"]["retail/test"]


def test_in_domain_names_domains() -> None:
    with pytest.raises(ValueError, match=r"eval.in_domain\[\]='mars'"):
        load_config(None, ["eval.in_domain=[mars]"])
    cfg = load_config("configs/four_domains_eval.yaml")
    assert cfg.eval.domains == ["retail", "airline", "telecom", "telehealth"]
    assert cfg.eval.in_domain == ["retail"] and cfg.env.task_indices == []
