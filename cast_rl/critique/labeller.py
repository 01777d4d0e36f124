"""The action labeller: a verdict, an error type and a rationale for every assistant action.

For each action of a trajectory (each tool call, each reply to the user) the labeller

1. runs the visible rules (:mod:`cast_rl.critique.rules`): hallucination and policy violations
   and the tool-schema part of wrong tool usage;
2. adds privileged checks for wrong tool usage: it replays the trajectory's executed tool calls
   in a fresh :class:`~cast_rl.envs.core.ToolEnv` and, on a fork at the action, asks whether the
   environment rejects the call (a tool failing on its own record, :func:`tool_fault`, is no
   rejection), and whether a write's state change is the effect of one of the
   task's gold writes (one that leads towards the gold final state) or leads away from it; a
   call equal to a gold action is what the task needs by definition;
   A visible finding about a condition the tool checks itself (:attr:`Finding.tool_checks`: an
   appointment's status or a provider's slot not looked at first) is dropped when the
   environment accepts the call: passing the tool's own check shows the condition held;
3. reports the first error type in the order hallucination, policy_violation, wrong_tool_usage,
   with a rationale that rests on visible information only; a rationale failing the leakage
   check (:func:`cast_rl.critique.rationale.leakage_problems`) is dropped and counted.

Tool calls without a tool message answering them (a proposal the critic rejected) are judged on
a fork and do not change the replayed state.

The labeller also reads the trajectory's outcome (``reward``; a success is a reward of 1, as
:func:`cast_rl.eval.passk.is_success` counts it).  Labels of successful trajectories are
judged as above and nothing else.  In a failed trajectory:

* the *decisive* action is the first invalid action that ran and changed the database (a write
  the environment executed); when no invalid action changed it, the first invalid action that
  ran (a read, a reply, a transfer, a write the environment rejected).  Proposals the critic
  rejected never ran and are never decisive.  Its label has ``decisive`` set;
* a failure with no invalid action that ran is an *unexplained failure*: the labels do not say
  why it failed (a missing action, a wrong final answer, or an error the rules do not catch).
  It is counted and recorded (:attr:`LabelStats.unexplained`) so a report can list it.
"""

from __future__ import annotations

import json
import logging
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cast_rl.critique.context import (
    MALFORMED,
    ActionRef,
    Visible,
    is_error,
    iter_actions,
    leaves,
    rejected_by_critic,
    tool_history,
)
from cast_rl.critique.rationale import Evidence, Rationale, leakage_problems
from cast_rl.critique.rules import choose, get_rules, to_rationale, visible_findings
from cast_rl.critique.rules.base import Finding
from cast_rl.envs.core import DomainData, ToolEnv, call_tool
from cast_rl.envs.db import Database, to_hashable
from cast_rl.envs.types import Action, is_success
from cast_rl.records import Trajectory, TrajectoryFormatError, iter_numbered

logger = logging.getLogger(__name__)
_MISSING = object()


@dataclass
class ActionLabel:
    """One labelled action; ``to_json`` is a line of the labels file."""

    trajectory_index: int
    message_index: int
    call_index: int
    action: dict[str, Any]
    verdict: str
    error_type: str
    rationale: dict[str, Any] | None
    """None when the rationale failed the leakage check (the verdict stands)."""
    source: str = ""
    """The rule that decided (``grounding``, ``confirmation``, ``gold_effect``, ...)."""
    ran: bool = True
    """Whether the action ran (False for a tool call no tool message answers)."""
    changed_state: bool = False
    """Whether running it changed the database."""
    decisive: bool = False
    """The failed trajectory's decisive invalid action (see the module docstring)."""

    def to_json(self) -> dict[str, Any]:
        out = {
            "trajectory_index": self.trajectory_index,
            "message_index": self.message_index,
            "action": self.action,
            "verdict": self.verdict,
            "error_type": self.error_type,
            "rationale": self.rationale,
            "source": self.source,
        }
        if self.decisive:
            out["decisive"] = True
        return out


