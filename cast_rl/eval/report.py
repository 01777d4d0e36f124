"""The evaluation report: pass^k, critic metrics and cost per configuration, as JSON, Markdown
and plots.

A *configuration* is one way of running the policy, e.g. without the critic or with the critic
in the loop at verification budget B; :class:`EvalRun` holds its trajectories.
:func:`build_report` turns runs into the JSON report, :func:`write_report` writes it with a
Markdown summary and PNG plots::

    out_dir/report.json
    out_dir/summary.md
    out_dir/plots/passk_vs_k_<domain>_<split>.png       one line per configuration
    out_dir/plots/passk_vs_budget_<domain>_<split>.png  one line per k

JSON report schema (``schema_version`` 1)::

    {
      "schema_version": 1,
      "success": "reward is within 1e-6 of 1 (bounds included)",
      "configurations": [                        # in the order the runs were given
        {
          "name": "critic_b1",                   # no_critic, critic_b1, critic_b2, ...
          "label": "critic B=1",                 # what tables and legends show
          "verification_budget": 1,              # 0: no critic
          "critic_used": "rule",                 # rule | <backend>:<model dir> ("" without critic)
          "episodes": 96,                        # trajectories (tasks x trials)
          "groups": {                            # one per domain/split
            "retail/test": {
              "domain": "retail", "split": "test",
              "tasks": 24, "n": 4,               # n: trials per task
              "reward_mean": 0.41,
              "success_rate": 0.40,              # successful trials / trials
              "pass^k": {"pass^1": 0.40, "pass^2": 0.31, "pass^3": 0.27, "pass^4": 0.25},
              "pass^k_ci": {"pass^1": [0.27, 0.53], ...},   # 95% interval, bootstrap over tasks
              "pass^k_mdd": {"pass^1": 0.21, ...},        # minimum detectable difference | null
              "task_successes": {"0": 3, "1": 0, ...}    # successes of each task out of n
            },
            "retail/unseen": {...,               # every unseen database (eval.unseen_seeds)
              "databases": ["unseen-1000", ...], # pooled; tasks keyed "unseen-1000/3"; with two
            }                                    # or more, each also has its own group
          },
          "overall": {"tasks", "n", "success_rate", "pass^k", "pass^k_ci"},   # two or more groups:
                                                 # every task pooled (absent when their n differ)
          "critic": {                            # see cast_rl.eval.critic
            "critiques": 310 | null, "flags": 42, "flags_per_episode": 0.44,
            "flag_rate": 0.14 | null, "correction_rate": 0.6 | null,
            "resistance": 0.2 | null, "false_positive_rate": 0.1 | null,
            "unparsable": 0 | null, "unparsable_rate": 0.0 | null
          },
          "cost": {                              # means over episodes (one trial of one task)
            "policy_tokens": 812.5,              # tokens the policy generated
            "prompt_tokens": 10234.0,            # prompt tokens summed over its generation calls
            "tokens": 11046.5,                   # policy + prompt
            "wall_s": 3.2                        # seconds from reset to the episode's end
          }
        }
      ],
      "uncertainty": {"method": ..., "confidence": 0.95, "resamples": 10000, "seed": 0, "mdd": ...},
      "comparisons": [                           # paired over the tasks both ran
        {"kind": "with - without critic", "a": "critic_b1", "b": "no_critic",
         "label": "critic B=1 - no critic", "group": "retail/test", "tasks": 24,
         "pass^k": {"pass^1": {"difference": 0.05, "ci": [-0.04, 0.14], "includes_zero": true,
                               "mdd": 0.12 | null}}}
      ]
    }

``pass^k`` holds k = 1..n unless the caller names k values (see :mod:`cast_rl.eval.passk` for
the success rule and the formula); intervals, paired differences and the minimum detectable
difference are explained in :mod:`cast_rl.eval.uncertainty`.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cast_rl.envs.setup import is_unseen
from cast_rl.eval.critic import Judge, critic_metrics
from cast_rl.eval.passk import TrialResult, as_keys, group_rewards, is_success, passk
from cast_rl.eval.plots import group_keys, write_plots
from cast_rl.eval.uncertainty import (
    critic_comparisons,
    interval_metadata,
    passk_interval,
    passk_mdd,
)
from cast_rl.records import Trajectory

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 1


@dataclass
class EvalRun:
    """The trajectories of one evaluated configuration."""

    verification_budget: int
    """Critique-revise rounds per action (0: no critic)."""
    trajectories: list[Trajectory]
    critiques: int | None = None
    """Verifier calls made while collecting (from the rollout workers), if known."""
    critic: str = ""
    """Which critic ran in the loop (``rule``, ``trained:<dir>``, ...; empty: not recorded)."""
    unparsable: int | None = None
    """Critic answers that could not be read (from the rollout workers), if known."""

    @property
    def name(self) -> str:
        b = self.verification_budget
        return "no_critic" if b == 0 else f"critic_b{b}"

    @property
    def label(self) -> str:
        b = self.verification_budget
        if b == 0:
            return "no critic"
        return f"critic B={b} ({self.critic.split(':')[0]})" if self.critic else f"critic B={b}"


def build_report(
    runs: list[EvalRun], k_values: list[int] | None = None, judge: Judge | None = None,
    in_domain: list[str] | None = None,
) -> dict[str, Any]:
    """The JSON report of the module docstring; ``judge`` enables the false-positive rate;
    ``in_domain`` (the domains the policy trained on) marks each group in- or out-of-domain."""
    names = [run.name for run in runs]
    if len(set(names)) != len(names):
        raise ValueError(f"each configuration must be evaluated once, got {names}")
    configurations = [_configuration(run, k_values, judge, in_domain) for run in runs]
    return {
        "schema_version": SCHEMA_VERSION,
        "success": "reward is within 1e-6 of 1 (bounds included)",
        "configurations": configurations,
        "uncertainty": interval_metadata(),
        "comparisons": critic_comparisons(configurations),
    }


def _configuration(
    run: EvalRun, k_values: list[int] | None, judge: Judge | None, in_domain: list[str] | None = None
) -> dict[str, Any]:
    if not run.trajectories:
        raise ValueError(f"configuration {run.name} has no trajectories")
    results = [TrialResult(t.task_index, t.trial, t.reward, t.domain, t.split) for t in run.trajectories]
    groups: dict[str, Any] = {}
    unseen: dict[str, dict[Any, list[float]]] = {}
    by_split = group_rewards(results)
    unseen_splits = Counter(domain for domain, split in by_split if is_unseen(split))
    for (domain, split), tasks in sorted(by_split.items()):
        if is_unseen(split):  # pooled below: one group of every unseen database of the domain
            unseen.setdefault(domain, {}).update({f"{split}/{task}": rewards for task, rewards in tasks.items()})
            if unseen_splits[domain] == 1:
                continue
        groups[f"{domain}/{split}"] = _group(domain, split, tasks, k_values)
    for domain, tasks in unseen.items():
        groups[f"{domain}/unseen"] = _group(domain, "unseen", tasks, k_values)
        groups[f"{domain}/unseen"]["databases"] = sorted({key.rsplit("/", 1)[0] for key in tasks})
    if in_domain is not None:
        for group in groups.values():
            group["in_domain"] = group["domain"] in in_domain
    overall = _overall(results, k_values) if len(groups) > 1 else None
    return {
        **({"overall": overall} if overall else {}),
        "name": run.name,
        "label": run.label,
        "verification_budget": run.verification_budget,
        "critic_used": run.critic if run.verification_budget else "",
        "episodes": len(run.trajectories),
        "groups": groups,
        "critic": critic_metrics(run.trajectories, run.verification_budget, run.critiques, judge, run.unparsable),
        "cost": _cost(run.trajectories),
    }


def _group(domain: str, split: str, tasks: dict[Any, list[float]], k_values: list[int] | None) -> dict[str, Any]:
    rewards = [r for task in tasks.values() for r in task]
    table = passk(tasks, k_values)
    n = len(next(iter(tasks.values())))
    successes = {str(task): sum(map(is_success, tasks[task])) for task in sorted(tasks, key=_task_order)}
    return {
        "domain": domain,
        "split": split,
        "tasks": len(tasks),
        "n": n,
        "reward_mean": sum(rewards) / len(rewards),
        "success_rate": sum(map(is_success, rewards)) / len(rewards),
        "pass^k": as_keys(table),
        "pass^k_ci": passk_interval(list(successes.values()), n, list(table)),
        "pass^k_mdd": passk_mdd(list(successes.values()), n, list(table)),
        "task_successes": successes,
    }


def _overall(results: list[TrialResult], k_values: list[int] | None) -> dict[str, Any] | None:
    """pass^k over every task of every domain/split together (None when their n differ)."""
    tasks: dict[tuple[str, str, Any], list[float]] = {}
    for (domain, split), by_task in group_rewards(results).items():
        for task, rewards in by_task.items():
            tasks[(domain, split, task)] = list(rewards)
    if len({len(r) for r in tasks.values()}) != 1:
        return None
    rewards = [r for task in tasks.values() for r in task]
    n, table = len(next(iter(tasks.values()))), passk(tasks, k_values)
    successes = [sum(map(is_success, r)) for r in tasks.values()]
    return {
        "tasks": len(tasks), "n": n,
        "success_rate": sum(map(is_success, rewards)) / len(rewards),
        "pass^k": as_keys(table),
        "pass^k_ci": passk_interval(successes, n, list(table)),  # every task of every group resampled together
    }


def _task_order(task: Any) -> tuple[int, Any]:
    return (0, task) if isinstance(task, int) else (1, str(task))


def _cost(trajectories: list[Trajectory]) -> dict[str, float]:
    def mean(value: Any) -> float:
        return sum(float(value(t)) for t in trajectories) / len(trajectories)

    policy, prompt = mean(lambda t: t.policy_tokens), mean(lambda t: t.prompt_tokens)
    return {"policy_tokens": policy, "prompt_tokens": prompt, "tokens": policy + prompt,
            "wall_s": mean(lambda t: t.info.get("wall_s", 0.0))}


def render_markdown(report: dict[str, Any], plots: list[Path] | None = None, base: Path | None = None) -> str:
    """A summary a person reads: a pass^k table per domain/split, then critic and cost."""
    configs = report["configurations"]
    lines = ["# Evaluation", ""]
    if "success" in report:  # a pipeline that ran no evaluation stage has no trials
        lines += [f"A trial succeeds when its {report['success']}.", ""]
    if report.get("viewer"):
        lines += [f"Trajectory viewer (every episode, its critiques and labels; open in a browser): "
                  f"[{report['viewer']}]({report['viewer']})", ""]
    for key in group_keys(report):
        present = [c for c in configs if key in c["groups"]]
        first = present[0]["groups"][key]
        ks = list(first["pass^k"])
        where = {True: ", in-domain", False: ", out-of-domain"}.get(first.get("in_domain"), "")  # type: ignore[call-overload]
        lines += [f"## pass^k: {key} ({first['tasks']} tasks, n = {first['n']} trials each{where})", ""]
        lines += _table(
            ["configuration", "budget", *ks, "reward mean", "MDD " + "/".join(ks)],
            [
                [c["label"], c["verification_budget"], *_with_intervals(c["groups"][key]),
                 c["groups"][key]["reward_mean"],
                 " / ".join(_cell(v) for v in c["groups"][key].get("pass^k_mdd", {}).values()) or "-"]
                for c in present
            ],
        )
        if "pass^k_ci" in first:
            lines += [
                "Brackets: 95% interval (bootstrap over tasks). MDD: the smallest difference from an "
                "uncorrelated configuration this suite detects (80% power, 5% level).", "",
            ]
    overall = [c for c in configs if c.get("overall")]
    if overall:
        ks = list(overall[0]["overall"]["pass^k"])
        lines += [f"## pass^k: overall ({overall[0]['overall']['tasks']} tasks of every domain/split)", ""]
        lines += _table(["configuration", "budget", *ks],
                        [[c["label"], c["verification_budget"], *_with_intervals(c["overall"])] for c in overall])
    lines += _comparison_lines(report.get("comparisons") or [])
    lines += [
        "## Critic and cost", "",
        "Critiques and flags are totals; tokens and wall time are means per episode (one trial of "
        "one task).", "",
    ]
    lines += _table(
        ["configuration", "critiques", "flags", "flag rate", "correction rate", "resistance",
         "false-positive rate", "unparsable", "policy tokens", "prompt tokens", "wall s"],
        [
            [c["label"], c["critic"]["critiques"], c["critic"]["flags"], c["critic"]["flag_rate"],
             c["critic"]["correction_rate"], c["critic"]["resistance"], c["critic"]["false_positive_rate"],
             c["critic"].get("unparsable"),
             *(f"{c['cost'][key]:.1f}" for key in ("policy_tokens", "prompt_tokens", "wall_s"))]
            for c in configs
        ],
    )
    if plots:
        lines += ["## Plots", ""]
        for path in plots:
            rel = path.relative_to(base) if base is not None else path
            lines += [f"![{path.stem}]({rel.as_posix()})", ""]
    return "\n".join(lines)


def _with_intervals(group: dict[str, Any]) -> list[str]:
    """pass^k cells, each with its interval when the report has one."""
    cis = group.get("pass^k_ci", {})
    return [
        f"{value:.3f} [{cis[name][0]:.3f}, {cis[name][1]:.3f}]" if name in cis else _cell(value)
        for name, value in group["pass^k"].items()
    ]


def _comparison_lines(comparisons: list[dict[str, Any]]) -> list[str]:
    """The paired differences, "(includes 0)" marking those the data cannot tell from none."""
    if not comparisons:
        return []
    ks = list(dict.fromkeys(k for c in comparisons for k in c["pass^k"]))
    lines = [
        "## Paired differences", "",
        "A - B over the tasks both ran, tasks resampled together; 95% intervals. "
        "**(includes 0)** marks a difference this suite cannot tell from none. "
        "MDD: the smallest true difference this pairing detects with 80% power at the 5% level.", "",
    ]
    rows = []
    for c in comparisons:
        cells = []
        for k in ks:
            d = c["pass^k"].get(k)
            cells.append("-" if d is None else f"{d['difference']:+.3f} [{d['ci'][0]:+.3f}, {d['ci'][1]:+.3f}]"
                         + (" **(includes 0)**" if d["includes_zero"] else ""))
        mdd = " / ".join(_cell(c["pass^k"][k]["mdd"]) for k in ks if k in c["pass^k"])
        rows.append([c["kind"], c["label"], c["group"], c["tasks"], *cells, mdd])
    return lines + _table(["comparison", "A - B", "domain/split", "tasks", *ks, "MDD " + "/".join(ks)], rows)


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return out + [""]


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def write_report(report: dict[str, Any], out_dir: str | Path) -> dict[str, Path]:
    """Write report.json, the plots and summary.md under ``out_dir``; returns their paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"report": out_dir / "report.json", "summary": out_dir / "summary.md"}
    paths["report"].write_text(json.dumps(report, indent=2) + "\n")
    plots = write_plots(report, out_dir / "plots")
    paths["summary"].write_text(render_markdown(report, plots, base=out_dir) + "\n")
    paths.update({f"plot:{p.stem}": p for p in plots})
    logger.info("wrote %s, %s and %d plots", paths["report"], paths["summary"], len(plots))
    return paths


