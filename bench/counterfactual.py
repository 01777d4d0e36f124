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
from cast_rl.envs.core import load_domain_data  # noqa: E402
from cast_rl.envs.generate import write_retail  # noqa: E402
from cast_rl.models.tiny import corpus_from_paths, train_tokenizer  # noqa: E402
from cast_rl.rollout.noisy_expert import NoisyExpertEngine  # noqa: E402
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
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp) / "retail"
        write_retail(data_dir, seed=0, num_tasks=args.tasks, kinds=("cancel",), compact=True)
        data = load_domain_data("retail", data_dir)
        tok = train_tokenizer(corpus_from_paths([data_dir]), 4096)
        cfg = load_config(None, [f"env.data_dir={data_dir}", "env.split=train", "env.max_steps=12"])

        fork_ms, replay_ms, fork_last, replay_last, cont_ms, prefix_msgs = [], [], [], [], [], []
        for task in range(len(data.tasks("train"))):
            engine = NoisyExpertEngine(tok, data.task("train", task), data.spec.write_tools, None)
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
    print(json.dumps(out))


if __name__ == "__main__":
    main()
