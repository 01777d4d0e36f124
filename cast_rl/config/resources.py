"""GPUs a configuration asks for, by component and at the pipeline's busiest stage.

The rollout group and the critic service live through the whole pipeline; learner groups exist
during the training stages (warm-start, critic training, optimise) and the teacher's engine
during the label stage, never together.  An LLM user simulator is served by an
OpenAI-compatible endpoint outside these actors.
"""

from __future__ import annotations

from cast_rl.config.schema import CastConfig


def gpus_required(cfg: CastConfig) -> dict[str, float]:
    critic = cfg.critic.num_replicas * cfg.critic.num_gpus_per_replica
    teacher_on_gpus = cfg.teacher.enabled and cfg.teacher.inference.backend == "vllm"
    need = {
        "rollout": cfg.rollout.num_workers * cfg.rollout.num_gpus_per_worker,
        "critic": float(critic if cfg.critic.backend != "rule" else 0),
        "learner": cfg.learner.num_workers * cfg.learner.num_gpus_per_worker,
        "teacher": float(cfg.teacher.inference.tensor_parallel_size if teacher_on_gpus else 0),
    }
    always = need["rollout"] + need["critic"]
    need["peak"] = always + max(need["learner"], need["teacher"])
    return need
