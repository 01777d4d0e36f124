"""A rollout group's merged metrics and the in-process rule critic a worker builds.

Run: .venv/bin/python -m pytest tests/rollout/test_worker_metrics.py -q
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from cast_rl.config import load_config
from cast_rl.envs.core import load_domain_data
from cast_rl.rollout.verifiers import build_verifier
from cast_rl.rollout.worker import RolloutWorker, merge_worker_metrics


def test_throughputs_add_up_and_rates_are_weighted_by_episodes() -> None:
    a = {
        "rollout/episodes": 3.0,
        "rollout/policy_tokens": 300.0,
        "rollout/policy_tokens_per_s": 100.0,
        "rollout/malformed_calls_per_episode": 1.0,
        "rollout/token_inconsistent_rate": 0.0,
        "rollout/critiques": 2.0,
        "rollout/policy_version": 4.0,
        "rollout/termination/done": 3.0,
    }
    b = {
        "rollout/episodes": 1.0,
        "rollout/policy_tokens": 50.0,
        "rollout/policy_tokens_per_s": 50.0,
        "rollout/malformed_calls_per_episode": 0.0,
        "rollout/token_inconsistent_rate": 1.0,
        "rollout/critiques": 1.0,
        "rollout/policy_version": 5.0,
        "rollout/termination/max_steps": 1.0,
    }
    merged = merge_worker_metrics([a, b])
    assert merged == {
        "rollout/episodes": 4.0,
        "rollout/policy_tokens": 350.0,
        "rollout/policy_tokens_per_s": 150.0,  # both workers generate at once: 100 + 50 tokens/s
        "rollout/malformed_calls_per_episode": 0.75,  # 3 malformed calls over 4 episodes
        "rollout/token_inconsistent_rate": 0.25,  # 1 of 4 episodes
        "rollout/critiques": 3.0,
        "rollout/policy_version": 5.0,
        "rollout/termination/done": 3.0,
        "rollout/termination/max_steps": 1.0,
    }


def test_workers_without_episodes_give_zero_rates() -> None:
    idle = {
        "rollout/episodes": 0.0,
        "rollout/token_inconsistent_rate": 0.0,
        "rollout/policy_tokens_per_s": 0.0,
    }
    assert merge_worker_metrics([idle, idle]) == idle
    assert merge_worker_metrics([]) == {}


def test_the_in_process_rule_critic_knows_the_domain_tools(retail_data_dir: Path) -> None:
    cfg = load_config(
        None, [f"env.data_dir={retail_data_dir}", "critic.backend=rule", "critic.service=false"]
    )
    data = load_domain_data("retail", retail_data_dir)
    assert build_verifier(cfg, data) is None  # budget 0: no critic
    # the worker builds it when a budget needs one (as the eval sweep does)
    worker = RolloutWorker(cfg, data, SimpleNamespace(tokenizer=None))
    worker.set_verification_budget(1)
    rule = worker.runner.verifier.inner
    assert rule.tools == {"retail": data.tools} and data.tools


def test_a_worker_without_a_way_to_the_critic_actors_says_so(retail_data_dir: Path) -> None:
    """The library does not reach Ray itself: a critic served by actors needs ``connect``."""
    cfg = load_config(None, [f"env.data_dir={retail_data_dir}", "critic.backend=rule",
                             "critic.service=true", "critic.verification_budget=1"])
    data = load_domain_data("retail", retail_data_dir)
    with pytest.raises(ValueError, match="connect=actors.critic_service.critic_client"):
        build_verifier(cfg, data)
    connected = object()
    assert build_verifier(cfg, data, connect=lambda c: connected) is connected


def test_chunk_size_is_a_key_with_a_documented_default() -> None:
    from actors.rollout_group import default_chunk_size

    assert load_config(None).rollout.chunk_size is None
    assert load_config(None, ["rollout.chunk_size=5"]).rollout.chunk_size == 5
    # None: one chunk per worker while a worker's share fits in flight (ceil(10 / 2) = 5; four
    # units on one worker run together, not as two rounds of two), else about two chunks per
    # worker (ceil(50 / (2 x 1)) = 25), capped by episodes_in_flight
    assert (
        default_chunk_size(10, 2, 32),
        default_chunk_size(4, 1, 16),
        default_chunk_size(50, 1, 32),
        default_chunk_size(100, 1, 32),
        default_chunk_size(1, 4, 32),
        default_chunk_size(80, 1, 120),
    ) == (5, 4, 25, 32, 1, 80)
