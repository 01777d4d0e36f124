"""A small learnable retail task for learning tests: say a target string in the first reply.

Every task has no gold actions and one required output, so under the source reward rule an
episode earns 1 exactly when the agent's messages contain the target (case-insensitive) and the
database is unchanged; the scripted user stops at the first reply of a task without writes.
With ``env.max_steps=1`` the reward is therefore "the first turn is a message containing the
target".  The database, policy and tool schemas are the generated compact retail ones (the
quickstart's: a policy and tool list cut to the cancel tasks), so the episodes run through the
real environment, user simulator, rollout workers and reward.  The prompt is a little over
half the full setting's (policy and tool schemas: 8.1k characters against 14.2k), and the
learner's step runs on all of it: the two GRPO tests took 107 s and 114 s instead of 170 s and
177 s (2026-12-06).

A test helper (``tests/learner/test_grpo_vllm_learning.py``), kept out of the library::

    cd tests/learner && python -c "from say_target_env import write_say_target; write_say_target('/tmp/toy', 'q')"
"""

from __future__ import annotations

import json
from pathlib import Path

from cast_rl.envs.generate import write_retail
from cast_rl.envs.types import Task


def write_say_target(out: str | Path, target: str, num_tasks: int = 16, seed: int = 0) -> Path:
    """A retail data directory whose ``tasks_train.json`` asks for ``target`` in the first reply."""
    out = Path(out)
    write_retail(out, seed=seed, num_tasks=max(num_tasks, 8), compact=True)
    users = sorted(json.loads((out / "db" / "users.json").read_text()))
    tasks = [
        Task(
            user_id=users[i % len(users)],
            instruction=f"You want the agent's first reply to contain {target!r}.",
            actions=(),
            outputs=(target,),
            annotator="toy",
        ).to_json()
        for i in range(num_tasks)
    ]
    (out / "tasks_train.json").write_text(json.dumps(tasks, indent=2))
    return out
