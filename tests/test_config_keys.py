"""Configuration keys that did nothing now reach what they configure, or are refused.

``user.model.dtype`` and ``labeller.model.dtype`` were never passed to the engine that serves the
model; ``labeller.inference.top_p`` never reached the verifier's sampling;
``teacher.model.make_tiny_if_missing``, ``seed`` and ``tiny`` were read by nothing (the teacher
never built a model); ``entity_aliases`` on any model but the policy did nothing (the critic's was
already refused).  Recording stand-ins for ``build_engine`` and the tiny-model builder show what
each builder passes on; no engine starts.  The last test keeps new dead keys out of the schema.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import re
from pathlib import Path
from typing import Any

import pytest

import cast_rl.config.schema as schema
import cast_rl.models.setup
from cast_rl.config import ConfigError, load_config
from cast_rl.critique import llm_verifier, teacher
from cast_rl.envs import users
from cast_rl.inference.base import Sampling

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture()
def built(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Every ``build_engine`` call of the user, labeller and teacher builders: path and dtype."""
    calls: list[dict[str, Any]] = []

    def record(path: str, cfg: Any, seed: int = 0, dtype: str | None = None, **kwargs: Any) -> object:
        calls.append({"path": path, "dtype": dtype, "backend": cfg.backend})
        return object()

    for module in (users, llm_verifier, teacher):
        monkeypatch.setattr(module, "build_engine", record)
    return calls


def _model_dir(tmp_path: Path, name: str) -> Path:
    """A directory ensure_model takes as an existing model (it only looks for config.json)."""
    path = tmp_path / name
    path.mkdir()
    (path / "config.json").write_text("{}")
    return path


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_the_in_process_user_is_served_in_user_model_dtype(
    built: list[dict[str, Any]], tmp_path: Path, dtype: str
) -> None:
    model = _model_dir(tmp_path, "user")
    cfg = load_config(None, ["user.type=llm", f"user.model.path={model}", f"user.model.dtype={dtype}"])
    engine, complete = users.user_engine(cfg.user)
    assert engine is not None and complete is not None
    assert built == [{"path": str(model), "dtype": dtype, "backend": "vllm"}]


def test_the_endpoint_user_gets_user_model_dtype_too(built: list[dict[str, Any]]) -> None:
    cfg = load_config(None, ["user.type=llm", "user.model.path=served-user", "user.model.dtype=bfloat16",
                             "user.inference.backend=openai", "user.inference.base_url=http://127.0.0.1:1/v1"])
    users.build_user(cfg.user)
    assert built == [{"path": "served-user", "dtype": "bfloat16", "backend": "openai"}]


def test_the_llm_labeller_is_served_in_labeller_model_dtype(built: list[dict[str, Any]], tmp_path: Path) -> None:
    model = _model_dir(tmp_path, "verifier")
    cfg = load_config(None, ["labeller.backend=llm", f"labeller.model.path={model}",
                             "labeller.model.make_tiny_if_missing=false", "labeller.model.dtype=bfloat16"])
    llm_verifier.build_verifier_engine(cfg.labeller)
    assert built == [{"path": str(model), "dtype": "bfloat16", "backend": "vllm"}]


def test_labeller_sampling_keys_reach_every_verifier_call(retail_data_dir: Path) -> None:
    from cast_rl.critique.gold import gold_trajectory
    from cast_rl.envs.core import load_domain_data

    class Recording:
        """Records each call's sampling and fails it (the verifier counts a failed call)."""

        def __init__(self) -> None:
            self.sampling: list[Sampling] = []

        async def chat(self, messages: list[dict[str, str]], sampling: Sampling, tools: Any = None) -> Any:
            self.sampling.append(sampling)
            raise RuntimeError("recorded")

    cfg = load_config(None, ["labeller.backend=llm", "labeller.model.path=served-verifier",
                             "labeller.inference.top_p=0.5", "labeller.inference.temperature=0.3",
                             "labeller.inference.max_new_tokens=99"])
    data = load_domain_data("retail", retail_data_dir)
    engine = Recording()
    asyncio.run(llm_verifier.label_trajectories(cfg.labeller, data, [gold_trajectory(data, "train", 0)],
                                                engine=engine))
    assert engine.sampling
    assert {(s.top_p, s.temperature, s.max_new_tokens) for s in engine.sampling} == {(0.5, 0.3, 99)}


