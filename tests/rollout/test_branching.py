"""Counterfactual branches: the exact state before any action, by snapshot or by replay.

Real parts: the generated compact retail environment, the deterministic scripted user, the
noisy expert as a deterministic (greedy) policy through the real episode runner, the rule
critic in the loop.  A branch from a decision point with the same action and seed reproduces the
rest of the episode token for token; replaying the recorded prefix reaches the same state as the
snapshot taken while the episode ran; a substituted action changes only what follows it.
"""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from cast_rl.critique.verifier import RuleVerifier
from cast_rl.envs.types import Action
from cast_rl.records import Trajectory
from cast_rl.rollout.noisy_expert import NoisyExpertPolicy
from cast_rl.rollout.runner import EpisodeRunner, EpisodeSpec, EpisodeState, ReplayDiverged

SPEC = EpisodeSpec("train", 0, 0)


@pytest.fixture(scope="module")
def setup(compact_cancel):  # noqa: ANN001, ANN201
    return compact_cancel(5, 4)


def _runner(setup, error: str | None, critic: bool) -> EpisodeRunner:  # noqa: ANN001
    cfg, data, tok = setup
    if critic:
        cfg = dataclasses.replace(cfg, critic=dataclasses.replace(cfg.critic, verification_budget=1))
    engine = NoisyExpertPolicy(tok, data.task("train", SPEC.task_index), data.spec.write_tools, error)
    return EpisodeRunner(cfg, data, engine, RuleVerifier({"retail": data.tools}) if critic else None)


def _run_with_snapshots(runner: EpisodeRunner) -> tuple[Trajectory, dict[int, EpisodeState]]:
    snapshots: dict[int, EpisodeState] = {}

    def keep(state: EpisodeState) -> None:
        snapshots[state.message_index] = state.fork()

    return asyncio.run(runner.run(SPEC, on_decision=keep)), snapshots


def _same(a: Trajectory, b: Trajectory) -> None:
    assert a.messages == b.messages
    assert (a.token_ids, a.loss_mask, a.logprobs) == (b.token_ids, b.loss_mask, b.logprobs)
    assert (a.reward, a.turns, a.verification_rounds) == (b.reward, b.turns, b.verification_rounds)
    assert a.info["termination"] == b.info["termination"]


@pytest.mark.parametrize(("error", "critic"), [(None, False), ("wrong_argument", True)])
def test_a_branch_with_the_same_action_and_seed_reproduces_the_episode(setup, error, critic) -> None:  # noqa: ANN001
    runner = _runner(setup, error, critic)
    original, snapshots = _run_with_snapshots(runner)
    assert original.reward == 1.0 and len(snapshots) >= 6
    assert bool(original.verification_rounds) == critic  # the critic stopped the wrong cancel
    for index, snapshot in sorted(snapshots.items()):
        _same(asyncio.run(runner.continue_from(snapshot)), original)
        # the snapshot is a decision point: the policy's next message gets this index
        assert original.messages[index]["role"] == "assistant"


@pytest.mark.parametrize(("error", "critic"), [(None, False), ("wrong_argument", True)])
def test_replaying_the_prefix_reaches_the_snapshot_state(setup, error, critic) -> None:  # noqa: ANN001
    runner = _runner(setup, error, critic)
    original, snapshots = _run_with_snapshots(runner)
    for index, snapshot in sorted(snapshots.items()):
        replayed = asyncio.run(runner.replay(original, index))
        assert replayed.conv.token_ids == snapshot.conv.token_ids
        assert replayed.conv.messages == snapshot.conv.messages
        assert replayed.episode.env.state_hash() == snapshot.episode.env.state_hash()
        assert (replayed.steps, replayed.round_index, replayed.turns) == (snapshot.steps, snapshot.round_index, snapshot.turns)
        assert replayed.rounds == snapshot.rounds
        if error is None:  # the teacher's drawn error is engine state a replay does not rebuild
            _same(asyncio.run(runner.continue_from(replayed)), original)


def test_replay_refuses_what_it_cannot_rebuild(setup) -> None:  # noqa: ANN001
    runner = _runner(setup, None, False)
    original, _ = _run_with_snapshots(runner)
    with pytest.raises(ValueError, match="not an assistant message"):
        asyncio.run(runner.replay(original, 1))
    # a recorded user reply that the scripted user would not give: the replay says where
    tampered = dataclasses.replace(original, messages=[dict(m) for m in original.messages])
    user_turns = [i for i, m in enumerate(tampered.messages) if m["role"] == "user"]
    tampered.messages[user_turns[1]]["content"] = "Something else entirely."
    last = max(i for i, m in enumerate(original.messages) if m["role"] == "assistant")
    with pytest.raises(ReplayDiverged, match=f"message {user_turns[1]} differs"):
        asyncio.run(runner.replay(tampered, last))


