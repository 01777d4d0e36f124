"""``critic.model.dtype`` and ``teacher.model.dtype`` reach the engine that serves them.

They were inert: the critic service and the teacher built their vLLM engines with no dtype, so a
trained critic (saved with the learner's float32 master weights) was served in float32 whatever
the config said, twice the memory ``configs/paper`` planned for.  A recording stand-in for
``build_engine`` shows the dtype each builder passes.
"""

from __future__ import annotations

from typing import Any

import pytest

from cast_rl.config import load_config
from cast_rl.critique import service, teacher


@pytest.fixture()
def built(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = []

    def record(path: str, cfg: Any, seed: int = 0, dtype: str | None = None, **kwargs: Any) -> object:
        calls.append({"path": path, "dtype": dtype})
        return object()

    monkeypatch.setattr(service, "build_engine", record)
    monkeypatch.setattr(teacher, "build_engine", record)
    return calls


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_the_critic_is_served_in_its_model_dtype(built: list[dict[str, Any]], dtype: str) -> None:
    cfg = load_config(None, ["critic.backend=model", "critic.model.path=some/critic", f"critic.model.dtype={dtype}"])
    service.build_verifier(cfg.critic)
    assert built == [{"path": "some/critic", "dtype": dtype}]


def test_the_teacher_is_served_in_its_model_dtype(built: list[dict[str, Any]]) -> None:
    cfg = load_config(None, ["teacher.enabled=true", "teacher.model.path=some/teacher", "teacher.model.dtype=bfloat16"])
    teacher.build_teacher_engine(cfg.teacher)
    assert built == [{"path": "some/teacher", "dtype": "bfloat16"}]
