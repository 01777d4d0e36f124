"""The four-domain expert check: the gold-plan expert solves every test task of every domain, under
the built-in defaults and under ``configs/quickstart.yaml`` (whose policy reads identifiers as
aliases).  The check, as run by hand (then read OUT/report.json)::

    cast-rl eval configs/quickstart.yaml env.domain=D env.data_dir=../shared/benchmarks/D \\
        env.split=test env.task_indices=[] inference.backend=expert eval.trials=1 \\
        eval.verification_budgets=[0] --out OUT

A pass^1 below 1.000 points at the environment, the user, the reward or the plumbing between them
and the policy (an alias sent to a tool as it is, issue 26), never at the policy.  Here it runs
through the CLI entry in-process, on the session's Ray, with ``run_dir`` and the tiny policy's
tokenizer under a temporary directory.  Retail (115 tasks, the longest) is ``slow``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cast_rl.records import read_trajectories

DOMAINS = [pytest.param("retail", marks=pytest.mark.slow), "airline", "telecom", "telehealth"]
CONFIGS = ["configs/quickstart.yaml", "default"]


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One tiny policy (the tokenizer the expert writes with) per config, shared by its domains,
    as the check shares ``policy.path`` across domains."""
    return tmp_path_factory.mktemp("four-domain-models")


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("domain", DOMAINS)
def test_the_expert_solves_every_test_task(
    ray_local, benchmarks_dir: Path, models_dir: Path, repo_root: Path, tmp_path: Path,  # noqa: ANN001
    monkeypatch: pytest.MonkeyPatch, domain: str, config: str,
) -> None:
    from cast_rl.cli import main
    from cast_rl.envs.core import load_domain_data

    monkeypatch.chdir(repo_root)  # configs/quickstart.yaml, as the check names it
    data_dir = benchmarks_dir / domain
    out = tmp_path / "eval"
    policy = models_dir / Path(config).stem / "tiny-policy"
    argv = ["eval", config, f"env.domain={domain}", f"env.data_dir={data_dir}", "env.split=test",
            "env.task_indices=[]", "eval.unseen_seeds=[]", "inference.backend=expert", "eval.trials=1", "eval.verification_budgets=[0]",
            f"run_dir={tmp_path / 'run'}", f"policy.path={policy}", "--out", str(out)]
    assert main(argv) == 0

    (configuration,) = json.loads((out / "report.json").read_text())["configurations"]
    group = configuration["groups"][f"{domain}/test"]
    failed = sorted(int(t) for t, ok in group["task_successes"].items() if not ok)
    assert group["tasks"] == len(load_domain_data(domain, data_dir).tasks("test"))
    assert group["pass^k"]["pass^1"] == 1.0, f"{domain} under {config}: test tasks {failed} failed"
    trajectories = read_trajectories(out / "trajectories" / "no_critic.jsonl")
    assert len(trajectories) == group["tasks"]
    # the expert never wrote a turn that could not run (an alias the conversation cannot map
    # back is one), and its token ids are the canonical rendering of what it wrote
    assert sum(t.malformed_calls for t in trajectories) == 0
    assert all(t.info["tokens_consistent"] for t in trajectories)
