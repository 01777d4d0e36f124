"""``critic.checks``: which proposals the critic sees, and what the critic metrics count as checked."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from cast_rl.config.critic import CriticConfig
from cast_rl.critique.verifier import RuleVerifier
from cast_rl.envs.types import RESPOND
from cast_rl.eval.critic import critic_metrics, labeller_judge
from cast_rl.rollout.noisy_expert import NoisyExpertPolicy
from cast_rl.rollout.runner import EpisodeRunner, EpisodeSpec


@pytest.fixture(scope="module")
def setup(compact_cancel):  # noqa: ANN001, ANN201
    return compact_cancel(5, 4)


class Recording(RuleVerifier):
    """The rule critic, remembering the name of every proposal it was asked about."""

    def __init__(self, tools: dict[str, Any]) -> None:
        super().__init__(tools)
        self.seen: list[str] = []

    async def verify(self, requests):  # noqa: ANN001, ANN201
        self.seen += [str(r.proposal.get("name")) for r in requests]
        return await super().verify(requests)


@pytest.mark.parametrize("checks", ["all", "tool_calls", "writes"])
def test_the_critic_sees_only_the_proposals_in_its_scope(setup, checks: str) -> None:  # noqa: ANN001
    cfg, data, tok = setup
    cfg = dataclasses.replace(cfg, critic=dataclasses.replace(cfg.critic, verification_budget=1, checks=checks))
    verifier = Recording({"retail": data.tools})
    policy = NoisyExpertPolicy(tok, data.task("train", 0), data.spec.write_tools, "missing_confirmation")
    traj = asyncio.run(EpisodeRunner(cfg, data, policy, verifier).run(EpisodeSpec("train", 0, 0)))
    seen = set(verifier.seen)
    assert {"all": RESPOND in seen and seen - {RESPOND} - set(data.spec.write_tools),
            "tool_calls": RESPOND not in seen and seen - set(data.spec.write_tools),
            "writes": seen <= set(data.spec.write_tools)}[checks], seen
    # the unconfirmed cancel is a write: every scope catches it, and the episode recovers
    assert [r.proposal["name"] for r in traj.verification_rounds] == ["cancel_pending_order"]
    assert traj.reward == 1.0
    checked = {t.message_index for t in traj.turns if t.verdict is not None}
    assert len(checked) == len(verifier.seen)
    metrics = critic_metrics([traj], 1, judge=labeller_judge({"retail": data}))
    assert metrics["false_positive_rate"] == 0.0 and metrics["correction_rate"] == 1.0


def test_a_scope_outside_the_choices_names_the_key() -> None:
    with pytest.raises(ValueError, match="critic.checks"):
        CriticConfig(checks="replies")
