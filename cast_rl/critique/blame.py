"""Verified blame: does correcting a labelled action flip the episode's outcome?

The labeller marks actions invalid from rules and privileged information; nothing in the labels
says that an invalid action is *why* an episode failed.  Verified blame tests it by intervention.
For every failed trajectory and every action labelled invalid that ran, the exact state before
that action is rebuilt (:meth:`~cast_rl.rollout.runner.EpisodeRunner.replay`: reset, then the
recorded prefix fed back through the runner's own loop), the action is replaced by its
correction, and the episode is continued ``k`` times with the policy (distinct sampling seeds).
A label is *confirmed* when at least one continuation succeeds (the outcome flips 0 -> 1); its
``flips`` say how many did.

The correction is privileged, like the labeller (:func:`privileged_correction`): the task's next
gold action not yet done by the prefix, or, for a write the user has not just confirmed, the
confirmation question for that gold write (the step the policy requires before it).  An action
with no gold step left to take has no correction and is counted as ``uncorrectable``, never as
unconfirmed.

What it measures (:func:`blame_metrics`): label precision against this counterfactual truth,
overall, per error type and per rule (the label's ``source``), and the share of failed
trajectories whose decisive action (the labeller's ``decisive`` mark) is confirmed.  A policy that
cannot finish a task from a corrected state confirms nothing: the figures bound the labels'
precision from below by what the policy can do.
"""

from __future__ import annotations

import asyncio
import json
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from cast_rl.critique.context import Visible
from cast_rl.critique.gold import action_ref
from cast_rl.critique.rules import get_rules
from cast_rl.critique.rules.base import Ctx
from cast_rl.critique.rules.confirmation import check_confirmation
from cast_rl.envs.core import DomainData
from cast_rl.envs.types import RESPOND, Action, confirmation_text, is_success
from cast_rl.jsonl import iter_jsonl
from cast_rl.records import Trajectory


@dataclass
class BlameRecord:
    """One checked label: its correction and how many of ``k`` corrected continuations succeeded."""

    trajectory_index: int
    message_index: int
    error_type: str
    source: str
    decisive: bool
    action: dict[str, Any]
    correction: dict[str, Any] | None
    """The substituted action; None when the label has no correction (uncorrectable)."""
    k: int = 0
    flips: int = 0

    @property
    def confirmed(self) -> bool:
        return self.flips > 0

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "confirmed": self.confirmed}


def privileged_correction(data: DomainData, traj: Trajectory, message_index: int) -> Action | None:
    """The action that should have been taken at ``messages[message_index]``, from the gold plan.

    Gold tool calls the prefix already ran without an error count as done, in order; the next
    one is the correction, or, when it is a write the labeller's confirmation rule would flag
    there, the confirmation question for it.  None when the prefix did every gold
    call (the action was an extra one: nothing to put in its place).
    """
    task = data.task(traj.split, traj.task_index)
    gold = [a for a in task.actions if a.name != RESPOND]
    done = 0
    for turn in traj.turns:
        if turn.message_index >= message_index or done >= len(gold):
            break
        if not turn.executed or turn.action is None:
            continue
        reply = _reply(traj, turn.message_index)
        if turn.action == gold[done].to_json() and not (reply or "").startswith("Error"):
            done += 1
    if done >= len(gold):
        return None
    step = gold[done]
    if step.name in data.spec.write_tools and not _confirmed(data, traj.messages[:message_index], step):
        return Action(RESPOND, {"content": confirmation_text(step.name, step.kwargs)})
    return Action(step.name, dict(step.kwargs))


def _reply(traj: Trajectory, index: int) -> str | None:
    following = traj.messages[index + 1] if index + 1 < len(traj.messages) else None
    return following.get("content") if following and following["role"] == "tool" else None


def _confirmed(data: DomainData, messages: list[dict[str, Any]], step: Action) -> bool:
    """Whether ``step`` (a write) would pass the labeller's confirmation rule after ``messages``:
    the user's last message is an explicit yes to a proposal that named its details."""
    visible = Visible(data.policy, messages, data.tools)
    return not check_confirmation(Ctx(action_ref(step), visible, get_rules(data.spec.name), {}))


def branch_seed(seed: int, key: tuple[Any, ...], branch: int) -> int:
    return zlib.crc32(repr(("blame", seed, key, branch)).encode()) & 0x7FFFFFFF


