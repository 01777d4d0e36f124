"""Critique-aware training samples from trajectories, selected by ``algorithm.samples``.

Every builder reads the runner's per-turn records (:class:`~cast_rl.records.PolicyTurn`:
the token span of each assistant message, its parsed action, the critic's verdict and whether it
ran), never guesses turns from the loss mask.  A proposal the critic rejected never ran; no
builder gives it a positive loss.  The kinds, combinable, are picked by name from
:data:`SAMPLE_BUILDERS` (each of the paper's comparisons is one switch):

``outcome_groups`` (GRPO with the critic in the loop)
    The G trials of one task in one collection form a group; verl's estimator
    (``algorithm.adv_estimator``) turns the raw task outcomes into one advantage per trajectory,
    given to the tokens of the turns that ran.  Turn-level credit from the critic comes on top:
    every turn the critic judged gets ``algorithm.critic_reward_weight`` x (+1 valid, -1 invalid)
    on its own tokens, and a rejected proposal gets only that (never the trajectory's outcome).
    With ``algorithm.filter_zero_variance_groups``, trajectories of groups whose raw outcomes are
    all equal and that carry no critic credit are dropped (dynamic sampling on the raw outcome,
    not on shaped rewards); :func:`zero_variance_groups` counts them for the metrics.

``revision``
    Each revision the critic judged is a sample of its own: the prompt is everything before the
    revision, the response its tokens; reward 1 when the critic accepted it, 0 when it rejected
    it again or it was malformed.  All revision samples of a collection form one verl group.

``supervised`` (critique-enriched SFT, the paper's recipe)
    Successful trajectories that a critique corrected, as they happened: critiques stay in the
    context, the loss covers the turns that ran, a rejected proposal has mask 0.

``distill`` (critique-free distillation)
    The same trajectories with every rejected proposal and its critique cut out of the token
    sequence, so the policy learns the corrected action in the context it had before the
    critique (no critic needed at test time).  The cut is token-exact: the generation prompt
    before the proposal is followed directly by the revision's tokens.

``rft`` (rejection-sampling fine-tuning baseline)
    Successful trajectories in which no critique happened; loss on every policy turn.

``step_groups`` (step-level GRPO on tree rollouts)
    Training episodes are collected as trees (:meth:`~cast_rl.rollout.runner.EpisodeRunner.run_tree`):
    from each decision point ``algorithm.tree_points`` names, ``algorithm.tree_branches`` - 1 more
    continuations start from the root's exact state.  The K episodes that share a state form a
    group; verl's estimator turns their raw outcomes into advantages relative to that state's
    own baseline, credited only to the tokens of the branching turn and after it (the shared
    prefix gets nothing from the group).  Unlike per-turn-index normalisation across different
    trajectories, every comparison is between continuations of one state.  The root takes part
    in each of its points' groups, one sample per group.

Every sample cut from a trajectory records it in :attr:`~cast_rl.samples.Sample.origin`: the
trajectory's position in the builder's input (the list the loop hands to the replay buffer beside
the samples) and how the sample's logprobs follow from the trajectory's; the buffer's log then
refers to the trajectory instead of repeating its tokens.  A distillation sample with a cut is no
prefix of its trajectory and has none.

Every builder takes the advantage computation as ``advantages`` (default :func:`verl_advantages`,
the one place that imports torch and verl, lazily), so the module itself is torch-free and the
replay buffer's Ray actor can build a collection's samples where the trajectories arrive.

Parquet datasets (critic data, rejection-sampling data) load through
:func:`cast_rl.samples.parquet.supervised_from_parquet`.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

from cast_rl.config.schema import CastConfig
from cast_rl.records import EpisodeSummary, PolicyTurn, Trajectory
from cast_rl.samples import Origin, Sample

logger = logging.getLogger(__name__)

Advantages = Callable[[Sequence[float], Sequence[Sequence[int]], Sequence[str], str, bool], list[float]]
"""(rewards, loss masks, group ids, estimator, normalise by std) -> one advantage per sequence:
:func:`verl_advantages`, or a function that runs it elsewhere (the replay buffer's Ray actor,
which stays torch-free, hands it to a Ray task: :func:`actors.replay_buffer.advantages_in_task`)."""

VERDICT_CREDIT = {"valid": 1.0, "invalid": -1.0}
"""Turn-level process reward per critic verdict (unparsable and unchecked turns get none)."""


def policy_turns(traj: Trajectory) -> list[PolicyTurn]:
    """The runner's turn records; a file without them is usable only when nothing was critiqued.

    Trajectories written before turns were recorded have no spans: without critique rounds every
    policy token belongs to a turn that ran, so the mask alone is exact; with rounds it is not,
    and such a file is refused rather than guessed at.
    """
    if traj.turns:
        return traj.turns
    if traj.verification_rounds:
        raise ValueError(f"trajectory {traj.key} has verification rounds but no turn records "
                         "(written by an older cast_rl); collect it again")
    return []


def executed_mask(traj: Trajectory, turns: Sequence[PolicyTurn]) -> list[int]:
    """1 on the generated tokens of turns that ran, 0 elsewhere (rejected proposals included)."""
    if not turns:
        return list(traj.loss_mask)
    mask = [0] * len(traj.token_ids)
    for turn in turns:
        if turn.executed:
            mask[turn.start:turn.end] = [1] * (turn.end - turn.start)
    return mask


def turn_credit(turns: Sequence[PolicyTurn], weight: float) -> list[tuple[PolicyTurn, float]]:
    """(turn, weight x verdict credit) for each turn the critic judged."""
    if weight == 0.0:
        return []
    return [(t, weight * VERDICT_CREDIT[t.verdict]) for t in turns if t.verdict in VERDICT_CREDIT]


def verl_advantages(
    rewards: Sequence[float],
    masks: Sequence[Sequence[int]],
    groups: Sequence[str],
    estimator: str,
    norm_adv_by_std: bool = True,
) -> list[float]:
    """Per-sequence advantages from verl's outcome estimator ``estimator``.

    Builds verl's layout: ``token_level_rewards`` (B, T) holding each reward on the sequence's
    last masked token, ``response_mask`` (B, T), ``index`` the group ids.
    """
    import numpy as np
    import torch
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn

    n = len(rewards)
    width = max((len(m) for m in masks), default=0)
    mask = torch.zeros(n, max(width, 1))
    scores = torch.zeros_like(mask)
    for i, m in enumerate(masks):
        mask[i, : len(m)] = torch.tensor(m, dtype=torch.float32)
        ones = torch.nonzero(mask[i]).flatten()
        if len(ones) == 0:
            raise ValueError(f"sequence {i} (group {groups[i]!r}) has no policy tokens")
        scores[i, int(ones[-1])] = float(rewards[i])
    fn = get_adv_estimator_fn(estimator)
    kwargs: dict[str, Any] = {"token_level_rewards": scores, "response_mask": mask}
    kwargs["index"] = np.array(list(groups), dtype=object)
    if estimator.startswith("grpo"):
        kwargs["norm_adv_by_std_in_grpo"] = norm_adv_by_std
    adv, _ = fn(**kwargs)
    out = []
    for i in range(n):
        values = adv[i][mask[i] > 0]
        # Outcome estimators give one value per sequence; anything else is not what we store.
        assert torch.allclose(values, values[0].expand_as(values), atol=1e-6), estimator
        out.append(float(values[0]))
    return out


def group_id(traj: Trajectory, round_id: str) -> str:
    return f"{round_id}/{traj.domain}/{traj.split}/{traj.task_index}"


def sample_key(traj: Trajectory, round_id: str, kind: str, suffix: str = "") -> str:
    """Unique per collection, episode and kind: a retried add of the same collection dedupes."""
    base = f"{round_id}/{traj.domain}/{traj.split}/{traj.task_index}/{traj.trial}/{kind}"
    return f"{base}/{suffix}" if suffix else base


def zero_variance_groups(trajs: Sequence[Trajectory | EpisodeSummary]) -> tuple[int, int]:
    """(groups whose raw outcomes are all equal, groups): episodes (trajectories or their
    summaries) grouped by task."""
    outcomes: dict[tuple, set[float]] = defaultdict(set)
    for t in trajs:
        outcomes[(t.domain, t.split, t.task_index)].add(float(t.reward))
    return sum(len(v) == 1 for v in outcomes.values()), len(outcomes)


def outcome_group_samples(trajs: Sequence[Trajectory], cfg: CastConfig, round_id: str,
                          advantages: Advantages = verl_advantages) -> list[Sample]:
    """One policy sample per trajectory: outcome advantage plus turn-level credit (module doc)."""
    algo = cfg.algorithm
    rows = []
    for i, t in enumerate(trajs):
        turns = policy_turns(t)
        mask = executed_mask(t, turns)
        if any(mask):
            rows.append((t, mask, turn_credit(turns, algo.critic_reward_weight), i))
    if len(rows) < len(trajs):
        logger.warning("skipped %d trajectories without policy tokens", len(trajs) - len(rows))
    if not rows:
        return []
    groups = [group_id(t, round_id) for t, _, _, _ in rows]
    advs = advantages([float(t.reward) for t, _, _, _ in rows], [m for _, m, _, _ in rows], groups,
                           algo.adv_estimator, algo.norm_adv_by_std)
    outcomes: dict[str, set[float]] = defaultdict(set)
    for (t, _, _, _), g in zip(rows, groups):
        outcomes[g].add(float(t.reward))
    varied = {g for g, seen in outcomes.items() if len(seen) > 1}
    out = []
    for (t, mask, credit, i), adv, g in zip(rows, advs, groups):
        if algo.filter_zero_variance_groups and g not in varied and not credit:
            continue  # nothing to learn: equal outcomes and no critic verdict
        for turn, _ in credit:  # judged turns carry loss, rejected ones too
            mask[turn.start:turn.end] = [1] * (turn.end - turn.start)
        out.append(Sample(
            key=sample_key(t, round_id, "outcome"), source="outcome_groups", token_ids=list(t.token_ids),
            loss_mask=mask, logprobs=list(t.logprobs), advantage=adv, reward=float(t.reward),
            policy_version=t.policy_version, group=g, critique_changed=bool(t.verification_rounds),
            span_advantages=[[turn.start, turn.end, (adv if turn.executed else 0.0) + v] for turn, v in credit],
            info={"outcome": float(t.reward), "zero_variance_group": g not in varied},
            origin=Origin(i, "trajectory"),
        ))
    return out


def step_group_samples(trajs: Sequence[Trajectory], cfg: CastConfig, round_id: str,
                       advantages: Advantages = verl_advantages) -> list[Sample]:
    """One policy sample per (episode, decision point) of the collected trees (module doc)."""
    algo = cfg.algorithm
    members: dict[str, list[tuple[int, int, int]]] = defaultdict(list)
    for i, t in enumerate(trajs):
        tree = t.tree
        if tree is None:
            continue
        base = f"{group_id(t, round_id)}/{t.trial}"
        if tree.point is None:  # the root belongs to the group of each of its points
            for point in tree.points or []:
                members[f"{base}/{point}"].append((i, point, 0))
        else:
            members[f"{base}/{tree.point}"].append((i, tree.point, tree.branch))
    rows = []
    for g, group in members.items():
        if len(group) < 2:
            continue
        for i, point, branch in group:
            t = trajs[i]
            turns = [turn for turn in policy_turns(t) if turn.message_index >= point]
            mask = executed_mask(t, turns) if turns else [0] * len(t.token_ids)
            if any(mask):
                rows.append((i, point, branch, mask, g))
    if not rows:
        return []
    advs = advantages([float(trajs[r[0]].reward) for r in rows], [r[3] for r in rows], [r[4] for r in rows],
                           algo.adv_estimator, algo.norm_adv_by_std)
    outcomes: dict[str, set[float]] = defaultdict(set)
    for i, _, _, _, g in rows:
        outcomes[g].add(float(trajs[i].reward))
    out = []
    for (i, point, branch, mask, g), adv in zip(rows, advs):
        t = trajs[i]
        if algo.filter_zero_variance_groups and len(outcomes[g]) == 1:
            continue  # every continuation of this state ended alike: no step-level signal
        out.append(Sample(
            key=sample_key(t, round_id, "step", f"{point}/{branch}"), source="step_groups",
            token_ids=list(t.token_ids), loss_mask=mask, logprobs=list(t.logprobs), advantage=adv,
            reward=float(t.reward), policy_version=t.policy_version, group=g,
            critique_changed=bool(t.verification_rounds),
            info={"outcome": float(t.reward), "point": point, "branch": branch},
            origin=Origin(i, "trajectory"),
        ))
    return out


def revision_samples(trajs: Sequence[Trajectory], cfg: CastConfig, round_id: str,
                     advantages: Advantages = verl_advantages) -> list[Sample]:
    """A policy sample per judged revision; reward = the critic accepted it (module doc)."""
    pending: list[tuple[int, PolicyTurn, float]] = []
    for i, t in enumerate(trajs):
        turns = policy_turns(t)
        for before, turn in zip(turns, turns[1:]):
            if before.executed:
                continue  # ``turn`` is not a revision
            if turn.action is None:
                reward = 0.0  # a malformed revision
            elif turn.verdict in VERDICT_CREDIT:
                reward = 1.0 if turn.verdict == "valid" else 0.0
            else:
                continue  # budget spent or the critic's answer unreadable: nobody judged it
            pending.append((i, turn, reward))
    if not pending:
        return []
    group = f"{round_id}/revisions"
    rewards = [p[2] for p in pending]
    masks = [[1] * (turn.end - turn.start) for _, turn, _ in pending]
    advs = advantages(rewards, masks, [group] * len(pending), cfg.algorithm.adv_estimator,
                           cfg.algorithm.norm_adv_by_std)
    out = []
    for (i, turn, reward), adv in zip(pending, advs):
        t, s, e = trajs[i], turn.start, turn.end
        out.append(Sample(
            key=sample_key(t, round_id, "revision", str(turn.message_index)), source="revision",
            token_ids=list(t.token_ids[:e]), loss_mask=[0] * s + [1] * (e - s),
            logprobs=[0.0] * s + list(t.logprobs[s:e]), advantage=adv, reward=reward,
            policy_version=t.policy_version, group=group, critique_changed=True,
            info={"message_index": turn.message_index},
            origin=Origin(i, "masked"),  # the prefix up to the revision, logprobs on it only
        ))
    return out


def _supervised(t: Trajectory, round_id: str, kind: str, ids: list[int], mask: list[int],
                origin: Origin | None) -> Sample:
    return Sample(
        key=sample_key(t, round_id, kind), source="supervised", token_ids=ids, loss_mask=mask,
        logprobs=[0.0] * len(ids), reward=float(t.reward), policy_version=t.policy_version,
        group=f"{round_id}/{kind}", critique_changed=bool(t.verification_rounds), origin=origin,
    )


def _corrected_successes(trajs: Sequence[Trajectory], cfg: CastConfig) -> list[tuple[int, Trajectory]]:
    """(position, trajectory) of each success a critique corrected."""
    threshold = cfg.algorithm.success_threshold
    return [(i, t) for i, t in enumerate(trajs) if t.verification_rounds and t.reward >= threshold]


def supervised_from_trajectories(trajs: Sequence[Trajectory], cfg: CastConfig, round_id: str,
                                 advantages: Advantages = verl_advantages) -> list[Sample]:
    """Critique-enriched SFT: corrected successes as they ran; rejected proposals have mask 0."""
    out = []
    for i, t in _corrected_successes(trajs, cfg):
        mask = executed_mask(t, policy_turns(t))
        if any(mask):
            out.append(_supervised(t, round_id, "supervised", list(t.token_ids), mask, Origin(i, "zero")))
    return out


def distill_cut(t: Trajectory) -> tuple[list[int], list[int]]:
    """(token ids, loss mask) with each rejected proposal and its critique removed.

    A rejected turn's tokens start right after the generation prompt; everything from there to
    the start of the next turn (the proposal, its closing newline, the critic's message and the
    next generation prompt) goes, so the revision follows the original generation prompt.
    """
    turns = policy_turns(t)
    mask = executed_mask(t, turns)
    cuts = [(turn.start, nxt.start) for turn, nxt in zip(turns, turns[1:]) if not turn.executed]
    ids, keep = [], []
    position = 0
    for start, end in cuts:
        ids += t.token_ids[position:start]
        keep += mask[position:start]
        position = end
    return ids + t.token_ids[position:], keep + mask[position:]


def distill_from_trajectories(trajs: Sequence[Trajectory], cfg: CastConfig, round_id: str,
                              advantages: Advantages = verl_advantages) -> list[Sample]:
    """Critique-free distillation of the corrected successes (see :func:`distill_cut`)."""
    out = []
    for i, t in _corrected_successes(trajs, cfg):
        ids, mask = distill_cut(t)
        if any(mask):  # with tokens cut out of the middle it is no prefix of the trajectory: no origin
            origin = Origin(i, "zero") if len(ids) == len(t.token_ids) else None
            out.append(_supervised(t, round_id, "distill", ids, mask, origin))
    return out


def rft_from_trajectories(trajs: Sequence[Trajectory], cfg: CastConfig, round_id: str,
                          advantages: Advantages = verl_advantages) -> list[Sample]:
    """RFT baseline: successful trajectories no critique touched, loss on every policy turn."""
    threshold = cfg.algorithm.success_threshold
    return [
        _supervised(t, round_id, "rft", list(t.token_ids), list(t.loss_mask), Origin(i, "zero"))
        for i, t in enumerate(trajs)
        if not t.verification_rounds and t.reward >= threshold and any(t.loss_mask)
    ]


SampleBuilder = Callable[[Sequence[Trajectory], CastConfig, str], list[Sample]]

SAMPLE_BUILDERS: dict[str, SampleBuilder] = {
    "outcome_groups": outcome_group_samples,
    "revision": revision_samples,
    "supervised": supervised_from_trajectories,
    "distill": distill_from_trajectories,
    "rft": rft_from_trajectories,
    "step_groups": step_group_samples,
}
SUPERVISED_KINDS = ("supervised", "distill", "rft")
"""Kinds that give cross-entropy samples (the pipeline fine-tunes on them before any RL)."""


def build_samples(trajs: Sequence[Trajectory], cfg: CastConfig, round_id: str,
                  advantages: Advantages = verl_advantages) -> list[Sample]:
    """Every sample kind named in ``algorithm.samples``, from one collection of trajectories.

    ``round_id`` names the collection (e.g. ``"step12"``): GRPO groups never span collections.
    """
    out: list[Sample] = []
    for kind in cfg.algorithm.samples:
        out.extend(SAMPLE_BUILDERS[kind](trajs, cfg, round_id, advantages))
    return out