def test_teacher_builds_its_tiny_model_from_its_keys_when_asked(
    built: list[dict[str, Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[tuple[int, int]] = []

    def make_tiny(out: Path, tiny: schema.TinyConfig, seed: int = 0, **kwargs: Any) -> None:
        made.append((tiny.hidden_size, seed))
        out.mkdir(parents=True)
        (out / "config.json").write_text("{}")

    monkeypatch.setattr(cast_rl.models.setup, "make_tiny_model", make_tiny)
    path = tmp_path / "tiny-teacher"
    cfg = load_config(None, [f"teacher.model.path={path}", "teacher.model.make_tiny_if_missing=true",
                             "teacher.model.seed=7", "teacher.model.tiny.hidden_size=64",
                             "teacher.model.dtype=bfloat16"])
    teacher.build_teacher_engine(cfg.teacher)
    assert made == [(64, 7)] and (path / "config.json").exists()
    assert built == [{"path": str(path), "dtype": "bfloat16", "backend": "vllm"}]
    # by default nothing is built: the path goes to the engine as given (a directory or a name)
    teacher.build_teacher_engine(load_config(None, ["teacher.model.path=elsewhere"]).teacher)
    assert made == [(64, 7)] and built[-1]["path"] == "elsewhere"
    # an endpoint's model is a name, never built
    endpoint = load_config(None, [f"teacher.model.path={tmp_path / 'absent'}", "teacher.model.make_tiny_if_missing=true",
                                  "teacher.inference.backend=openai", "teacher.inference.base_url=http://127.0.0.1:1/v1"])
    teacher.build_teacher_engine(endpoint.teacher)
    assert made == [(64, 7)] and not (tmp_path / "absent").exists()


@pytest.mark.parametrize("owner", ["user", "teacher", "labeller"])
def test_entity_aliases_on_a_model_other_than_the_policy_are_refused(owner: str, tmp_path: Path) -> None:
    path = tmp_path / "aliases.yaml"
    path.write_text(f"{owner}:\n  model:\n    entity_aliases: {{order: '#W\\d{{7}}'}}\n")
    with pytest.raises(ConfigError, match=f"{owner}.model.entity_aliases is not allowed; aliases apply to "
                                          r"the policy and critic models only") as info:
        load_config(path)
    assert "\n" not in str(info.value)
    policy = tmp_path / "policy.yaml"
    policy.write_text("policy:\n  entity_aliases: {order: '#W\\d{7}'}\n")
    assert load_config(policy).policy.entity_aliases == {"order": r"#W\d{7}"}


# Fields read only through a method of the schema itself that the library calls
# (ScheduleConfig.warmup, called by cast_rl.learner.schedule).
READ_BY_SCHEMA_METHODS = {"warmup_ratio", "warmup_steps"}


def test_every_schema_field_is_read_outside_the_schema() -> None:
    """A field name no code outside the schema's modules (schema.py and the component modules it
    re-exports) reads as an attribute is a key that does nothing."""
    classes = {name: cls for name, cls in vars(schema).items()
               if isinstance(cls, type) and dataclasses.is_dataclass(cls)
               and cls.__module__.startswith("cast_rl.config.")}
    schema_files = {Path(inspect.getfile(cls)).resolve() for cls in classes.values()}
    sources = [p for d in ("cast_rl", "actors", "launchers") for p in (REPO / d).rglob("*.py")
               if p.resolve() not in schema_files]
    text = "\n".join(p.read_text() for p in sources)
    dead = [f"{name}.{f.name}" for name, cls in classes.items()
            for f in dataclasses.fields(cls)
            if f.name not in READ_BY_SCHEMA_METHODS and not re.search(rf"\.{f.name}\b", text)]
    assert dead == []
