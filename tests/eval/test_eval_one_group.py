"""``run_eval`` over ``eval.domains`` with one rollout group: it switches the group from domain
to domain and, given the pipeline's group, back to the domain that group served.

The group here is one in-process :class:`~cast_rl.rollout.worker.RolloutWorker` on a scripted
engine (no Ray, no vLLM); the domains are ``../shared/benchmarks`` (skipped without them).

    .venv/bin/python -m pytest tests/eval/test_eval_one_group.py -q
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from cast_rl.config import load_config
from cast_rl.envs.setup import load_env_data
from cast_rl.rollout.expert import ScriptPolicy
from cast_rl.rollout.worker import RolloutWorker


class InProcessGroup:
    """The rollout group's interface over one in-process worker; records its domain switches."""

    def __init__(self, cfg: Any, engine: Any) -> None:
        self.cfg, self.critic = cfg, cfg.critic
        self.worker = RolloutWorker(cfg, load_env_data(cfg), engine)
        self.switches: list[tuple[str, str]] = []
        self.shut = False

    def set_domain(self, cfg: Any) -> None:
        asyncio.run(self.worker.set_domain(cfg, load_env_data(cfg)))
        self.cfg = replace(self.cfg, env=cfg.env)
        self.switches.append((cfg.env.domain, cfg.env.data_dir))

    def set_verification_budget(self, budget: int) -> None:
        self.worker.set_verification_budget(budget)

    def collect(self, units: list[tuple[str, int, int]], tree: Any = None, *, on_done: Any = None) -> list[Any]:
        trajs = asyncio.run(self.worker.collect(units))
        for t in trajs:
            if on_done is not None:
                on_done(t)
        return trajs

    def metrics(self) -> dict[str, float]:
        return self.worker.metrics()

    def shutdown(self) -> None:
        self.shut = True


def test_one_group_serves_every_domain_and_goes_back_to_its_own(
    benchmarks_dir: Path, retail_data_dir: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    from transformers import AutoTokenizer

    from launchers.eval import run_eval

    domains = ["retail", "airline", "telehealth"]
    # the pipeline's group serves its training domain: generated retail
    cfg = load_config(None, [
        f"run_dir={tmp_path / 'run'}", f"env.data_dir={retail_data_dir}", "env.split=test", "env.task_indices=[0,1]",
        "env.max_steps=2", "inference.max_model_len=65536", "critic.backend=rule", "critic.service=false",
        f"eval.domains=[{','.join(domains)}]", f"eval.data_root={benchmarks_dir}", "eval.trials=1",
        "eval.verification_budgets=[0,1]", "logging.mode=disabled",
    ])
    engine = ScriptPolicy(AutoTokenizer.from_pretrained(tiny_model_dir), ["Goodbye."])
    group = InProcessGroup(cfg, engine)
    report = run_eval(cfg, tmp_path / "eval", group=group)

    assert group.switches == [*((d, str(benchmarks_dir / d)) for d in domains), ("retail", str(retail_data_dir))]
    assert group.cfg.env == cfg.env and not group.shut  # the pipeline's next stage finds its domain
    assert group.worker.runner.data.data_dir == retail_data_dir
    for configuration in report["configurations"]:
        assert sorted(g["domain"] for g in configuration["groups"].values()) == sorted(domains)
        assert all(g["tasks"] == 2 for g in configuration["groups"].values())
    lines = (tmp_path / "eval" / "trajectories" / "critic_b1.jsonl").read_text().splitlines()
    assert [json.loads(line)["domain"] for line in lines] == [d for d in domains for _ in range(2)]
    # every domain ran both budgets on the one worker
    assert group.worker.metrics()["rollout/episodes"] == 2 * 2 * len(domains)


def test_a_standalone_evaluation_starts_one_group_and_shuts_it_down(
    benchmarks_dir: Path, tiny_model_dir: Path, tmp_path: Path, monkeypatch: Any
) -> None:
    from transformers import AutoTokenizer

    from launchers import eval as launcher

    domains = ["airline", "telehealth"]
    cfg = load_config(None, [
        f"run_dir={tmp_path / 'run'}", f"policy.path={tiny_model_dir}", "env.split=test", "env.task_indices=[0]",
        "env.max_steps=2", "inference.max_model_len=65536", f"eval.domains=[{','.join(domains)}]",
        f"eval.data_root={benchmarks_dir}", "eval.trials=1", "eval.verification_budgets=[0]", "logging.mode=disabled",
    ])
    engine = ScriptPolicy(AutoTokenizer.from_pretrained(tiny_model_dir), ["Goodbye."])
    started: list[InProcessGroup] = []
    per_domain: list[str] = []
    monkeypatch.setattr(launcher, "RolloutGroup", lambda c: started.append(InProcessGroup(c, engine)) or started[-1])
    monkeypatch.setattr(launcher, "init_ray", lambda c, parts: per_domain.append(c.env.domain))
    monkeypatch.setattr(launcher, "ensure_policy_model", lambda c, data: None)
    report = launcher.run_eval(cfg, tmp_path / "eval")

    (group,) = started  # one group (one engine per worker) for both domains
    assert per_domain == domains  # init_ray (and ensure_policy_model) per domain, as before
    assert [d for d, _ in group.switches] == domains[1:] and group.shut
    (configuration,) = report["configurations"]
    assert sorted(g["domain"] for g in configuration["groups"].values()) == domains
