"""``eval.domains`` inside the pipeline: 01_eval_before and 08_eval_after evaluate every listed
domain (``configs/paper/`` lists four) through the pipeline's one shared rollout group, whose
workers switch from domain to domain (``RolloutGroup.set_domain``) and back to the training
domain at the end, instead of a rollout group (a vLLM engine per worker) per domain.

The expert policy plays the gold actions, so no model engine starts and every domain's task is
solved: the check is the plumbing (one group for every domain, in/out of domain in the report).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cast_rl.config import load_config

DOMAINS = ["retail", "airline", "telecom", "telehealth"]


@pytest.mark.slow  # one rollout group serves both stages and all four domains
def test_eval_stages_evaluate_every_listed_domain(ray_local, benchmarks_dir: Path, tmp_path: Path,  # noqa: ANN001
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from actors.rollout_group import RolloutGroup
    from launchers import eval as eval_launcher
    from launchers import pipeline
    from launchers.pipeline import run_pipeline

    started: list[str] = []

    class CountedGroup(RolloutGroup):
        def __init__(self, cfg, *args, **kwargs) -> None:  # noqa: ANN001, ANN002, ANN003
            started.append(cfg.env.domain)
            super().__init__(cfg, *args, **kwargs)

    monkeypatch.setattr(pipeline, "RolloutGroup", CountedGroup)
    monkeypatch.setattr(eval_launcher, "RolloutGroup", CountedGroup)

    run = tmp_path / "run"
    cfg = load_config(None, [
        f"run_dir={run}", "env.domain=retail", f"env.data_dir={benchmarks_dir / 'retail'}",
        "env.split=test", "env.task_indices=[0,1]", "inference.backend=expert",
        f"eval.domains=[{','.join(DOMAINS)}]", f"eval.data_root={benchmarks_dir}", "eval.trials=1",
        "eval.verification_budgets=[0]", "pipeline.stages=[eval_before,eval_after]",
        "rollout.num_workers=1", "rollout.num_cpus_per_worker=1", "cluster.num_cpus=2",
        "logging.mode=disabled",
    ])
    result = run_pipeline(cfg)
    for stage in ("01_eval_before", "08_eval_after"):
        assert (run / stage / "DONE.json").is_file()
        report = json.loads((run / stage / "report.json").read_text())
        (config,) = report["configurations"]
        groups = config["groups"]
        assert sorted(g["domain"] for g in groups.values()) == sorted(DOMAINS)
        assert {g["domain"]: g["in_domain"] for g in groups.values()} == {
            d: d == "retail" for d in DOMAINS}
        assert all(g["tasks"] == 2 and g["pass^k"]["pass^1"] == 1.0 for g in groups.values()), groups
    assert set(result["stages"]) == {"eval_before", "eval_after"}
    assert started == ["retail"]  # one group (one engine per worker) for both stages and every domain