def flat_metrics(report: dict[str, Any]) -> dict[str, float]:
    """``eval/<configuration>/<domain>/<split>/pass^k`` and friends, for the metrics logger."""
    out: dict[str, float] = {}
    for c in report["configurations"]:
        for key, group in c["groups"].items():
            for name, value in group["pass^k"].items():
                out[f"eval/{c['name']}/{key}/{name}"] = value
            for name, (low, high) in group.get("pass^k_ci", {}).items():
                out[f"eval/{c['name']}/{key}/{name}_ci_low"] = low
                out[f"eval/{c['name']}/{key}/{name}_ci_high"] = high
            out[f"eval/{c['name']}/{key}/reward_mean"] = group["reward_mean"]
        for name, value in {**c["critic"], **c["cost"]}.items():
            if value is not None:
                out[f"eval/{c['name']}/{name}"] = value
    return out


SAMPLE_COLUMNS = [
    "configuration", "domain", "split", "task_index", "trial", "reward", "termination",
    "critiques", "conversation",
]


def sample_rows(runs: list[EvalRun], per_run: int, max_chars: int = 4000) -> list[list[Any]]:
    """Rows of :data:`SAMPLE_COLUMNS`: per configuration, trajectories with critiques first."""
    rows: list[list[Any]] = []
    for run in runs:
        chosen = sorted(run.trajectories, key=lambda t: (not t.verification_rounds, t.key))[:per_run]
        for t in chosen:
            critiques = "\n\n".join(
                f"[{r.critique.get('verdict')}/{r.critique.get('error_type')}] "
                f"{json.dumps(r.proposal)} -> {r.critique.get('text', '')} "
                f"-> revision {json.dumps(r.revision)}"
                for r in t.verification_rounds
            )
            conversation = "\n".join(
                f"{m['role']}{'(' + m['name'] + ')' if m.get('name') else ''}: {_message_text(m)}" for m in t.messages[1:]
            )
            rows.append([
                run.label, t.domain, t.split, t.task_index, t.trial, t.reward,
                t.info.get("termination", ""), critiques, conversation[:max_chars],
            ])
    return rows


def _message_text(message: dict[str, Any]) -> str:
    calls = message.get("tool_calls") or []
    text = str(message.get("content") or "")
    if calls:
        text += " " + " ".join(json.dumps(c.get("function", c)) for c in calls)
    return text.strip()