@dataclass
class LabelStats:
    """Counts over everything labelled so far."""

    verdicts: Counter[str] = field(default_factory=Counter)
    error_types: Counter[str] = field(default_factory=Counter)
    sources: Counter[str] = field(default_factory=Counter)
    leakage_drops: int = 0
    trajectories: int = 0
    failed: int = 0
    """Trajectories whose reward is not a success."""
    decisive_types: Counter[str] = field(default_factory=Counter)
    """Error types of the decisive actions of failed trajectories."""
    unexplained: list[dict[str, Any]] = field(default_factory=list)
    """One record per unexplained failure: ``trajectory_index``, ``domain``, ``split``,
    ``task_index``, ``trial``, ``reward``."""

    def add(self, label: ActionLabel, leaked: bool) -> None:
        self.verdicts[label.verdict] += 1
        self.error_types[label.error_type] += 1
        self.sources[label.source] += 1
        self.leakage_drops += int(leaked)

    def add_outcome(self, trajectory: Trajectory, index: int, decisive: ActionLabel | None) -> None:
        """Count a failed trajectory: its decisive action's type, or it is unexplained."""
        self.failed += 1
        if decisive is not None:
            self.decisive_types[decisive.error_type] += 1
            return
        self.unexplained.append({
            "trajectory_index": index, "domain": trajectory.domain, "split": trajectory.split,
            "task_index": trajectory.task_index, "trial": trajectory.trial,
            "reward": trajectory.reward,
        })

    def metrics(self) -> dict[str, float]:
        """Flat ``label/...`` metrics for the metrics logger."""
        total = sum(self.verdicts.values())
        out: dict[str, float] = {
            "label/trajectories": self.trajectories,
            "label/actions": total,
            "label/leakage_drops": self.leakage_drops,
            "label/invalid_rate": self.verdicts["invalid"] / total if total else 0.0,
            "label/failed_trajectories": self.failed,
            "label/unexplained_failures": len(self.unexplained),
            "label/unexplained_failure_rate": len(self.unexplained) / self.failed if self.failed else 0.0,
        }
        out.update({f"label/verdict_{k}": v for k, v in self.verdicts.items()})
        out.update({f"label/type_{k}": v for k, v in self.error_types.items()})
        out.update({f"label/decisive_{k}": v for k, v in self.decisive_types.items()})
        return out


class Labeller:
    """Labels trajectories of one domain data directory (see the module docstring)."""

    def __init__(self, data: DomainData) -> None:
        self.data = data
        self.rules = get_rules(data.domain)
        self.stats = LabelStats()

    def label(self, trajectory: Trajectory, trajectory_index: int = 0) -> list[ActionLabel]:
        messages = trajectory.messages
        env = ToolEnv(self.data, trajectory.split, trajectory.task_index, max_steps=None)
        gold = [a for a in env.task.actions]
        gold_keys = {_key(a.name, a.kwargs) for a in gold}
        labels = []
        for action, ran in actions_ran(trajectory):
            visible = Visible(self.data.policy, messages[: action.message_index], self.data.tools)
            findings = visible_findings(action, visible, self.rules, messages[action.message_index])
            changed = False
            if not action.is_reply and action.name != MALFORMED:
                db = env.db if ran else env.db.fork()
                before = db.fork()
                privileged, accepted = self._privileged(action, visible, db, gold, gold_keys, trajectory)
                if accepted:  # the tool checked the condition itself and the call passed it
                    findings = [f for f in findings if not f.tool_checks]
                findings += privileged
                changed = bool(changes(before, db))
                if _key(action.name, action.kwargs) in gold_keys:
                    # a gold action is what the task needs, even where the env rejects it
                    findings = [f for f in findings if f.error_type != "wrong_tool_usage"]
            elif action.name == MALFORMED:
                ran = True  # the policy's turn happened; its error observation was the outcome
            label = self._finish(trajectory_index, action, visible, choose(findings))
            label.ran, label.changed_state = ran, changed
            labels.append(label)
        self.stats.trajectories += 1
        if not is_success(trajectory.reward):
            decisive = decisive_label(labels)
            if decisive is not None:
                decisive.decisive = True
            self.stats.add_outcome(trajectory, trajectory_index, decisive)
        return labels

    def _finish(
        self, index: int, action: ActionRef, visible: Visible, finding: Finding | None
    ) -> ActionLabel:
        rationale: Rationale = to_rationale(finding, visible, action)
        problems = leakage_problems(rationale, visible, action)
        if problems:
            logger.debug("dropped a rationale at message %d: %s", action.message_index, problems)
        label = ActionLabel(
            trajectory_index=index,
            message_index=action.message_index,
            call_index=action.call_index,
            action=action.to_json(),
            verdict=rationale.verdict,
            error_type=rationale.error_type,
            rationale=None if problems else rationale.to_json(),
            source=finding.source if finding else "",
        )
        self.stats.add(label, bool(problems))
        return label

    def _privileged(
        self,
        action: ActionRef,
        visible: Visible,
        db: Database,
        gold: list[Action],
        gold_keys: set[str],
        trajectory: Trajectory,
    ) -> tuple[list[Finding], bool]:
        """Wrong tool usage decided with the environment and the gold actions, and whether the
        environment accepted the call; mutates ``db``."""
        before = db.fork()
        observation = call_tool(self.data, db, Action(action.name, action.kwargs))
        accepted = not is_error(observation)
        return self._wrong_usage(action, visible, db, before, observation, gold, gold_keys,
                                 trajectory), accepted

    def _wrong_usage(
        self,
        action: ActionRef,
        visible: Visible,
        db: Database,
        before: Database,
        observation: str,
        gold: list[Action],
        gold_keys: set[str],
        trajectory: Trajectory,
    ) -> list[Finding]:
        if _key(action.name, action.kwargs) in gold_keys:
            return []
        if action.name in self.rules.terminate_tools:
            gold_db = self.data.gold_db(trajectory.split, trajectory.task_index)
            if not any(a.name in self.rules.terminate_tools for a in gold) and not db.same_state(
                gold_db
            ):
                return [_wrong(
                    "Transferring ends the conversation, but the user's request can still be "
                    "handled with the available tools.", visible,
                    "Continue helping the user with the tools instead of transferring.", "transfer",
                )]
            return []
        if is_error(observation) and not tool_fault(observation, action.kwargs):
            return [_wrong(
                f"{action.name} cannot work with these arguments: they do not fit the records "
                "shown so far (an id of the wrong kind, something that is not part of the record, "
                "or a value the tool does not accept).", visible,
                "Check the records shown so far and call the tool with arguments that fit them.",
                "rejected",
            )]
        effect = changes(before, db)
        if not effect:
            return []
        writes = [a for a in gold if a.name == action.name]
        for write in writes:
            trial = before.fork()
            call_tool(self.data, trial, write)
            if same_effect(effect, changes(before, trial)):
                return []
        return [_wrong(
            f"{action.name} makes a change the user's request does not call for: the record or "
            "the values it changes are not the ones the request is about.", visible,
            _fix_hint(visible, writes, action),
            "gold_effect",
        )]