async def verify_blame(
    data: DomainData,
    trajectories: list[Trajectory] | dict[int, Trajectory],
    labels: list[dict[str, Any]],
    runner_for: Callable[[Trajectory], Any],
    k: int,
    seed: int = 0,
) -> list[BlameRecord]:
    """Check every invalid label of an executed action in a failed trajectory (see the module doc).

    ``labels`` are label-file lines (``trajectory_index`` = position in ``trajectories``, or its
    key when a share of a file comes as ``{index: trajectory}``);
    ``runner_for(trajectory)`` gives the :class:`~cast_rl.rollout.runner.EpisodeRunner` that
    replays it and plays the branches (the run's config, so the user and seeds are the same).
    """
    by_traj: dict[int, list[dict[str, Any]]] = {}
    for label in labels:
        if label["verdict"] == "invalid":
            by_traj.setdefault(label["trajectory_index"], []).append(label)

    async def check(index: int, traj: Trajectory, label: dict[str, Any]) -> BlameRecord:
        record = BlameRecord(
            index, label["message_index"], label["error_type"], label.get("source", ""),
            bool(label.get("decisive")), label["action"], None,
        )
        correction = privileged_correction(data, traj, label["message_index"])
        if correction is None:
            return record
        record.correction, record.k = correction.to_json(), k
        runner = runner_for(traj)
        state = await runner.replay(traj, label["message_index"])
        key = (traj.split, traj.task_index, traj.trial, label["message_index"])
        branches = await asyncio.gather(*(
            runner.continue_from(state, action=correction, seed=branch_seed(seed, key, b)) for b in range(k)
        ))
        record.flips = sum(1 for b in branches if is_success(b.reward))
        return record

    jobs = []
    items = trajectories.items() if isinstance(trajectories, dict) else enumerate(trajectories)
    for index, traj in items:
        if is_success(traj.reward):
            continue
        executed = {t.message_index for t in traj.turns if t.executed}
        jobs += [check(index, traj, lab) for lab in by_traj.get(index, []) if lab["message_index"] in executed]
    records = await asyncio.gather(*jobs)
    return sorted(records, key=lambda r: (r.trajectory_index, r.message_index))


def blame_metrics(records: list[BlameRecord], failed: int) -> dict[str, float]:
    """``blame/`` metrics: precision overall, per error type and per rule; decisive share."""
    checked = [r for r in records if r.correction is not None]
    out: dict[str, float] = {
        "blame/labels": float(len(records)),
        "blame/checked": float(len(checked)),
        "blame/uncorrectable": float(len(records) - len(checked)),
        "blame/confirmed": float(sum(r.confirmed for r in checked)),
        "blame/precision": _share(checked),
        "blame/flip_rate": (sum(r.flips for r in checked) / sum(r.k for r in checked)) if checked else 0.0,
        "blame/failed_trajectories": float(failed),
    }
    for field_name, prefix in (("error_type", "blame/precision_type"), ("source", "blame/precision_rule")):
        groups: dict[str, list[BlameRecord]] = {}
        for r in checked:
            groups.setdefault(getattr(r, field_name) or "unknown", []).append(r)
        for name, group in sorted(groups.items()):
            out[f"{prefix}/{name}"] = _share(group)
            out[f"{prefix}/{name}_n"] = float(len(group))
    confirmed_decisive = {r.trajectory_index for r in checked if r.decisive and r.confirmed}
    out["blame/confirmed_decisive_share"] = len(confirmed_decisive) / failed if failed else 0.0
    return out


def _share(records: list[BlameRecord]) -> float:
    return sum(r.confirmed for r in records) / len(records) if records else 0.0


def write_blame(path: str | Path, records: list[BlameRecord]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        f.writelines(json.dumps(r.to_json()) + "\n" for r in records)


def confirmed_keys(path: str | Path) -> tuple[set[tuple[int, int]], set[tuple[int, int]]]:
    """(checked, confirmed) ``(trajectory_index, message_index)`` keys of a blame file."""
    checked, confirmed = set(), set()
    for _, obj in iter_jsonl(path, what="a blame record"):
        if obj["correction"] is not None:
            key = (obj["trajectory_index"], obj["message_index"])
            checked.add(key)
            if obj["confirmed"]:
                confirmed.add(key)
    return checked, confirmed


def count_failed(trajectories: list[Trajectory]) -> int:
    return sum(1 for t in trajectories if not is_success(t.reward))

