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