_TOOL_FAULT = re.compile(r"^Error: '([^']*)'\s*$")
"""A tool's own KeyError: ``Error: 'license_number'``."""


def tool_fault(observation: str, kwargs: dict[str, Any]) -> bool:
    """Whether a tool failed on a field its own record lacks (a KeyError naming something that is
    not one of the call's argument values): the call itself was right."""
    match = _TOOL_FAULT.match(observation)
    return match is not None and match.group(1) not in {str(v) for _, v in leaves(kwargs)}


def decisive_label(labels: list[ActionLabel]) -> ActionLabel | None:
    """The first invalid label that ran and changed the database, else the first invalid one
    that ran, else None (the failure is unexplained); see the module docstring."""
    invalid = [label for label in labels if label.verdict == "invalid" and label.ran]
    return next((label for label in invalid if label.changed_state), invalid[0] if invalid else None)


def actions_ran(trajectory: Trajectory) -> list[tuple[ActionRef, bool]]:
    """Every action of a trajectory (:func:`iter_actions`) and whether it ran."""
    messages = trajectory.messages
    executed = {
        (r.message_index, r.name, json.dumps(r.kwargs, sort_keys=True, default=str))
        for r in tool_history(messages, len(messages))
        if r.output is not None
    }
    # the runner's turn records say which turns ran and which failed to parse; conversations
    # without them (gold plans, demonstrations, older files) are read from their shape
    turns = {t.message_index: t for t in trajectory.turns}
    out = []
    for action in iter_actions(messages, malformed_turns(trajectory)):
        turn = turns.get(action.message_index)
        if turn is not None:  # only a turn's first call runs (the source runs one per turn)
            ran = turn.executed and action.call_index <= 0
        elif action.is_reply:
            ran = not rejected_by_critic(messages, action.message_index)
        else:
            ran = (action.message_index, action.name,
                   json.dumps(action.kwargs, sort_keys=True, default=str)) in executed
        out.append((action, ran))
    return out


def malformed_turns(trajectory: Trajectory) -> set[int] | None:
    """Message indices of the turns the runner could not parse; None for a trajectory without
    turn records (then :func:`iter_actions` reads malformed turns from the messages' shape)."""
    if not trajectory.turns:
        return None
    return {t.message_index for t in trajectory.turns if t.error is not None}


