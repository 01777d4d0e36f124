"""Start or join Ray for a run (``cluster.address``), after a pre-flight check of resources.

:func:`check_resources` compares what the actors of a run will ask Ray for (CPUs, GPUs and custom
resources per rollout worker, learner rank and critic replica: the very
:func:`~cast_rl.config.resources.actor_request` the actors are created with) with what the cluster has, and raises a one-line
:class:`~cast_rl.config.loader.ConfigError` naming the key to change.  Without it an impossible
request (a GPU per worker on a CPU machine, more CPUs than the cluster has) leaves actors pending
forever instead of failing.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from cast_rl.config.loader import ConfigError
from cast_rl.config.resources import ActorRequest, actor_request
from cast_rl.config.schema import CastConfig

logger = logging.getLogger(__name__)

PARTS = ("rollout", "learner", "critic", "teacher")
"""Actor kinds a launcher may start; pass those that live at the same time."""
_EPS = 1e-6


@dataclass(frozen=True)
class Capacity:
    """Resources of a Ray cluster: the total, and the largest single node (an actor's bound)."""

    total: Mapping[str, float]
    largest_node: Mapping[str, float]
    source: str
    """Where the numbers come from, for the error message."""


def _requests(cfg: CastConfig, parts: Iterable[str]) -> list[ActorRequest]:
    """What the actors of ``parts`` ask for: the same :func:`actor_request` the actors use."""
    out = []
    for part in parts:
        if part not in PARTS:
            raise ValueError(f"unknown part {part!r}; choose from {', '.join(PARTS)}")
        out.append(actor_request(cfg, part))
    return out


def _local_gpus() -> int:
    try:
        import torch

        return torch.cuda.device_count()
    except ImportError:  # pragma: no cover - torch is a hard dependency
        return 0


def cluster_capacity(cfg: CastConfig) -> Capacity | None:
    """The running Ray's resources; for ``cluster.address=local`` before Ray starts, what it will
    get (``cluster.num_cpus`` and this machine's GPUs); None when a remote cluster is not joined yet."""
    import ray

    if ray.is_initialized():
        nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
        largest = {k: max(n.get(k, 0.0) for n in nodes) for k in set().union(*nodes)} if nodes else {}
        return Capacity(dict(ray.cluster_resources()), largest, "the Ray cluster")
    if cfg.cluster.address == "local":
        local = {"CPU": float(cfg.cluster.num_cpus), "GPU": float(_local_gpus())}
        return Capacity(local, local, f"the local Ray (cluster.num_cpus={cfg.cluster.num_cpus})")
    return None


def check_resources(cfg: CastConfig, parts: Iterable[str] = PARTS[:3], capacity: Capacity | None = None) -> None:
    """Raise a one-line :class:`ConfigError` if the actors of ``parts`` cannot all be placed.

    Checks that each actor fits on the largest node, then that all of them (they live at the same
    time) fit in the cluster's total.  ``capacity`` defaults to :func:`cluster_capacity`.
    """
    capacity = capacity or cluster_capacity(cfg)
    if capacity is None:
        logger.info("resource check skipped: not connected to cluster %s yet", cfg.cluster.address)
        return
    requests = _requests(cfg, parts)
    for req in requests:
        for res, (amount, key) in req.per_actor.items():
            have = capacity.largest_node.get(res, 0.0)
            if amount > have + _EPS:
                unit = f"{res}s" if res in ("CPU", "GPU") else f"of custom resource {res!r}"
                fix = {"GPU": f"set {key}=0", "CPU": f"lower {key}"}.get(res, f"start a node with --resources or drop {key}")
                raise ConfigError(
                    f"config error: {key}={amount:g} cannot be placed: the largest node of "
                    f"{capacity.source} has {have:g} {unit}; {fix} or add resources"
                )
    for res in sorted({name for r in requests for name in r.per_actor}):
        terms = [(r, *r.per_actor[res]) for r in requests if r.per_actor.get(res, (0.0, ""))[0] > 0]
        need = sum(r.count * amount for r, amount, _ in terms)
        have = capacity.total.get(res, 0.0)
        if need > have + _EPS:
            parts_text = " + ".join(f"{r.count_key}={r.count} x {key}={amount:g}" for r, amount, key in terms)
            hint = " or raise cluster.num_cpus" if res == "CPU" and cfg.cluster.address == "local" else ""
            raise ConfigError(
                f"config error: {parts_text} need {need:g} {res}s at once, but {capacity.source} "
                f"has {have:g}; lower them{hint}"
            )


def init_ray(cfg: CastConfig, parts: Iterable[str] = ()) -> None:
    """``local`` starts a private Ray on this machine; anything else joins that cluster.

    ``parts``: the actor kinds the caller will start (see :data:`PARTS`); they are checked with
    :func:`check_resources` before Ray starts (local) or right after joining (a remote cluster).
    """
    import ray

    parts = tuple(parts)
    if ray.is_initialized():
        check_resources(cfg, parts)
        return
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # Workers import cast_rl, actors and launchers from the driver's working directory.
    runtime_env = {"env_vars": {"PYTHONPATH": os.getcwd(), "TOKENIZERS_PARALLELISM": "false"}}
    if cfg.cluster.address == "local":
        check_resources(cfg, parts)
        ray.init(
            num_cpus=cfg.cluster.num_cpus,
            include_dashboard=False,
            dashboard_host=cfg.cluster.dashboard_host,
            runtime_env=runtime_env,
            log_to_driver=True,
        )
    else:
        ray.init(address=cfg.cluster.address, runtime_env=runtime_env)
        check_resources(cfg, parts)
    logger.info("ray resources: %s", ray.cluster_resources())
