"""The optional evaluation stages that put a second critic in the loop: ``eval_critic`` (the
starting policy with the trained critic) and ``eval_rule`` (the optimised policy with the rule
critic, when the pipeline serves another), which give the report before/after x no critic /
rule critic / trained critic.  What is tested is which critic and budgets each stage evaluates
with; the evaluation itself is a stand-in."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import launchers.stages as stages
from cast_rl.config import load_config
from cast_rl.pipeline.report import STAGE_TAGS


def _ctx(cfg: Any, serving: Any) -> Any:
    return SimpleNamespace(cfg=cfg, critic_config=lambda: serving)


@pytest.fixture
def evaluated(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    calls: list[dict] = []

    def fake(ctx: Any, out: Path, stage: str, budgets: Any = None, critic: Any = None) -> dict:
        calls.append({"stage": stage, "budgets": budgets, "backend": critic.backend})
        return {}

    monkeypatch.setattr(stages, "_evaluate", fake)
    return calls


def test_eval_rule_puts_the_rule_critic_beside_a_served_trained_one(evaluated: list[dict], tmp_path: Path) -> None:
    cfg = load_config(None, ["critic.backend=trained", "pipeline.critic_train_steps=2", "eval.verification_budgets=[0,1,2]"])
    trained = dataclasses.replace(cfg.critic, backend="trained")
    stages.eval_rule(_ctx(cfg, trained), tmp_path)
    assert evaluated == [{"stage": "eval_rule", "budgets": [1, 2], "backend": "rule"}]
    assert STAGE_TAGS["eval_rule"] == "after"  # the report pairs it with eval_before's rule rows
    # serving the rule critic already, eval_after has those rows: nothing to add
    rule = dataclasses.replace(cfg.critic, backend="rule")
    assert "skipped" in stages.eval_rule(_ctx(cfg, rule), tmp_path) and len(evaluated) == 1
    # no budget > 0: no critic to put in the loop
    none = load_config(None, ["critic.backend=trained", "pipeline.critic_train_steps=2", "eval.verification_budgets=[0]"])
    assert "skipped" in stages.eval_rule(_ctx(none, trained), tmp_path) and len(evaluated) == 1
