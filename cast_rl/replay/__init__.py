"""The replay buffer between rollout workers and the learner (pure logic; see actors/replay_buffer.py)."""

from cast_rl.replay.buffer import AddResult, ReplayBuffer, ReplayStats

__all__ = ["AddResult", "ReplayBuffer", "ReplayStats"]
