"""The replay buffer: idempotent adds, capacity, FIFO/priority, staleness, log recovery, rewind."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from cast_rl.config.schema import ReplayBufferConfig
from cast_rl.learner.sample import Sample
from cast_rl.replay import ReplayBuffer
from cast_rl.replay.buffer import BufferClosed


def _s(key: str, version: int = 0, critique: bool = False) -> Sample:
    return Sample(key, "outcome_groups", [1, 2, 3], [0, 1, 1], [0.0, -1.0, -1.0],
                  advantage=0.5, policy_version=version, critique_changed=critique)


def test_add_is_idempotent_by_key_even_after_consumption(tmp_path: Path) -> None:
    buf = ReplayBuffer(ReplayBufferConfig(), tmp_path / "log.jsonl")
    assert buf.add([_s("a"), _s("b")]).accepted == 2
    assert buf.add([_s("a")]).duplicates == 1
    assert [s.key for s in buf.sample(1, 0)] == ["a"]
    assert buf.add([_s("a"), _s("c")]).accepted == 1  # consumed keys stay seen
    assert buf.snapshot()["duplicates"] == 2 and len(buf) == 2


def test_capacity_drops_the_oldest_and_counts_them() -> None:
    buf = ReplayBuffer(ReplayBufferConfig(capacity=3))
    result = buf.add([_s(k) for k in "abcde"])
    assert result.accepted == 5 and result.dropped_capacity == 2
    assert [s.key for s in buf.sample(3, 0)] == ["c", "d", "e"]
    assert buf.snapshot()["dropped_capacity"] == 2


def test_priority_serves_critique_changed_samples_first() -> None:
    samples = [_s("a"), _s("b", critique=True), _s("c"), _s("d", critique=True)]
    fifo = ReplayBuffer(ReplayBufferConfig(sampling="fifo"))
    fifo.add(samples)
    assert [s.key for s in fifo.sample(3, 0)] == ["a", "b", "c"]
    prio = ReplayBuffer(ReplayBufferConfig(sampling="priority"))
    prio.add(samples)
    assert [s.key for s in prio.sample(3, 0)] == ["b", "d", "a"]


def test_stale_samples_are_dropped_at_draw_time_and_counted() -> None:
    buf = ReplayBuffer(ReplayBufferConfig(max_staleness=1))
    buf.add([_s("v0", 0), _s("v1", 1), _s("v2", 2), _s("v2b", 2)])
    assert buf.try_sample(4, learner_version=2) is None  # v0 lags by 2: dropped; 3 fresh left
    assert buf.snapshot()["dropped_stale"] == 1
    assert [s.key for s in buf.sample(3, 2)] == ["v1", "v2", "v2b"]


def test_draw_waits_for_fresh_samples_and_times_out_loudly() -> None:
    buf = ReplayBuffer(ReplayBufferConfig())
    with pytest.raises(TimeoutError):
        buf.sample(1, 0, timeout_s=0.05)
    got: list[list[Sample]] = []
    waiter = threading.Thread(target=lambda: got.append(buf.sample(2, 0, timeout_s=30)))
    waiter.start()
    buf.add([_s("a")])
    buf.add([_s("b")])
    waiter.join()
    assert [s.key for s in got[0]] == ["a", "b"]
    buf.close("stopping")
    with pytest.raises(BufferClosed):
        buf.sample(1, 0, timeout_s=30)


def test_wait_policy_throttles_producers_to_the_staleness_bound() -> None:
    cfg = ReplayBufferConfig(max_staleness=1, stale_policy="wait")
    buf = ReplayBuffer(cfg, batch_size=2)
    assert buf.admit(policy_version=0, n=2, timeout_s=0)  # would be drawn at version 0
    assert buf.admit(0, 2, timeout_s=0)  # queued behind the first reservation: version 1, lag 1
    assert not buf.admit(0, 2, timeout_s=0)  # would be drawn at version 2: lag 2
    buf.add([_s("a"), _s("b")])
    buf.add([_s("c"), _s("d")])
    # a producer holding version-0 weights waits; once the learner is past its bound it is told
    # to take new weights instead (False), whichever happens first
    answers: list[bool] = []
    producer = threading.Thread(target=lambda: answers.append(buf.admit(0, 2, timeout_s=30)))
    producer.start()
    assert [s.key for s in buf.sample(2, 0)] == ["a", "b"]
    buf.set_learner_version(1)
    assert [s.key for s in buf.sample(2, 1)] == ["c", "d"]
    buf.set_learner_version(2)
    producer.join()
    assert answers == [False]
    assert buf.admit(1, 2, timeout_s=0)  # version-1 weights, empty queue: drawn at 2, lag 1
    assert not buf.admit(0, 1, timeout_s=30)  # weights already too old: answered at once
    assert buf.snapshot()["dropped_stale"] == 0
    assert ReplayBuffer(ReplayBufferConfig(stale_policy="drop")).admit(0, 10**6, timeout_s=0)


def test_restart_recovers_accepted_samples_and_does_not_reserve_consumed(tmp_path: Path) -> None:
    log = tmp_path / "replay" / "log.jsonl"
    buf = ReplayBuffer(ReplayBufferConfig(capacity=4), log)
    buf.add([_s(k) for k in "abcde"])  # a dropped for capacity
    buf.sample(2, 0)  # b, c consumed
    buf.add([_s("d")])  # a retried add: duplicate
    again = ReplayBuffer(ReplayBufferConfig(capacity=4), log)
    assert [s.key for s in again.sample(2, 0)] == ["d", "e"]
    assert again.add([_s("b"), _s("f")]).accepted == 1
    snap = again.snapshot()
    assert (snap["added"], snap["consumed"], snap["dropped_capacity"], snap["duplicates"]) == (6, 4, 1, 2)


def test_torn_last_line_is_tolerated(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    ReplayBuffer(ReplayBufferConfig(), log).add([_s("a"), _s("b")])
    with log.open("a") as f:
        f.write('{"op": "add", "sam')
    assert len(ReplayBuffer(ReplayBufferConfig(), log)) == 2


def test_adds_after_a_torn_last_line_survive_the_next_recovery(tmp_path: Path) -> None:
    """The torn fragment is cut off at recovery: appended to, it swallowed the next record (lost,
    as a torn last line, at the next recovery; a bad middle line after one more)."""
    log = tmp_path / "log.jsonl"
    ReplayBuffer(ReplayBufferConfig(), log).add([_s("a"), _s("b")])
    with log.open("a") as f:
        f.write('{"op": "add", "sam')
    ReplayBuffer(ReplayBufferConfig(), log).add([_s("c")])
    again = ReplayBuffer(ReplayBufferConfig(), log)
    assert len(again) == 3
    again.add([_s("d")])
    assert len(ReplayBuffer(ReplayBufferConfig(), log)) == 4
    # a whole last record that lost only its newline is kept and ended
    log.write_bytes(log.read_bytes().rstrip(b"\n"))
    ReplayBuffer(ReplayBufferConfig(), log).add([_s("e")])
    assert len(ReplayBuffer(ReplayBufferConfig(), log)) == 5


def test_rewind_puts_back_what_later_draws_took(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    buf = ReplayBuffer(ReplayBufferConfig(), log)
    buf.add([_s(k) for k in "abcdef"])
    buf.sample(2, 0)
    cursor = buf.cursor()
    buf.sample(2, 0)  # c, d: drawn after the checkpoint
    assert buf.rewind(cursor) == 2
    assert [s.key for s in buf.sample(4, 0)] == ["c", "d", "e", "f"]
    restarted = ReplayBuffer(ReplayBufferConfig(), log)  # the rewind is in the log too
    assert len(restarted) == 0 and restarted.cursor() == cursor + 1
    with pytest.raises(ValueError):
        restarted.rewind(cursor + 5)


def test_replay_actor_imports_neither_torch_nor_the_learner() -> None:
    """The replay buffer's Ray actor is light: samples, sharding and batch metrics come from the
    torch-free cast_rl.samples."""
    import json
    import subprocess
    import sys

    code = ("import json, sys, actors.replay_buffer; "
            "print(json.dumps(sorted(m for m in sys.modules if m == 'torch' or m.startswith('cast_rl'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    modules = json.loads(out.stdout.splitlines()[-1])
    assert "torch" not in modules
    assert not [m for m in modules if m.startswith(("cast_rl.learner", "cast_rl.rollout"))], modules
    assert len(modules) < 30, modules  # records, samples, replay and the config: nothing else
