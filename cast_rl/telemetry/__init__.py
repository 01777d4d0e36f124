"""Metrics logging shared by every stage (console plus Weights & Biases)."""

from cast_rl.telemetry.metrics import NAMESPACES, MetricsLogger, read_offline_history

__all__ = ["NAMESPACES", "MetricsLogger", "read_offline_history"]
