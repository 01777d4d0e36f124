"""Kill the replay-buffer actor while a producer adds and a consumer draws.

Real parts: a local Ray and the :class:`actors.replay_buffer.ReplayBufferActor` with its
append-only log, restarted by Ray (``max_restarts``).  The consumer stands in for the learner: it
draws batches in its own thread and, when a draw dies with the actor, waits for the restart and
rewinds to the cursor of its last delivered batch (what a learner resuming from a checkpoint
does), so a draw whose reply was lost is served again.  The producer retries a failed add with
the same samples (adds are idempotent by key).

    .venv/bin/python -m pytest tests/reliability/test_replay_faults.py -q
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from reliability_helpers import (
    actor_failures,
    lost_and_duplicated,
    num_restarts,
    retry_on_actor_failure,
)

from cast_rl.config.schema import ReplayBufferConfig
from cast_rl.learner.sample import Sample

BATCH = 4
TOTAL = 24


def _sample(i: int) -> Sample:
    return Sample(f"s{i:03d}", "outcome_groups", [1, 2, 3], [0, 1, 1], [0.0, -1.0, -1.0], advantage=0.5)


class Consumer(threading.Thread):
    """Draws ``TOTAL`` samples in batches; survives the buffer dying under a draw."""

    def __init__(self, client) -> None:  # noqa: ANN001
        super().__init__(daemon=True)
        self.client = client
        self.delivered: list[str] = []
        self.cursor = 0
        self.failed_draws = 0
        self.first_batch = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while len(self.delivered) < TOTAL:
                try:
                    batch = self.client.sample(BATCH, 0, timeout_s=120)
                except actor_failures():
                    self.failed_draws += 1
                    # the restarted buffer may have logged a draw whose reply never came: undo it
                    retry_on_actor_failure(lambda: self.client.rewind(self.cursor))
                    continue
                self.cursor += 1
                self.delivered += [s.key for s in batch]
                self.first_batch.set()
        except BaseException as exc:  # surfaced by the test thread
            self.error = exc
            self.first_batch.set()


def test_killed_replay_buffer_recovers_every_accepted_sample(ray_local, tmp_path: Path) -> None:  # noqa: ANN001
    from actors.replay_buffer import ReplayBufferClient

    log = tmp_path / "replay" / "log.jsonl"
    client = ReplayBufferClient(ReplayBufferConfig(), log, BATCH, max_restarts=2)
    produced = [_sample(i) for i in range(TOTAL)]
    accepted: set[str] = set()

    def add(chunk: list[Sample]) -> None:
        result = retry_on_actor_failure(lambda: client.add(chunk))  # a retried add is idempotent
        assert result.accepted + result.duplicates == len(chunk)
        accepted.update(s.key for s in chunk)

    consumer = Consumer(client)
    for i in range(0, TOTAL // 2, 6):
        add(produced[i : i + 6])
    consumer.start()
    consumer.first_batch.wait(120)
    assert consumer.error is None
    held_before = retry_on_actor_failure(lambda: client.snapshot())
    assert held_before["added"] == TOTAL // 2

    # A draw that can never be served (more samples than will ever exist) holds the actor: it
    # can only end by the actor's death, which tells this thread that the kill took effect.
    canary = client.handle.sample.remote(10 * TOTAL, 0, 600)
    ray_local.kill(client.handle, no_restart=False)  # the consumer is drawing or blocked in a draw
    with pytest.raises(actor_failures()):
        ray_local.get(canary, timeout=120)

    # The restarted actor rebuilt itself from its log: nothing accepted was lost.
    snap = retry_on_actor_failure(lambda: client.snapshot())
    assert num_restarts(client.handle) == 1
    assert snap["added"] == TOTAL // 2
    assert snap["size"] + snap["consumed"] == TOTAL // 2
    for i in range(TOTAL // 2, TOTAL, 6):  # the producer carries on
        add(produced[i : i + 6])
    consumer.join(300)
    assert not consumer.is_alive() and consumer.error is None

    lost, duplicated = lost_and_duplicated([s.key for s in produced], consumer.delivered)
    assert (lost, duplicated) == (0, 0)
    assert sorted(consumer.delivered) == sorted(accepted)
    final = client.snapshot()
    assert (final["added"], final["consumed"], final["size"]) == (TOTAL, TOTAL, 0)
    ray_local.kill(client.handle, no_restart=True)
