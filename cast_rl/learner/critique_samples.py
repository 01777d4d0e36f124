"""Critique-aware training samples from trajectories, selected by ``algorithm.samples``.

Three kinds, combinable (the builders are picked by name from :data:`SAMPLE_BUILDERS`):

``outcome_groups``
    The G trials of one task in one collection form a group.  Reward = task outcome +
    ``algorithm.critic_reward_weight`` x :func:`critic_score`.  Advantages come from verl's
    estimator named by ``algorithm.adv_estimator`` (``get_adv_estimator_fn``), computed on the
    token-level layout verl expects (reward on the last policy token, ``response_mask`` = the
    trajectory's ``loss_mask``), so only policy tokens carry loss.

``revision``
    Where a critique made the policy revise, the revised action is a sample of its own.
    *Approximation*: the k-th assistant message of a trajectory is taken to be the k-th maximal
    run of ``loss_mask`` = 1 tokens (each policy turn is one contiguous run of generated tokens
    ending with its end-of-turn token), so the prompt is every token before that run and the
    response is the run.  The revision of round r sits two messages after the rejected proposal
    (proposal, critic message, revision).  Its reward is 1 when the critic was asked about it and
    accepted it, 0 when it was malformed or rejected again (a later round on it exists), and the
    sample is skipped when the verification budget ran out before the critic could judge it.
    All revision samples of one collection form one verl group (a shared baseline).

``supervised``
    Successful (reward >= ``algorithm.success_threshold``) trajectories that a critique changed
    train with masked next-token cross-entropy on their policy tokens; Parquet datasets
    (critic data, rejection-sampling data) load through :func:`supervised_from_parquet`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from cast_rl.config.schema import CastConfig
from cast_rl.learner.sample import Sample
from cast_rl.rollout.trajectory import Trajectory

logger = logging.getLogger(__name__)


def critic_score(traj: Trajectory) -> float:
    """Fraction of the policy's proposed actions the critic did not reject, in [0, 1].

    With ``info["critic_verdicts"]`` (one verdict string per critiqued action) it is the share
    of ``"valid"`` verdicts.  Otherwise it is read from the verification rounds, which record
    each rejected proposal: 1 - rejected / proposed, where proposed counts assistant messages.
    Without any critique the score is 1, which shifts every reward of a group equally and so
    leaves group-relative advantages unchanged.
    """
    verdicts = traj.info.get("critic_verdicts")
    if verdicts:
        return sum(v == "valid" for v in verdicts) / len(verdicts)
    proposed = sum(m.get("role") == "assistant" for m in traj.messages)
    if not proposed:
        return 1.0
    return max(0.0, 1.0 - len(traj.verification_rounds) / proposed)


def shaped_reward(traj: Trajectory, critic_weight: float) -> float:
    """Task outcome plus ``critic_weight`` times :func:`critic_score`."""
    if critic_weight == 0.0:
        return float(traj.reward)
    return float(traj.reward) + critic_weight * critic_score(traj)


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


def outcome_group_samples(trajs: Sequence[Trajectory], cfg: CastConfig, round_id: str) -> list[Sample]:
    """One policy sample per trajectory with group-relative advantages (see module doc)."""
    usable = [t for t in trajs if any(t.loss_mask)]
    if len(usable) < len(trajs):
        logger.warning("skipped %d trajectories without policy tokens", len(trajs) - len(usable))
    if not usable:
        return []
    algo = cfg.algorithm
    rewards = [shaped_reward(t, algo.critic_reward_weight) for t in usable]
    groups = [group_id(t, round_id) for t in usable]
    advs = verl_advantages(rewards, [t.loss_mask for t in usable], groups, algo.adv_estimator, algo.norm_adv_by_std)
    return [
        Sample(
            key=sample_key(t, round_id, "outcome"), source="outcome_groups", token_ids=list(t.token_ids),
            loss_mask=list(t.loss_mask), logprobs=list(t.logprobs), advantage=a, reward=r,
            policy_version=t.policy_version, group=g, critique_changed=bool(t.verification_rounds),
            info={"outcome": float(t.reward), "critic_score": critic_score(t)},
        )
        for t, r, a, g in zip(usable, rewards, advs, groups)
    ]


def policy_turn_spans(loss_mask: Sequence[int]) -> list[tuple[int, int]]:
    """[start, end) of each maximal run of 1s: one per policy turn (see module doc)."""
    spans, start = [], None
    for i, m in enumerate(loss_mask):
        if m and start is None:
            start = i
        elif not m and start is not None:
            spans.append((start, i))
            start = None
    if start is not None:
        spans.append((start, len(loss_mask)))
    return spans


def revision_samples(trajs: Sequence[Trajectory], cfg: CastConfig, round_id: str) -> list[Sample]:
    """A policy sample per judged revision; reward = the revision was valid (see module doc)."""
    budget = cfg.critic.verification_budget
    pending: list[tuple[Trajectory, int, tuple[int, int], float]] = []
    for t in trajs:
        rounds = t.verification_rounds
        if not rounds:
            continue
        assistant_idx = [i for i, m in enumerate(t.messages) if m.get("role") == "assistant"]
        spans = policy_turn_spans(t.loss_mask)
        if len(spans) != len(assistant_idx):
            logger.warning("trajectory %s: %d policy spans for %d assistant messages; no revision "
                           "samples from it", t.key, len(spans), len(assistant_idx))
            continue
        rejected = {r["message_index"] for r in rounds}
        chain: dict[int, int] = {}  # message index -> how many rounds led to it
        for r in sorted(rounds, key=lambda r: r["message_index"]):
            depth = chain.get(r["message_index"], 0) + 1
            revised_at = r["message_index"] + 2
            chain[revised_at] = depth
            if r.get("revision") is None or revised_at not in assistant_idx:
                continue
            if "malformed" in r["revision"] or revised_at in rejected:
                reward = 0.0
            elif depth < budget:
                reward = 1.0  # the critic judged the revision and let it run
            else:
                continue  # budget spent: nobody judged it
            pending.append((t, r["message_index"], spans[assistant_idx.index(revised_at)], reward))
    if not pending:
        return []
    group = f"{round_id}/revisions"
    rewards = [p[3] for p in pending]
    masks = [[1] * (p[2][1] - p[2][0]) for p in pending]
    advs = verl_advantages(rewards, masks, [group] * len(pending), cfg.algorithm.adv_estimator,
                           cfg.algorithm.norm_adv_by_std)
    out = []
    for (t, msg_idx, (s, e), reward), adv in zip(pending, advs):
        out.append(Sample(
            key=sample_key(t, round_id, "revision", str(msg_idx)), source="revision",
            token_ids=list(t.token_ids[:e]), loss_mask=[0] * s + [1] * (e - s),
            logprobs=[0.0] * s + list(t.logprobs[s:e]), advantage=adv, reward=reward,
            policy_version=t.policy_version, group=group, critique_changed=True,
            info={"message_index": msg_idx},
        ))
    return out


def supervised_from_trajectories(trajs: Sequence[Trajectory], cfg: CastConfig, round_id: str) -> list[Sample]:
    """Cross-entropy samples from successful trajectories that a critique corrected."""
    threshold = cfg.algorithm.success_threshold
    return [
        Sample(
            key=sample_key(t, round_id, "supervised"), source="supervised", token_ids=list(t.token_ids),
            loss_mask=list(t.loss_mask), logprobs=[0.0] * len(t.token_ids), reward=float(t.reward),
            policy_version=t.policy_version, group=f"{round_id}/supervised", critique_changed=True,
        )
        for t in trajs
        if t.verification_rounds and t.reward >= threshold and any(t.loss_mask)
    ]


SampleBuilder = Callable[[Sequence[Trajectory], CastConfig, str], list[Sample]]

SAMPLE_BUILDERS: dict[str, SampleBuilder] = {
    "outcome_groups": outcome_group_samples,
    "revision": revision_samples,
    "supervised": supervised_from_trajectories,
}


def build_samples(trajs: Sequence[Trajectory], cfg: CastConfig, round_id: str) -> list[Sample]:
    """Every sample kind named in ``algorithm.samples``, from one collection of trajectories.

    ``round_id`` names the collection (e.g. ``"step12"``): GRPO groups never span collections.
    """
    out: list[Sample] = []
    for kind in cfg.algorithm.samples:
        out.extend(SAMPLE_BUILDERS[kind](trajs, cfg, round_id))
    return out


def supervised_from_parquet(path: str | Path, tokenizer: Any, policy_version: int = 0) -> list[Sample]:
    """Cross-entropy samples from a Parquet file with ``prompt_messages`` and ``completion``.

    ``prompt_messages`` is a JSON string of OpenAI-style messages; the prompt is rendered with the
    model's chat template and a generation prompt, the completion is the assistant's text followed
    by the end-of-turn token, and only the completion's tokens carry loss.
    """
    import pyarrow.parquet as pq

    table = pq.read_table(path, columns=["prompt_messages", "completion"]).to_pylist()
    eos = tokenizer.eos_token
    out = []
    for i, row in enumerate(table):
        messages = json.loads(row["prompt_messages"])
        prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        p_ids = tokenizer(prompt, add_special_tokens=False).input_ids
        c_ids = tokenizer(row["completion"] + eos, add_special_tokens=False).input_ids
        ids = p_ids + c_ids
        out.append(Sample(
            key=f"parquet/{Path(path).name}/{i}", source="supervised", token_ids=ids,
            loss_mask=[0] * len(p_ids) + [1] * len(c_ids), logprobs=[0.0] * len(ids),
            policy_version=policy_version, group=f"parquet/{Path(path).name}",
        ))
    return out