def _key(name: str, kwargs: Any) -> str:
    return json.dumps([name, kwargs], sort_keys=True, default=str)


def changes(before: Database, after: Database) -> dict[tuple[str, str], Any]:
    """Records that differ between a database and a fork of it (``_MISSING`` when removed)."""
    out: dict[tuple[str, str], Any] = {}
    for name in after:
        new, old = after[name], before[name]
        if hasattr(new, "touched_keys"):
            for key in new.touched_keys() | old.touched_keys():
                a, b = new.get(key, _MISSING), old.get(key, _MISSING)
                if a is not b and (a is _MISSING or b is _MISSING or str(to_hashable(a)) != str(to_hashable(b))):
                    out[(name, key)] = a
        elif new is not old and str(to_hashable(new)) != str(to_hashable(old)):
            out[(name, "")] = new
    return out


def same_effect(a: dict[tuple[str, str], Any], b: dict[tuple[str, str], Any]) -> bool:
    if a.keys() != b.keys():
        return False
    return all(
        (a[k] is _MISSING and b[k] is _MISSING)
        or (a[k] is not _MISSING and b[k] is not _MISSING and str(to_hashable(a[k])) == str(to_hashable(b[k])))
        for k in a
    )


def _wrong(explanation: str, visible: Visible, fix: str, source: str) -> Finding:
    request = visible.user_texts[0] if visible.user_texts else None
    evidence = []
    if request and request[1].strip():
        evidence.append(Evidence(request[0], request[1].strip()[:160]))
    return Finding("wrong_tool_usage", explanation, evidence=evidence, suggested_fix=fix, source=source)


def _fix_hint(visible: Visible, writes: list[Action], action: ActionRef) -> str:
    """Point at the record the request is about, when that record is visible."""
    for write in writes:
        for key, value in write.kwargs.items():
            if (key.endswith("_id") and isinstance(value, str)
                    and value != action.kwargs.get(key) and visible.contains_text(value)):
                return f"Check the request again: it is about {key} {value}."
    return "Re-read the user's request and the records shown, and change only what was asked."


def label_file(
    data: DomainData, trajectories: str | Path, out: str | Path
) -> tuple[list[ActionLabel], list[Trajectory], Labeller]:
    """Label every trajectory of a file (``trajectory_index`` = its position) and write JSONL."""
    labeller = Labeller(data)
    labels: list[ActionLabel] = []
    read = read_for_labelling(data, trajectories)
    for index, trajectory in enumerate(read):
        labels += labeller.label(trajectory, index)
    write_labels(out, labels)
    return labels, read, labeller


def read_for_labelling(data: DomainData, trajectories: str | Path) -> list[Trajectory]:
    """A trajectories file's trajectories, each checked to be a task of ``data``."""
    read: list[Trajectory] = []
    for lineno, trajectory in iter_numbered(trajectories):
        where = f"{trajectories}:{lineno}"
        if trajectory.domain != data.domain:
            raise TrajectoryFormatError(
                f"{where}: trajectory of domain {trajectory.domain!r}, but env.domain is {data.domain!r}"
            )
        try:
            data.task(trajectory.split, trajectory.task_index)
        except (ValueError, IndexError) as exc:
            raise TrajectoryFormatError(f"{where}: {exc}") from None
        read.append(trajectory)
    return read


def write_labels(path: str | Path, labels: list[ActionLabel]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for label in labels:
            f.write(json.dumps(label.to_json(), ensure_ascii=False) + "\n")


def teacher_items(
    data: DomainData, labels: list[ActionLabel], trajectories: list[Trajectory]
) -> list[tuple[int, tuple[Rationale, Visible, ActionRef, str]]]:
    """(label position, what the teacher needs) for every label that has a rationale."""
    items = []
    actions: dict[int, list[ActionRef]] = {}
    for pos, label in enumerate(labels):
        if label.rationale is None:
            continue
        trajectory = trajectories[label.trajectory_index]
        if label.trajectory_index not in actions:
            actions[label.trajectory_index] = list(iter_actions(trajectory.messages, malformed_turns(trajectory)))
        action = next(
            a for a in actions[label.trajectory_index]
            if a.message_index == label.message_index and a.call_index == label.call_index
        )
        visible = Visible(data.policy, trajectory.messages[: label.message_index], data.tools)
        items.append((pos, (Rationale.from_json(label.rationale), visible, action, data.domain)))
    return items
