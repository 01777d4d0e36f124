"""The teacher's placement: its engine runs in Ray actors that reserve its resources, never in the
driver.  Teacher collection's rollout workers and the rationale service ask Ray for what the
resource check counts (``actor_request(cfg, "teacher")``: 4 GPUs for the paper's TP=4 Qwen3-32B);
a real local Ray runs the rewrite in an actor while the driver cannot build any engine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cast_rl.config import load_config
from cast_rl.config.resources import actor_request, gpus_required

REPO = Path(__file__).resolve().parents[2]


class _Recorder:
    """Stands in for a Ray actor class: records the options and arguments of each actor."""

    def __init__(self) -> None:
        self.options_seen: list[dict[str, Any]] = []
        self.args_seen: list[tuple[Any, ...]] = []

    def options(self, **options: Any) -> _Recorder:
        self.options_seen.append(options)
        return self

    def remote(self, *args: Any, **kwargs: Any) -> _Recorder:
        self.args_seen.append(args)
        return self

    def __getattr__(self, name: str) -> Any:
        return self


@pytest.mark.parametrize("name", ["qwen3_4b_1x8gpu.yaml", "qwen3_8b_4x8gpu.yaml"])
def test_teacher_actors_reserve_the_teachers_gpus(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import actors.rollout_group
    import actors.rollout_worker
    import actors.teacher_service
    from actors.rollout_group import RolloutGroup
    from cast_rl.rollout.teacher import teacher_rollout_config

    cfg = load_config(REPO / "configs" / "paper" / name)
    assert cfg.pipeline.collect_policy == "teacher"
    assert (cfg.teacher.rollouts_per_task, cfg.teacher.collect_temperature, cfg.teacher.react) == (5, 0.7, True)
    workers, service = _Recorder(), _Recorder()
    monkeypatch.setattr(actors.rollout_worker, "RolloutWorkerActor", workers)
    monkeypatch.setattr(actors.teacher_service, "TeacherServiceActor", service)
    monkeypatch.setattr(actors.rollout_group.ray, "get", lambda refs, **_: refs)

    RolloutGroup(teacher_rollout_config(cfg), kind="teacher")
    actors.teacher_service.teacher_actor(cfg)

    tp = cfg.teacher.inference.tensor_parallel_size
    assert tp == 4 and cfg.teacher.num_gpus == tp
    assert len(workers.options_seen) == cfg.teacher.num_workers == actor_request(cfg, "teacher").count
    for options, args in zip(workers.options_seen, workers.args_seen):
        assert options["num_gpus"] == tp and options["num_cpus"] == cfg.teacher.num_cpus
        assert args[2] == "teacher"  # the worker builds the teacher's engine, in the actor
    ((options,),) = [service.options_seen]
    assert options["num_gpus"] == tp
    need = gpus_required(cfg)
    assert need["teacher"] == tp * cfg.teacher.num_workers
    # the teacher runs after the policy's rollout group is released: never on top of it
    assert need["peak"] == need["critic"] + max(need["rollout"] + need["learner"], need["teacher"])


def test_rewrite_runs_in_an_actor_not_the_driver(ray_local: Any, retail_data_dir: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    import cast_rl.critique.teacher
    import cast_rl.inference
    from actors.teacher_service import rewrite_with_service
    from cast_rl.critique.inject import inject
    from cast_rl.critique.labeller import Labeller
    from cast_rl.envs.core import load_domain_data

    def no_engine_here(*_: Any, **__: Any) -> Any:
        raise AssertionError("the driver built a teacher engine")

    # the driver's own modules refuse; the actor's process imports its own copies
    monkeypatch.setattr(cast_rl.critique.teacher, "build_teacher_engine", no_engine_here)
    monkeypatch.setattr(cast_rl.inference, "build_engine", no_engine_here)
    data = load_domain_data("retail", retail_data_dir)
    injected = inject("missing_confirmation", data, "train", 0)
    assert injected is not None
    labels = Labeller(data).label(injected.trajectory, 0)
    # an endpoint nobody listens on: every rewrite call fails and is discarded, in the actor
    cfg = load_config(None, [f"env.data_dir={retail_data_dir}", "teacher.enabled=true", "teacher.model.path=t",
                             "teacher.inference.backend=openai", "teacher.inference.base_url=http://127.0.0.1:9/v1",
                             "teacher.inference.api_key_env=PYTHONPATH", "teacher.inference.request_timeout_s=20"])
    out, metrics = rewrite_with_service(cfg, labels, [injected.trajectory])
    with_rationale = sum(1 for lab in labels if lab.rationale)
    assert with_rationale and metrics == {"label/teacher_rewritten": 0, "label/teacher_discarded": with_rationale}
    assert [lab.rationale for lab in out] == [lab.rationale for lab in labels]
