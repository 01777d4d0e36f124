"""A small pipeline run directory made from real parts: generated retail data, episodes whose tool
outputs come from the real environment, a critique round in the critic's own text format, labels
from the real labeller, and the evaluation reports of the real report writer.

Layout (as ``cast-rl pipeline`` writes it)::

    run/config.json                          env.data_dir empty: the generated default under run/data
    run/data/retail-seed0-n12.../            the generated retail data
    run/01_eval_before/trajectories/{no_critic,critic_b1}.jsonl, report.json
    run/02_collect/trajectories.jsonl
    run/03_label/labels.jsonl
    run/08_eval_after/trajectories/{no_critic,critic_b1}.jsonl, report.json
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cast_rl.config import load_config, to_dict
from cast_rl.critique.rationale import Evidence, Rationale, format_critique
from cast_rl.envs.core import DomainData, ToolEnv
from cast_rl.envs.setup import load_env_data
from cast_rl.envs.types import STOP_TOKEN, Action
from cast_rl.records import CRITIC_NAME, Trajectory

SPLIT = "test"
POLICY_CLAUSE = "Before any action that changes the database"


class _Conversation:
    """Messages of one episode, with tool outputs from a real :class:`ToolEnv`."""

    def __init__(self, data: DomainData, task_index: int) -> None:
        self.env = ToolEnv(data, SPLIT, task_index, max_steps=None)
        self.messages: list[dict[str, Any]] = [
            {"role": "system", "content": data.policy},
            {"role": "user", "content": self.env.task.instruction.split(" When the agent")[0]},
        ]
        self.calls = 0

    def call(self, action: Action, run: bool = True) -> int:
        """An assistant tool call (and its tool output when ``run``); returns its message index."""
        call_id = f"call_{len(self.messages)}_0"
        self.messages.append({"role": "assistant", "content": "", "tool_calls": [{
            "id": call_id, "type": "function",
            "function": {"name": action.name, "arguments": json.dumps(action.kwargs)}}]})
        index = len(self.messages) - 1
        if run:
            observation = self.env.step(action).observation
            self.messages.append({"role": "tool", "tool_call_id": call_id, "name": action.name, "content": observation})
        return index

    def say(self, text: str, reply: str) -> None:
        self.messages.append({"role": "assistant", "content": text})
        self.messages.append({"role": "user", "content": reply})

    def record(self, trial: int, rounds: list[dict[str, Any]] | None = None, **extra: Any) -> dict[str, Any]:
        reward, _ = self.env.reward()
        return {
            "domain": "retail", "split": SPLIT, "task_index": self.env.task_index, "trial": trial,
            "reward": reward, "policy_version": 0, "messages": self.messages,
            "verification_rounds": rounds or [],
            "info": {"termination": "user_stop", "policy_tokens": 120, "prompt_tokens": 2400, "wall_s": 1.2},
            **extra,
        }


def solved(data: DomainData, task_index: int, trial: int) -> dict[str, Any]:
    """Every gold action, a confirmation before the last one, reward 1."""
    conv = _Conversation(data, task_index)
    *reads, write = conv.env.task.actions
    for action in reads:
        conv.call(action)
    conv.say(f"I will now run {write.name} with {json.dumps(write.kwargs)}. Shall I proceed?", "yes")
    conv.call(write)
    conv.say("Done. Anything else?", STOP_TOKEN)
    return conv.record(trial)


def wrong_write(data: DomainData, task_index: int, trial: int) -> dict[str, Any]:
    """The final write on a made-up order id: the database misses the gold change, reward 0."""
    conv = _Conversation(data, task_index)
    *reads, write = conv.env.task.actions
    for action in reads:
        conv.call(action)
    conv.say(f"I will now run {write.name}. Shall I proceed?", "yes")
    conv.call(Action(write.name, {**write.kwargs, "order_id": "#W0000000"}))
    conv.say("Done.", STOP_TOKEN)
    return conv.record(trial)


def critiqued(data: DomainData, task_index: int, trial: int, turns: bool = False) -> dict[str, Any]:
    """The write proposed without asking first; the critic rejects it quoting the policy and the
    user; the revision asks; the user stops: the database misses the gold change, reward 0."""
    conv = _Conversation(data, task_index)
    *reads, write = conv.env.task.actions
    for action in reads:
        conv.call(action)
    proposal = conv.call(write, run=False)
    order_id = write.kwargs["order_id"]
    rationale = Rationale(
        verdict="invalid", error_type="policy_violation",
        evidence=[Evidence(None, POLICY_CLAUSE), Evidence(1, order_id)],
        policy_clause=POLICY_CLAUSE,
        explanation=f"The customer never confirmed the change to order {order_id}.",
        suggested_fix="State the exact details of the change and ask the customer to confirm.",
    )
    text = format_critique(rationale)
    conv.messages.append({"role": "user", "name": CRITIC_NAME, "content": text})
    revision = {"name": "respond", "kwargs": {"content": f"Shall I run {write.name} on order {order_id}?"}}
    conv.say(revision["kwargs"]["content"], f"No, leave it. {STOP_TOKEN}")
    critique = {"verdict": "invalid", "error_type": "policy_violation", "rationale": rationale.to_json(),
                "text": text, "critic": "rule", "unparsable": False}
    rounds = [{"message_index": proposal, "proposal": {"name": write.name, "kwargs": write.kwargs},
               "critique": critique, "revision": revision}]
    extra: dict[str, Any] = {}
    if turns:  # the per-turn record newer files carry; older readers must not need it
        extra["turns"] = [
            {"message_index": i, "start": 0, "end": 0, "action": None, "verdict": "invalid" if i == proposal else None,
             "error_type": "policy_violation" if i == proposal else None, "executed": i != proposal}
            for i, m in enumerate(conv.messages) if m["role"] == "assistant"
        ]
    return conv.record(trial, rounds, **extra)


def _write(path: Path, records: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def make_pipeline_run(root: Path) -> tuple[Path, int]:
    """The run directory of the module docstring and the task index whose episodes the critic
    checked (trial 0 of 01_eval_before's critic_b1, and the third collected episode)."""
    from cast_rl.critique.labeller import label_file
    from cast_rl.eval.report import EvalRun, build_report, write_report

    run = root / "run"
    cfg = load_config(None, [f"run_dir={run}", f"env.split={SPLIT}"])
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps(to_dict(cfg), indent=2))
    data = load_env_data(cfg)  # generates run/data/... as the pipeline does
    # three tasks whose last gold action changes an order; the critic catches the third
    tasks = [i for i, task in enumerate(data.tasks(SPLIT)) if "order_id" in task.actions[-1].kwargs][:3]
    critiqued_task = tasks[-1]
    for stage in ("01_eval_before", "08_eval_after"):
        after = stage.startswith("08")
        no_critic = [solved(data, t, i) if (t + i) % 2 or after else wrong_write(data, t, i) for t in tasks for i in range(2)]
        with_critic = [critiqued(data, t, i, turns=True) if t == critiqued_task and i == 0 and not after
                       else solved(data, t, i) for t in tasks for i in range(2)]
        runs = []
        for budget, records in ((0, no_critic), (1, with_critic)):
            name = "no_critic" if budget == 0 else f"critic_b{budget}"
            _write(run / stage / "trajectories" / f"{name}.jsonl", records)
            # the report reads Trajectory objects, which may predate "turns" in this tree
            trajectories = [Trajectory.from_json({k: v for k, v in r.items() if k != "turns"}) for r in records]
            runs.append(EvalRun(budget, trajectories, critiques=len(records)))
        write_report(build_report(runs), run / stage)
    collected = [solved(data, tasks[0], 0), wrong_write(data, tasks[1], 0), critiqued(data, critiqued_task, 0)]
    _write(run / "02_collect" / "trajectories.jsonl", collected)
    label_file(data, run / "02_collect" / "trajectories.jsonl", run / "03_label" / "labels.jsonl")
    return run, critiqued_task

