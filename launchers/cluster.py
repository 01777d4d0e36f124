"""Start or join Ray for a run (``cluster.address``)."""

from __future__ import annotations

import logging
import os

from cast_rl.config.schema import CastConfig

logger = logging.getLogger(__name__)


def init_ray(cfg: CastConfig) -> None:
    """``local`` starts a private Ray on this machine; anything else joins that cluster."""
    import ray

    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # Workers import cast_rl, actors and launchers from the driver's working directory.
    runtime_env = {"env_vars": {"PYTHONPATH": os.getcwd(), "TOKENIZERS_PARALLELISM": "false"}}
    if cfg.cluster.address == "local":
        ray.init(
            num_cpus=cfg.cluster.num_cpus,
            include_dashboard=False,
            dashboard_host=cfg.cluster.dashboard_host,
            runtime_env=runtime_env,
            log_to_driver=True,
        )
    else:
        ray.init(address=cfg.cluster.address, runtime_env=runtime_env)
    logger.info("ray resources: %s", ray.cluster_resources())
