"""The pipeline's shared rollout group across stages (:class:`cast_rl.pipeline.context.PipelineContext`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cast_rl.config import load_config
from cast_rl.pipeline.context import PipelineContext


class _Group:
    """The switches policy_moved uses; ``loads``: whether its engines can load a moved policy."""

    def __init__(self, cfg: Any, loads: bool) -> None:
        self.cfg, self.critic, self.loads = cfg, cfg.critic, loads
        self.loaded: list[str] = []
        self.shut = False

    def set_critic(self, critic: Any) -> str:
        self.critic = critic
        return "critic"

    def load_policy(self, cfg: Any) -> bool:
        if self.loads:
            self.loaded.append(cfg.policy.path)
        return self.loads

    def shutdown(self) -> None:
        self.shut = True


@pytest.mark.parametrize("loads", [True, False])
def test_a_moved_policy_loads_into_the_running_group_else_the_group_restarts_on_it(tmp_path: Path,
                                                                                   loads: bool) -> None:
    cfg = load_config(None, [f"run_dir={tmp_path}", f"policy.path={tmp_path / 'start'}"])
    groups: list[_Group] = []

    def make_group(c: Any) -> _Group:
        groups.append(_Group(c, loads))
        return groups[-1]

    ctx = PipelineContext(cfg, None, make_group=make_group)  # type: ignore[arg-type]
    ctx.policy_moved(tmp_path / "warm")  # no group yet: nothing starts
    assert groups == [] and ctx.policy_path == tmp_path / "warm"
    first = ctx.rollout_group()
    assert first.cfg.policy.path == str(tmp_path / "warm")
    ctx.policy_moved(tmp_path / "moved")
    assert ctx.policy_path == tmp_path / "moved"
    if loads:  # the running engines loaded it: no restart
        assert first.loaded == [str(tmp_path / "moved")] and not first.shut
        assert ctx.rollout_group() is first and len(groups) == 1
    else:  # another model: the group is shut down and the next stage starts one on the moved policy
        assert first.shut
        assert ctx.rollout_group() is groups[1] and groups[1].cfg.policy.path == str(tmp_path / "moved")


def test_the_heldout_comparison_prompts_the_base_model_with_its_instructions(tmp_path: Path) -> None:
    """``critic.system_prompt=false`` is the trained critic's prompt; the untrained base model of the
    held-out comparison is only prompted, so it keeps its instructions and the policy."""
    from launchers.stages import heldout_critic_configs

    cfg = load_config(None, [f"run_dir={tmp_path}", "critic.system_prompt=false", "critic.max_prompt_chars=600"])
    critics = heldout_critic_configs(cfg.critic, tmp_path / "base", tmp_path / "trained")
    assert (critics["base"].system_prompt, critics["trained"].system_prompt) == (True, False)
    assert critics["base"].max_prompt_chars == critics["trained"].max_prompt_chars == 600
    assert (critics["base"].model.path, critics["trained"].model.path) == (str(tmp_path / "base"), str(tmp_path / "trained"))


@pytest.mark.parametrize(("backend", "stages", "kept"), [
    ("trained", "[warmstart,train_critic,eval_critic,collect_with_critic]", True),
    ("trained", "[warmstart,eval_before,train_critic]", False),  # nothing serves it after
    ("rule", "[warmstart,train_critic,collect_with_critic]", False),  # the rule critic serves
])
def test_the_heldout_trained_critic_is_the_service_later_stages_join(tmp_path: Path, backend: str, stages: str,
                                                                     kept: bool) -> None:
    """Stage train_critic measures its critic on the held-out split with the very service the
    later stages serve (the run's named critic actor, which the rollout workers join) when a
    later stage serves it, instead of starting an engine for the measurement and another for the
    loop; the two configs must then build the same service."""
    from launchers.stages import _same_service, _serves_later, heldout_critic_configs

    cfg = load_config(None, [f"run_dir={tmp_path}", f"critic.backend={backend}", f"pipeline.stages={stages}",
                             "pipeline.critic_base=model", "pipeline.critic_train_steps=1", "critic.system_prompt=false",
                             "critic.verification_budget=1"])
    trained = tmp_path / "05_train_critic" / "model"
    trained.mkdir(parents=True)
    (trained / "config.json").write_text("{}")
    ctx = PipelineContext(cfg, None, make_group=lambda c: _Group(c, True))  # type: ignore[arg-type]
    assert _serves_later(ctx) is kept
    heldout = heldout_critic_configs(cfg.critic, tmp_path / "base", trained)["trained"]
    assert _same_service(ctx.critic_config(), heldout) is (backend == "trained")
    assert not _same_service(ctx.critic_config(), heldout_critic_configs(cfg.critic, tmp_path / "base",
                                                                         tmp_path / "elsewhere")["trained"])
