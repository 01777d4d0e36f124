"""Step-level GRPO: tree rollouts from exact decision-point states and their samples.

Real parts: the compact retail environment, the scripted user, the episode runner and verl's
GRPO estimator.  The policy is the noisy teacher whose one error (the wrong cancel reason) is
drawn from the sampling seed, so continuations of one state differ the way a stochastic policy's
do, reproducibly.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from cast_rl.config import load_config
from cast_rl.rollout.noisy_expert import NoisyExpertPolicy
from cast_rl.rollout.runner import EpisodeRunner, EpisodeSpec, tree_points
from cast_rl.samples.builders import build_samples

K = 4


class SeededTeacher(NoisyExpertPolicy):
    """The teacher, with its error drawn from each request's sampling seed (odd: wrong reason)."""

    def __init__(self, tokenizer: Any, task: Any, write_tools: frozenset[str]) -> None:
        super().__init__(tokenizer, task, write_tools, None)

    async def act(self, state: Any, sampling: Any) -> Any:
        error = "wrong_argument" if sampling.seed % 2 else None
        return await NoisyExpertPolicy(self.tokenizer, self.task, self.write_tools, error).act(state, sampling)


@pytest.fixture(scope="module")
def setup(compact_cancel):  # noqa: ANN001, ANN201
    return compact_cancel(7, 6, "algorithm.samples=[step_groups]", f"algorithm.tree_branches={K}")


def _trees(setup, points: str = "writes") -> list:  # noqa: ANN001
    cfg, data, tok = setup
    out = []
    for task in range(4):
        runner = EpisodeRunner(cfg, data, SeededTeacher(tok, data.task("train", task), data.spec.write_tools))
        out.append(asyncio.run(runner.run_tree(EpisodeSpec("train", task, 0), K, points)))
    return out


def test_a_tree_branches_from_the_exact_state_before_each_write(setup) -> None:  # noqa: ANN001
    _, data, _ = setup
    for tree in _trees(setup):
        root, *branches = tree
        points = root.tree.points
        assert points == tree_points(root, "writes", data.spec.write_tools) and len(points) == 1
        assert len(branches) == (K - 1) * len(points)
        (point,) = points
        start = next(t.start for t in root.turns if t.message_index == point)
        for b in branches:
            assert b.tree.point == point
            # the shared prefix, token for token, up to the branching turn
            assert b.messages[:point] == root.messages[:point] and b.token_ids[:start] == root.token_ids[:start]
            # what the branch cost: its own actions after the shared prefix
            prefix = sum(1 for t in root.turns if t.message_index < point and t.executed)
            assert b.tree.env_steps == sum(1 for t in b.turns if t.executed) - prefix > 0
        # the branches sampled anew: some repeat the root's outcome, some do not
        assert {b.reward for b in tree} == {0.0, 1.0}


def test_step_group_advantages_are_relative_to_the_state_and_start_at_the_branch(setup) -> None:  # noqa: ANN001
    cfg, _, _ = setup
    trees = _trees(setup)
    trajs = [t for tree in trees for t in tree]
    samples = build_samples(trajs, cfg, "r0")
    assert samples and all(s.source == "step_groups" for s in samples)
    assert len({s.key for s in samples}) == len(samples)
    for s in samples:  # each names its own episode (branches share task, trial and prefix)
        assert s.origin is not None and s.origin.logprobs == "trajectory"
        source = trajs[s.origin.trajectory]
        assert source.tree.branch == s.info["branch"] and source.token_ids == s.token_ids
    by_group: dict[str, list] = {}
    for s in samples:
        by_group.setdefault(s.group, []).append(s)
    for group in by_group.values():
        assert len(group) == K
        assert abs(sum(s.advantage for s in group)) < 1e-5  # GRPO: the state's own mean is the baseline
        for s in group:
            assert (s.advantage > 0) == (s.reward == 1.0)
    # credit covers the branching turn and after, never the shared prefix
    for tree in trees:
        root = tree[0]
        (point,) = root.tree.points
        start = next(t.start for t in root.turns if t.message_index == point)
        (s,) = [s for s in samples if s.info["branch"] == 0 and s.group.endswith(f"/{root.task_index}/0/{point}")]
        assert not any(s.loss_mask[:start]) and s.loss_mask[start] == 1


def test_a_deterministic_policy_gives_no_step_signal(setup) -> None:  # noqa: ANN001
    cfg, data, tok = setup
    runner = EpisodeRunner(cfg, data, NoisyExpertPolicy(tok, data.task("train", 0), data.spec.write_tools, None))
    tree = asyncio.run(runner.run_tree(EpisodeSpec("train", 0, 0), K, "all"))
    assert len(tree) == 1 + (K - 1) * len(tree[0].tree.points) and {t.reward for t in tree} == {1.0}
    assert build_samples(tree, cfg, "r0") == []  # every group ended alike: dropped
    keep = dataclasses.replace(cfg, algorithm=dataclasses.replace(cfg.algorithm, filter_zero_variance_groups=False))
    kept = build_samples(tree, keep, "r0")
    assert kept and all(s.advantage == 0.0 for s in kept)


def test_tree_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="algorithm.tree_branches=1"):
        load_config(None, ["algorithm.tree_branches=1"])
    with pytest.raises(ValueError, match="algorithm.tree_points"):
        load_config(None, ["algorithm.tree_points=everywhere"])