def test_a_substituted_action_changes_only_what_follows(setup) -> None:  # noqa: ANN001
    cfg, data, _ = setup
    runner = _runner(setup, "wrong_argument", critic=False)
    original, snapshots = _run_with_snapshots(runner)
    assert original.reward == 0.0  # the wrong cancel reason ran unchecked
    bad = next(t for t in original.turns if t.action and t.action["name"] == "cancel_pending_order")
    gold = next(a for a in data.task("train", SPEC.task_index).actions if a.name == "cancel_pending_order")
    assert bad.action["kwargs"] != gold.kwargs
    snapshot = snapshots[bad.message_index]
    before = snapshot.episode.env.state_hash()

    fixed = asyncio.run(runner.continue_from(snapshot, action=Action(gold.name, dict(gold.kwargs))))
    assert fixed.reward == 1.0  # the outcome flips: the wrong reason was decisive
    # the prefix is the original's, token for token; only what follows the decision differs
    assert fixed.messages[: bad.message_index] == original.messages[: bad.message_index]
    assert fixed.token_ids[: bad.start] == original.token_ids[: bad.start]
    assert fixed.messages[bad.message_index] != original.messages[bad.message_index]
    turn = fixed.turns[len(original.turns[: original.turns.index(bad)])]
    assert turn.substituted and turn.action == {"name": gold.name, "kwargs": gold.kwargs}
    assert set(fixed.loss_mask[turn.start : turn.end]) == {0}  # not the policy's sample
    assert not any(t.substituted for t in original.turns)
    # the decision point itself is untouched: a second branch without substitution replays the error
    assert snapshot.episode.env.state_hash() == before
    _same(asyncio.run(runner.continue_from(snapshot)), original)


def test_k_branches_from_one_state_are_independent(setup) -> None:  # noqa: ANN001
    runner = _runner(setup, None, False)
    original, snapshots = _run_with_snapshots(runner)
    first_write = min(i for i, s in snapshots.items() if s.steps >= 3)
    branches = [asyncio.run(runner.continue_from(snapshots[first_write], seed=k)) for k in range(3)]
    for b in branches:  # a deterministic policy: every seed gives the original continuation
        _same(b, original)
    # the branches ran on their own forks: the decision point still holds its pre-write state
    assert snapshots[first_write].episode.env.state_hash() != _final_hash(runner, original)


def _final_hash(runner: EpisodeRunner, traj: Trajectory) -> str:
    last = max(i for i, m in enumerate(traj.messages) if m["role"] == "assistant")
    state = asyncio.run(runner.replay(traj, last))
    return state.episode.env.state_hash()


def test_each_turn_samples_with_a_seed_of_its_own_that_reruns_repeat(setup) -> None:  # noqa: ANN001
    """Per-turn seeds (episode seed x conversation length): every policy call of an episode,
    the revision after a critique included, gets its own seed; a rerun of the episode gets the
    same ones; another trial gets others."""
    cfg, data, tok = setup

    class Recording(NoisyExpertPolicy):
        def __init__(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003
            super().__init__(*args, **kwargs)
            self.seeds: list[int | None] = []

        async def act(self, state, sampling):  # noqa: ANN001, ANN202
            self.seeds.append(sampling.seed)
            return await super().act(state, sampling)

    def seeds(spec: EpisodeSpec) -> tuple[list[int | None], Trajectory]:
        critic_cfg = dataclasses.replace(cfg, critic=dataclasses.replace(cfg.critic, verification_budget=1))
        engine = Recording(tok, data.task("train", spec.task_index), data.spec.write_tools, "wrong_argument")
        runner = EpisodeRunner(critic_cfg, data, engine, RuleVerifier({"retail": data.tools}))
        traj = asyncio.run(runner.run(spec))
        return engine.seeds, traj

    first, traj = seeds(SPEC)
    assert traj.verification_rounds, "the wrong cancel was not critiqued"
    assert None not in first and len(set(first)) == len(first)  # the revision's seed is new too
    assert seeds(SPEC)[0] == first
    other = seeds(dataclasses.replace(SPEC, trial=1))[0]
    assert not set(other) & set(first)
