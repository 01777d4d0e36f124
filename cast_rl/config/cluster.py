"""Where a run executes and reports: the Ray cluster it runs on, and its console and Weights &
Biases logging.
"""

from __future__ import annotations

from dataclasses import dataclass

from cast_rl.config._checks import _check_choice, _check_positive


@dataclass(frozen=True)
class LoggingConfig:
    """Console and Weights & Biases logging."""

    project: str = "cast_rl"
    """W&B project."""
    group: str = ""
    """W&B run group; empty means the run name."""
    run_name: str = ""
    """W&B run name; empty means a timestamped name."""
    mode: str = "offline"
    """W&B mode: offline, online or disabled (the WANDB_MODE environment variable wins)."""
    level: str = "INFO"
    """Console log level."""

    def __post_init__(self) -> None:
        _check_choice("logging.mode", self.mode, ("offline", "online", "disabled"))
        _check_choice("logging.level", self.level, ("DEBUG", "INFO", "WARNING", "ERROR"))


@dataclass(frozen=True)
class ClusterConfig:
    """Where Ray runs."""

    address: str = "local"
    """Ray address: local starts one in-process; auto joins a running cluster."""
    num_cpus: int = 2
    """For address=local: CPUs the local Ray may use."""
    dashboard_host: str = "127.0.0.1"
    """Interface the local Ray dashboard binds to."""

    def __post_init__(self) -> None:
        _check_positive("cluster.num_cpus", self.num_cpus)
