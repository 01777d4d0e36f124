"""Every model actor asks Ray for exactly what the pre-flight resource check counts: the rollout
workers, the learner ranks and the critic-service actors are created with the options of
``cast_rl.config.resources.actor_request``, the same function ``launchers.cluster`` checks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cast_rl.config import load_config
from cast_rl.config.resources import gpus_required
from launchers.cluster import Capacity, _requests, check_resources

REPO = Path(__file__).resolve().parents[1]


class _Recorder:
    """Stands in for a Ray actor class: records the options each actor is created with."""

    def __init__(self) -> None:
        self.options_seen: list[dict[str, Any]] = []

    def options(self, **options: Any) -> _Recorder:
        self.options_seen.append(options)
        return self

    def remote(self, *args: Any, **kwargs: Any) -> _Recorder:
        return self

    def __getattr__(self, name: str) -> Any:  # actor methods: w.ready.remote(), w.address.remote()
        return self


def _counted(cfg, kind: str) -> dict[str, Any]:  # noqa: ANN001
    (req,) = _requests(cfg, [kind])
    per = {k: v for k, (v, _) in req.per_actor.items()}
    return {"count": req.count, "num_cpus": per.pop("CPU"), "num_gpus": per.pop("GPU"), "resources": per}


def _created(options: list[dict[str, Any]]) -> dict[str, Any]:
    assert options and all(o == options[0] for o in options)
    o = options[0]
    return {"count": len(options), "num_cpus": o["num_cpus"], "num_gpus": o["num_gpus"], "resources": o["resources"]}


@pytest.mark.parametrize("name", ["qwen3_8b_4x8gpu.yaml", "qwen3_4b_1x8gpu.yaml"])
def test_actors_request_what_the_resource_check_counts(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import actors.learner
    import actors.rollout_group
    import actors.rollout_worker
    from actors.critic_service import _resources
    from actors.learner import LearnerGroup
    from actors.rollout_group import RolloutGroup

    cfg = load_config(REPO / "configs" / "paper" / name,
                      ["rollout.ray_resources={rollout_node: 1}", "learner.ray_resources={learner_node: 1}"])
    rollout, learner = _Recorder(), _Recorder()
    monkeypatch.setattr(actors.rollout_worker, "RolloutWorkerActor", rollout)
    monkeypatch.setattr(actors.learner, "LearnerWorkerActor", learner)
    monkeypatch.setattr(actors.rollout_group.ray, "get", lambda refs, **_: refs)
    monkeypatch.setattr(actors.learner.ray, "get", lambda refs, **_: ("127.0.0.1", 1) if not isinstance(refs, list)
                        else [0] * len(refs))
    RolloutGroup(cfg)
    LearnerGroup(cfg)
    critic = _resources(cfg.critic)

    assert _created(rollout.options_seen) == _counted(cfg, "rollout")
    assert _created(learner.options_seen) == _counted(cfg, "learner")
    counted = _counted(cfg, "critic")
    assert (critic["num_cpus"], critic["num_gpus"], critic["resources"]) == (
        counted["num_cpus"], counted["num_gpus"], counted["resources"])
    # the critic's vLLM gets GPUs of its own, and the GPU totals are what the actors hold
    assert cfg.critic.backend != "rule" and critic["num_gpus"] >= 1
    need = gpus_required(cfg)
    assert need["critic"] == cfg.critic.num_replicas * critic["num_gpus"]
    assert need["rollout"] == len(rollout.options_seen) * rollout.options_seen[0]["num_gpus"]
    assert need["learner"] == len(learner.options_seen) * learner.options_seen[0]["num_gpus"]


def test_a_critic_gpu_or_custom_resource_the_cluster_lacks_is_named() -> None:
    cpu_only = Capacity({"CPU": 64.0, "GPU": 0.0}, {"CPU": 64.0, "GPU": 0.0}, "the test cluster")
    cfg = load_config(None, ["critic.backend=model", "critic.num_gpus_per_replica=1"])
    with pytest.raises(Exception, match=r"critic\.num_gpus_per_replica=1 cannot be placed"):
        check_resources(cfg, ("critic",), capacity=cpu_only)
    cfg = load_config(None, ["rollout.ray_resources={rollout_node: 1}"])
    with pytest.raises(Exception, match=r"rollout\.ray_resources\.rollout_node=1 cannot be placed.*'rollout_node'"):
        check_resources(cfg, ("rollout",), capacity=cpu_only)
    nodes = {"CPU": 64.0, "GPU": 0.0, "rollout_node": 2.0}
    check_resources(load_config(None, ["rollout.ray_resources={rollout_node: 1}"]), ("rollout",),
                    capacity=Capacity(nodes, nodes, "the test cluster"))
