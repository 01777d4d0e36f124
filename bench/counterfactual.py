"""Counterfactual branching: the state before an action from a fork vs by reset-and-replay.

Run (from the repo root; needs nothing beyond the project)::

    .venv/bin/python bench/counterfactual.py [--tasks 20] [--repeats 5]

Generated compact retail tasks (cancel requests) are played by the noisy expert through the real
episode runner with the scripted user, keeping ``state.fork()`` at every decision point.  For the
same episodes and the same decision points, measured side by side in one process:

* ``fork_ms``: getting the exact state before the action from the snapshot taken while the
  episode ran (:meth:`EpisodeState.fork`: copy-on-write database, copied user and conversation);
* ``replay_ms``: rebuilding it without a snapshot (:meth:`EpisodeRunner.replay`: reset, then
  every recorded policy turn, tool call and user reply of the prefix again);
* ``branch_vs_replay_speedup``: ``replay_ms / fork_ms`` over all decision points, and
  ``..._last_write``: the same at the decision point before each episode's last write (the
  deepest prefix, where counterfactual credit needs it most);
* ``continuation_ms``: playing one branch from the decision point to the end (what both ways
  then pay alike), for scale.

Then the critic's net benefit (:mod:`cast_rl.eval.net_benefit`) on ``--benefit-tasks`` more
generated cancel tasks: the deferential noisy teacher (one error per episode, its kind drawn per
episode from ``--benefit-errors``: a wrong cancel reason fails the task unless stopped, a made-up
order id only wastes a step) with the rule critic wrapped to reject valid proposals at p = 0, 0.1, 0.3, 0.5, budgets
0..3, ``--benefit-trials`` trials, ``--benefit-k`` continuations per branch at each flag:

* ``harm_by_fp_rate``: branch pairs where the critique turned a success into a failure (the same
  episodes and seeds at every p), ``harm_rate_by_fp_rate`` the same over all branch pairs;
* ``budget_by_fp_rate``: the budget maximising pass^1 per token;
* ``benefit_by_type_p0``: helped / harmed / unchanged per error type without false positives;
* ``passk_per_1k_tokens_by_fp_rate``: pass^1 per 1000 tokens (policy + critique text) per budget.

Every number is the median over ``--repeats`` runs of the same work.  The last line of stdout
is one JSON object with the numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from cast_rl.config import load_config  # noqa: E402
from cast_rl.critique.verifier import RuleVerifier  # noqa: E402
from cast_rl.envs.core import load_domain_data  # noqa: E402
from cast_rl.envs.generate import write_retail  # noqa: E402
from cast_rl.eval.net_benefit import measure_benefit, noisy_expert_policy  # noqa: E402
from cast_rl.models.tiny import corpus_from_paths, train_tokenizer  # noqa: E402
from cast_rl.rollout.noisy_expert import NoisyExpertPolicy  # noqa: E402
from cast_rl.rollout.runner import EpisodeRunner, EpisodeSpec, EpisodeState  # noqa: E402


def _median_ms(fn, repeats: int) -> float:  # noqa: ANN001
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _keep(snapshots: dict[int, EpisodeState], state: EpisodeState) -> None:
    snapshots.setdefault(state.message_index, state.fork())


def _replay(runner: EpisodeRunner, traj: Any, index: int) -> None:
    asyncio.run(runner.replay(traj, index))


def _continue(runner: EpisodeRunner, state: EpisodeState) -> None:
    asyncio.run(runner.continue_from(state))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--benefit-tasks", type=int, default=40)
    parser.add_argument("--benefit-trials", type=int, default=2)
    parser.add_argument("--benefit-k", type=int, default=2)
    parser.add_argument("--benefit-errors", default="wrong_argument,fabricated_id")
    args = parser.parse_args()
    started = time.perf_counter()

    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp) / "retail"
        write_retail(data_dir, seed=0, num_tasks=args.tasks, kinds=("cancel",), compact=True)
        data = load_domain_data("retail", data_dir)
        tok = train_tokenizer(corpus_from_paths([data_dir]), 4096)
        cfg = load_config(None, [f"env.data_dir={data_dir}", "env.split=train", "env.max_steps=12"])

        fork_ms, replay_ms, fork_last, replay_last, cont_ms, prefix_msgs = [], [], [], [], [], []
        for task in range(len(data.tasks("train"))):
            engine = NoisyExpertPolicy(tok, data.task("train", task), data.spec.write_tools, None)
            runner = EpisodeRunner(cfg, data, engine)
            snapshots: dict[int, EpisodeState] = {}
            spec = EpisodeSpec("train", task, 0)
            traj = asyncio.run(runner.run(spec, on_decision=partial(_keep, snapshots)))
            writes = [t.message_index for t in traj.turns
                      if t.action and t.action["name"] in data.spec.write_tools]
            for index, snapshot in sorted(snapshots.items()):
                f = _median_ms(snapshot.fork, args.repeats)
                r = _median_ms(partial(_replay, runner, traj, index), args.repeats)
                fork_ms.append(f)
                replay_ms.append(r)
                if writes and index == writes[-1]:
                    fork_last.append(f)
                    replay_last.append(r)
                    prefix_msgs.append(index)
                    cont_ms.append(_median_ms(partial(_continue, runner, snapshot), args.repeats))

    out = {
        "episodes": args.tasks,
        "decision_points": len(fork_ms),
        "fork_ms": round(statistics.fmean(fork_ms), 4),
        "replay_ms": round(statistics.fmean(replay_ms), 4),
        "branch_vs_replay_speedup": round(sum(replay_ms) / sum(fork_ms), 1),
        "fork_ms_last_write": round(statistics.fmean(fork_last), 4),
        "replay_ms_last_write": round(statistics.fmean(replay_last), 4),
        "branch_vs_replay_speedup_last_write": round(sum(replay_last) / sum(fork_last), 1),
        "prefix_messages_last_write": round(statistics.fmean(prefix_msgs), 1),
        "continuation_ms": round(statistics.fmean(cont_ms), 3),
    }
    out.update(_benefit(args))
    out["wall_s"] = round(time.perf_counter() - started, 1)
    print(json.dumps(out))


FP_RATES = (0.0, 0.1, 0.3, 0.5)


def _benefit(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp) / "retail"
        write_retail(data_dir, seed=1, num_tasks=args.benefit_tasks, kinds=("cancel",), compact=True)
        data = load_domain_data("retail", data_dir)
        tok = train_tokenizer(corpus_from_paths([data_dir]), 4096)
        tasks = list(range(len(data.tasks("train"))))
        harm, harm_rate, budget, per_token, by_type = {}, {}, {}, {}, {}
        for p in FP_RATES:
            cfg = load_config(None, [
                f"env.data_dir={data_dir}", "env.split=train", "env.max_steps=12", "pipeline.benefit_error_rate=1.0",
                "pipeline.benefit_budgets=[0,1,2,3]", f"pipeline.benefit_errors=[{args.benefit_errors}]", f"pipeline.benefit_trials={args.benefit_trials}",
                f"pipeline.benefit_k={args.benefit_k}", f"pipeline.benefit_fp_rate={p}",
            ])
            engine_for = noisy_expert_policy(cfg, data, tok)
            verifier = RuleVerifier({data.domain: data.tools})
            report = asyncio.run(measure_benefit(cfg, data, tasks, engine_for, verifier, tok))
            m, key = report.metrics, str(p)
            harm[key], harm_rate[key] = int(m["benefit/harmed"]), round(m["benefit/harm_rate"], 4)
            budget[key] = report.chosen_budget
            per_token[key] = {str(b): round(row["passk_per_1k_tokens"]["1"], 3) for b, row in report.budgets.items()}
            if p == 0.0:
                by_type = {
                    name.split("/")[2]: {
                        c: int(m[f"benefit/type/{name.split('/')[2]}/{c}"]) for c in ("helped", "harmed", "unchanged")
                    }
                    for name in m if name.startswith("benefit/type/") and name.endswith("/flags")
                }
    return {
        "benefit_episodes_per_budget": len(tasks) * args.benefit_trials,
        "harm_by_fp_rate": harm,
        "harm_rate_by_fp_rate": harm_rate,
        "budget_by_fp_rate": budget,
        "benefit_by_type_p0": by_type,
        "passk_per_1k_tokens_by_fp_rate": per_token,
        "critic_tokens": "critique_text",
    }


if __name__ == "__main__":
    main()
