"""Rollouts: episode runner, token bookkeeping, trajectories, critic-in-the-loop hook."""
