"""GPUs a configuration asks for, by component and at the pipeline's busiest stage.

The rollout group and the critic service live through the whole pipeline; learner groups exist
during the training stages (warm-start, critic training, optimise).  The teacher's actors (its
rollout workers with ``pipeline.collect_policy=teacher``, its rationale service with
``teacher.enabled``) run in the collect and label stages, after the policy's rollout group has
given its resources back.  An LLM user simulator is served by an OpenAI-compatible endpoint
outside these actors.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cast_rl.config.schema import CastConfig, CriticConfig

ACTOR_KINDS = ("rollout", "learner", "critic", "teacher")
"""Kinds of long-lived actors that ask Ray for resources."""


@dataclass(frozen=True)
class ActorRequest:
    """What each actor of one kind asks Ray for, and how many there are: the one description
    both the actors (:meth:`ray_options`) and the pre-flight check (``launchers.cluster``) use."""

    count: int
    count_key: str
    per_actor: dict[str, tuple[float, str]] = field(default_factory=dict)
    """Resource (CPU, GPU or a custom one) -> (amount per actor, the config key that sets it)."""

    def ray_options(self) -> dict[str, Any]:
        custom = {k: v for k, (v, _) in self.per_actor.items() if k not in ("CPU", "GPU")}
        return {"num_cpus": self.per_actor["CPU"][0], "num_gpus": self.per_actor["GPU"][0], "resources": custom}


def critic_request(critic: CriticConfig) -> ActorRequest:
    """A critic-service actor: no CPU for the rule critic, one CPU and its GPUs for a model; none
    at all for a model critic served by the policy engines (``critic.engine=shared_with_policy``)."""
    if critic.backend != "rule" and critic.engine == "shared_with_policy":
        return ActorRequest(0, "critic.engine=shared_with_policy", {"CPU": (0.0, "critic.engine=shared_with_policy"),
                                                                   "GPU": (0.0, "critic.engine=shared_with_policy")})
    if critic.backend == "rule":
        return ActorRequest(critic.num_replicas, "critic.num_replicas",
                            {"CPU": (0.0, "critic.backend=rule"), "GPU": (0.0, "critic.backend=rule")})
    return ActorRequest(critic.num_replicas, "critic.num_replicas", {
        "CPU": (1.0, f"critic.backend={critic.backend} (1 CPU per replica)"),
        "GPU": (critic.num_gpus_per_replica, "critic.num_gpus_per_replica"),
    })


def actor_request(cfg: CastConfig, kind: str) -> ActorRequest:
    """The :class:`ActorRequest` of ``kind`` (one of :data:`ACTOR_KINDS`)."""
    if kind == "rollout":
        r = cfg.rollout
        per = {"CPU": (r.num_cpus_per_worker, "rollout.num_cpus_per_worker"),
               "GPU": (r.num_gpus_per_worker, "rollout.num_gpus_per_worker")}
        per.update({k: (v, f"rollout.ray_resources.{k}") for k, v in r.ray_resources.items()})
        return ActorRequest(r.num_workers, "rollout.num_workers", per)
    if kind == "learner":
        lr = cfg.learner
        per = {"CPU": (lr.num_cpus_per_worker, "learner.num_cpus_per_worker"),
               "GPU": (lr.num_gpus_per_worker, "learner.num_gpus_per_worker")}
        per.update({k: (v, f"learner.ray_resources.{k}") for k, v in lr.ray_resources.items()})
        return ActorRequest(lr.num_workers, "learner.num_workers", per)
    if kind == "critic":
        return critic_request(cfg.critic)
    if kind == "teacher":  # its rollout workers, or its one rationale service
        t = cfg.teacher
        count, key = ((t.num_workers, "teacher.num_workers") if cfg.pipeline.collect_policy == "teacher"
                      else (int(t.enabled), "teacher.enabled"))
        return ActorRequest(count, key, {"CPU": (t.num_cpus, "teacher.num_cpus"), "GPU": (t.num_gpus, "teacher.num_gpus")})
    raise ValueError(f"unknown actor kind {kind!r}; choose from {', '.join(ACTOR_KINDS)}")


def gpus_required(cfg: CastConfig) -> dict[str, float]:
    """GPUs per actor kind, and ``peak``: the critic service throughout, plus the larger of the
    policy's rollout group with a learner and the teacher's actors (the pipeline releases the
    rollout group before a teacher stage)."""
    need = {kind: float(r.count * r.per_actor["GPU"][0]) for kind in ACTOR_KINDS if (r := actor_request(cfg, kind))}
    need["peak"] = need["critic"] + max(need["rollout"] + need["learner"], need["teacher"])
    return need
