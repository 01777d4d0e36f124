"""Held-out critic evaluation, unparsable answers, and which critic the pipeline serves.

Real parts: the generated retail data, gold and injected trajectories, the rule critic, the
critic answer parser and the leakage check; the held-out rows go through a real Parquet file.
A scripted engine stands in for a critic model where the test needs exact answers (a leaky
rationale, an unreadable one).

    .venv/bin/python -m pytest tests/critique/test_critic_heldout.py -q
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from cast_rl.config import load_config
from cast_rl.critique.context import iter_actions
from cast_rl.critique.datasets import Example, read_requests, request_for
from cast_rl.critique.gold import gold_trajectory
from cast_rl.critique.inject import inject
from cast_rl.critique.metrics import evaluate_verifier
from cast_rl.critique.verifier import (
    UNPARSABLE_TEXT,
    Critique,
    GuardedVerifier,
    ModelVerifier,
    RuleVerifier,
    VerifyRequest,
)
from cast_rl.envs.core import load_domain_data
from cast_rl.eval.critic_heldout import compare_critics, flat_heldout_metrics, heldout_markdown
from cast_rl.pipeline.context import resolve_critic, stage_dir, trained_critic_path
from cast_rl.pipeline.report import headline, write_pipeline_report

REPO = Path(__file__).resolve().parents[2]


def _action(traj: Any, index: int) -> dict[str, Any]:
    (action,) = [a for a in iter_actions(traj.messages) if a.message_index == index]
    return {"name": action.name, "kwargs": action.kwargs}


@pytest.fixture(scope="module")
def retail(retail_data_dir: Path) -> Any:
    return load_domain_data("retail", retail_data_dir)


@pytest.fixture(scope="module")
def heldout(retail: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Eight labelled actions of train task 0, written as the critic data's held-out Parquet.

    valid: three gold actions, and the unauthenticated lookup labelled valid (a label the rule
    critic disagrees with: its one false positive); invalid: a missing confirmation
    (policy_violation) and a fabricated id (hallucination), which the rule critic catches with
    the right type, and a wrong tool and a wrong record (wrong_tool_usage), which it misses.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    gold = gold_trajectory(retail, "train", 0)
    rows = [(gold, a.message_index, "valid", "none") for a in list(iter_actions(gold.messages))[:3]]
    for kind, verdict, error_type in [
        ("unauthenticated", "valid", "none"),
        ("missing_confirmation", "invalid", "policy_violation"),
        ("fabricated_id", "invalid", "hallucination"),
        ("wrong_tool", "invalid", "wrong_tool_usage"),
        ("wrong_record", "invalid", "wrong_tool_usage"),
    ]:
        injected = inject(kind, retail, "train", 0)
        assert injected is not None, kind
        rows.append((injected.trajectory, injected.message_index, verdict, error_type))
    examples = [
        Example(request_for(t, i, _action(t, i)), "", verdict, error_type, n, i).row()
        for n, (t, i, verdict, error_type) in enumerate(rows)
    ]
    path = tmp_path_factory.mktemp("critic_data") / "heldout.parquet"
    pq.write_table(pa.Table.from_pylist(examples), path)
    return path


def test_rule_critic_on_a_heldout_file_with_known_answers(retail: Any, heldout: Path) -> None:
    rows = read_requests(heldout)
    assert [v for _, v, _ in rows].count("invalid") == 4
    m = asyncio.run(evaluate_verifier(RuleVerifier({"retail": retail.tools}), rows, batch_size=3,
                                      tools={"retail": retail.tools}))
    assert m["critic/examples"] == 8
    assert m["critic/recall"] == pytest.approx(2 / 4)          # wrong tool and wrong record missed
    assert m["critic/precision"] == pytest.approx(2 / 3)
    assert m["critic/false_positive_rate"] == pytest.approx(1 / 4)  # the unauthenticated lookup
    assert m["critic/contested_false_positive_rate"] == 0.0    # no invalid example is that lookup
    assert m["critic/type_accuracy"] == pytest.approx(2 / 4)   # both detected with the right type
    assert m["critic/leakage_rate"] == 0.0                     # the rules cite only what was visible
    assert m["critic/unparsable_rate"] == 0.0


class ScriptedEngine:
    """Answers the i-th chat call with ``answers[i]`` (a critic model whose output is known)."""

    def __init__(self, answers: list[str]) -> None:
        self.answers, self.calls, self.model_path, self.closed = list(answers), 0, "/models/scripted-critic", False

    async def chat(self, messages: list[dict[str, str]], sampling: Any) -> Any:
        answer = self.answers[self.calls % len(self.answers)]
        self.calls += 1
        return SimpleNamespace(text=answer)

    async def close(self) -> None:
        self.closed = True


LEAKY = ('VERDICT: invalid\nERROR: hallucination\nCLAUSE: none\n'
         'EXPLANATION: Order #W9999999 belongs to someone else.\nFIX: Ask for the order id.')
CLEAN = "VERDICT: valid\nERROR: none\nCLAUSE: none\nEXPLANATION: The action follows the policy."


def test_model_critic_leakage_and_unparsable_rates(heldout: Path, retail: Any) -> None:
    rows = read_requests(heldout)  # 8 rows: answers cycle leaky, clean, unreadable, clean
    engine = ScriptedEngine([LEAKY, CLEAN, "I think it is fine", CLEAN])
    verifier = ModelVerifier(engine)
    m = asyncio.run(evaluate_verifier(verifier, rows, tools={"retail": retail.tools}))
    assert m["critic/unparsable_rate"] == pytest.approx(2 / 8)
    assert m["critic/leakage_rate"] == pytest.approx(2 / 6)   # two leaky of six readable answers
    critiques = asyncio.run(verifier.verify([rows[0][0]]))
    assert critiques[0].critic == "/models/scripted-critic"  # every critique names its critic


def test_compare_critics_runs_one_critic_at_a_time_and_closes_each(heldout: Path, retail: Any) -> None:
    rows = read_requests(heldout)
    events: list[str] = []
    engines = {"base": ScriptedEngine(["noise"]), "trained": ScriptedEngine([CLEAN])}

    def starter(name: str) -> Any:
        async def start() -> tuple[Any, str]:
            events.append(f"start {name}")
            assert all(e.closed for n, e in engines.items() if f"start {n}" in events and n != name)
            if name == "rule":
                return RuleVerifier({"retail": retail.tools}), "rule"
            return ModelVerifier(engines[name]), engines[name].model_path
        return start

    results = asyncio.run(compare_critics({n: starter(n) for n in ("rule", "base", "trained")}, rows,
                                          {"retail": retail.tools}))
    assert events == ["start rule", "start base", "start trained"]
    assert all(e.closed for e in engines.values())
    assert results["base"]["unparsable_rate"] == 1.0 and results["base"]["recall"] == 0.0
    assert results["trained"]["false_positive_rate"] == 0.0 and results["trained"]["recall"] == 0.0
    assert results["rule"]["recall"] == pytest.approx(0.5) and results["rule"]["critic"] == "rule"
    flat = flat_heldout_metrics(results)
    assert flat["critic/heldout/base/unparsable_rate"] == 1.0
    assert flat["critic/heldout/rule/false_positive_rate"] == pytest.approx(0.25)
    table = heldout_markdown({"data": str(heldout), "examples": 8, "critics": results})
    assert any(line.startswith("| rule | `rule` | 8 | 0.500 | 0.667 | 0.250 | 0.000 | 0.500 | 0.000 | 0.000 |")
               for line in table)


class Answers:
    """A verifier whose verdicts are given: the inner critic of the guard under test."""

    def __init__(self, verdicts: list[str]) -> None:
        self.verdicts = verdicts

    async def verify(self, requests: list[VerifyRequest]) -> list[Critique]:
        verdicts = [self.verdicts[i % len(self.verdicts)] for i in range(len(requests))]
        return [Critique(v, "none" if v == "valid" else "unknown", {}, "", critic="m") for v in verdicts]


def test_unparsable_answers_are_counted_and_follow_on_unparsable() -> None:
    request = VerifyRequest("retail", "policy", [], {"name": "respond", "kwargs": {"content": "hi"}})
    allow = GuardedVerifier(Answers(["valid", "unparsable", "unparsable"]), "allow")
    out = asyncio.run(allow.verify([request] * 3))
    assert [c.verdict for c in out] == ["valid", "unparsable", "unparsable"]  # the runner lets them run
    assert allow.counts == {"answers": 3, "unparsable": 2}
    reject = GuardedVerifier(Answers(["unparsable", "invalid"]), "reject", counts=allow.counts)
    out = asyncio.run(reject.verify([request] * 2))
    assert (out[0].verdict, out[0].unparsable, out[0].text) == ("invalid", True, UNPARSABLE_TEXT)
    assert (out[1].verdict, out[1].unparsable) == ("invalid", False)
    assert out[0].to_json()["unparsable"] is True and out[0].to_json()["critic"] == "m"
    assert allow.counts == {"answers": 5, "unparsable": 3}  # one counter across critics


def test_worker_metrics_count_unparsable_critiques(retail_data_dir: Path, tmp_path: Path) -> None:
    from cast_rl.rollout.worker import RolloutWorker

    cfg = load_config(None, [f"env.data_dir={retail_data_dir}", f"run_dir={tmp_path}",
                             "critic.verification_budget=1"])
    worker = RolloutWorker(cfg, load_domain_data("retail", retail_data_dir), SimpleNamespace(tokenizer=None),
                           Answers(["unparsable"]))
    request = VerifyRequest("retail", "policy", [], {"name": "respond", "kwargs": {"content": "hi"}})
    asyncio.run(worker.runner.verifier.verify([request, request]))
    assert worker.metrics()["rollout/critic_unparsable"] == 2


def test_backend_trained_needs_critic_training(tmp_path: Path) -> None:
    with pytest.raises(Exception, match=r"critic.backend='trained' is not allowed with pipeline.critic_train_steps=0"):
        load_config(None, ["critic.backend=trained", "pipeline.critic_train_steps=0"])
    with pytest.raises(Exception, match="critic.on_unparsable='maybe'"):
        load_config(None, ["critic.on_unparsable=maybe"])
    with pytest.raises(Exception, match=r"pipeline.critic_heldout_eval\[\]='teacher'"):
        load_config(None, ["pipeline.critic_heldout_eval=[rule,teacher]"])


def test_trained_backend_serves_the_stage_05_model_once_it_exists(tmp_path: Path) -> None:
    cfg = load_config(None, [f"run_dir={tmp_path}", "critic.backend=trained", "pipeline.critic_train_steps=2"])
    before = resolve_critic(cfg)
    assert before.backend == "rule"  # 01_eval_before: no critic is trained yet
    model = trained_critic_path(cfg)
    assert model == tmp_path / "05_train_critic" / "model"
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    after = resolve_critic(cfg)
    assert (after.backend, after.model.path, after.model.make_tiny_if_missing) == ("trained", str(model), False)
    assert resolve_critic(load_config(None, [f"run_dir={tmp_path}"])).backend == "rule"


def test_trained_backend_without_critic_training_stops_before_anything_starts(tmp_path: Path) -> None:
    from cast_rl.config import ConfigError
    from cast_rl.pipeline.context import check_trained_critic

    cfg = load_config(None, [f"run_dir={tmp_path}", "critic.backend=trained", "pipeline.critic_train_steps=2",
                             "pipeline.stages=[collect_with_critic,eval_after]"])
    with pytest.raises(ConfigError, match="critic.backend=trained but pipeline.stages has no train_critic"):
        check_trained_critic(cfg)
    model = trained_critic_path(cfg)  # a run that trained it earlier resumes
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    check_trained_critic(cfg)


def test_critic_base_warmstart_needs_the_warm_started_policy(tmp_path: Path) -> None:
    from cast_rl.config import ConfigError
    from cast_rl.pipeline.context import check_critic_base

    with pytest.raises(Exception, match=r"pipeline.critic_base='policy'"):
        load_config(None, ["pipeline.critic_base=policy"])
    cfg = load_config(None, [f"run_dir={tmp_path}", "pipeline.critic_base=warmstart", "pipeline.critic_train_steps=2",
                             "pipeline.stages=[collect,label,critic_data,train_critic]"])
    with pytest.raises(ConfigError, match="pipeline.critic_base=warmstart but .*00_warmstart/model does not exist"):
        check_critic_base(cfg)
    check_critic_base(dataclasses.replace(cfg, pipeline=dataclasses.replace(  # the warm-start runs first
        cfg.pipeline, stages=["warmstart", *cfg.pipeline.stages], warmstart_epochs=1)))
    model = stage_dir(cfg, "warmstart") / "model"  # or ran earlier: the run resumes
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    check_critic_base(cfg)


def test_train_critic_starts_from_the_model_critic_base_names(tmp_path: Path) -> None:
    from launchers.stages import _critic_base

    tiny = tmp_path / "tiny-critic"
    tiny.mkdir()
    (tiny / "config.json").write_text("{}")
    cfg = load_config(None, [f"run_dir={tmp_path}", f"critic.model.path={tiny}"])
    ctx = SimpleNamespace(cfg=cfg, data=SimpleNamespace(data_dir=tmp_path), stage_dir=lambda stage: stage_dir(cfg, stage))
    assert _critic_base(ctx) == tiny
    warm = dataclasses.replace(cfg, pipeline=dataclasses.replace(cfg.pipeline, critic_base="warmstart"))
    ctx.cfg = warm
    with pytest.raises(ValueError, match="critic_base=warmstart trains the critic from the warm-started policy"):
        _critic_base(ctx)
    model = stage_dir(cfg, "warmstart") / "model"
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    assert _critic_base(ctx) == model


@pytest.mark.parametrize(("overrides", "wanted", "size"), [
    (["learner.num_workers=1", "learner.micro_batch_size=1", "learner.global_batch_size=16"], 16, 16),
    (["learner.num_workers=1", "learner.micro_batch_size=1", "learner.global_batch_size=4"], 16, 4),  # the rank's share
    (["learner.num_workers=1", "learner.micro_batch_size=1", "learner.global_batch_size=6"], 4, 3),   # a divisor of it
    (["learner.micro_batch_size=2", "learner.global_batch_size=16", "learner.num_workers=2"], 16, 8),
])
def test_learner_micro_batch_fits_the_rank_share(overrides: list[str], wanted: int, size: int) -> None:
    learner = load_config(None, overrides).learner
    assert learner.with_micro_batch(wanted).micro_batch_size == size


@pytest.mark.parametrize(("key", "expected"), [(None, 1), (16, 16)])
def test_train_critic_packs_its_examples_by_critic_micro_batch_size(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, key: int | None, expected: int,
) -> None:
    """Stage train_critic's learner takes pipeline.critic_micro_batch_size; the policy's stays."""
    import transformers

    import launchers.stages as stages

    class Started(Exception):
        pass

    def learner_group(cfg: Any) -> None:
        raise Started(cfg.learner)

    cfg = load_config(REPO / "configs" / "quickstart.yaml",
                      [f"run_dir={tmp_path}", f"pipeline.critic_micro_batch_size={'null' if key is None else key}"])
    monkeypatch.setattr(stages, "LearnerGroup", learner_group)
    monkeypatch.setattr(stages, "_critic_base", lambda ctx: tmp_path)
    monkeypatch.setattr(stages, "supervised_from_parquet", lambda *a, **k: [None] * 284)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda path: None)
    ctx = SimpleNamespace(cfg=cfg, with_policy=lambda: cfg, policy_path=tmp_path,
                          stage_dir=lambda stage: stage_dir(cfg, stage))
    with pytest.raises(Started) as started:
        stages.train_critic(ctx, tmp_path / "05_train_critic")
    learner = started.value.args[0]
    assert learner.micro_batch_size == expected and learner.lr == cfg.pipeline.critic_lr
    assert cfg.learner.micro_batch_size == 1  # the policy's passes hold one conversation each


def test_bench_blame_filter_trains_its_critics_as_stage_train_critic_does(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    """bench/blame_filter.py's critics train through the stage's own config and phase: the
    critic's learning rate, pipeline.critic_micro_batch_size examples per pass, the schedule and
    the verdict marks (its learner once took neither the packing nor the schedule)."""
    import importlib.util

    import transformers

    import cast_rl.learner.engine as engine
    import cast_rl.learner.loop as loop
    import cast_rl.samples.parquet as parquet

    seen: dict[str, Any] = {}

    class Engine:
        def __init__(self, cfg: Any) -> None:
            seen["cfg"] = cfg

        def save_hf(self, path: Path) -> Path:
            return path

    def phase(learner: Any, samples: list, cfg: Any, log: Any) -> list[float]:
        seen["phase"] = (learner, samples, cfg)
        return [0.0]

    def from_parquet(path: Path, tokenizer: Any, mark_verdict: bool = False) -> list:
        seen["mark_verdict"] = mark_verdict
        return ["example"]

    monkeypatch.setattr(engine, "LearnerEngine", Engine)
    monkeypatch.setattr(loop, "train_critic_phase", phase)
    monkeypatch.setattr(parquet, "supervised_from_parquet", from_parquet)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda path: None)
    spec = importlib.util.spec_from_file_location("_blame_filter", REPO / "bench" / "blame_filter.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    cfg = load_config(REPO / "configs" / "quickstart.yaml", [f"run_dir={tmp_path}", "logging.mode=disabled"])
    bench._train_critic(cfg, tmp_path / "train.parquet", tmp_path / "critic")
    trained = seen["cfg"]
    assert trained.learner.micro_batch_size == cfg.pipeline.critic_micro_batch_size == 16
    assert trained.learner.lr == cfg.pipeline.critic_lr and trained.policy.path == cfg.critic.model.path
    assert seen["phase"][2] is cfg and seen["mark_verdict"] is True


def test_critic_learner_config_without_the_key_keeps_the_learners_passes() -> None:
    from cast_rl.learner.loop import critic_learner_config

    cfg = load_config(REPO / "configs" / "quickstart.yaml", ["pipeline.critic_micro_batch_size=null"])
    critic = critic_learner_config(cfg, "/models/critic")
    assert critic.learner.micro_batch_size == cfg.learner.micro_batch_size == 1
    assert critic.learner.lr == cfg.pipeline.critic_lr != cfg.learner.lr and critic.policy.path == "/models/critic"
    assert cfg.policy.path != "/models/critic"  # a copy: the policy's config is untouched


def test_pipeline_report_labels_critics_and_copies_heldout_metrics(tmp_path: Path) -> None:
    from cast_rl.eval.report import EvalRun, build_report
    from cast_rl.records import Trajectory

    def runs(critic: str) -> list[EvalRun]:
        traj = Trajectory(domain="retail", split="test", task_index=0, trial=0, reward=1.0, policy_version=0,
                          messages=[], token_ids=[], loss_mask=[], logprobs=[])
        return [EvalRun(0, [traj]), EvalRun(1, [traj], critiques=4, critic=critic, unparsable=1)]

    paths = {}
    for stage, critic in (("before", "rule"), ("after", "trained:/run/05_train_critic/model")):
        paths[stage] = tmp_path / f"{stage}.json"
        paths[stage].write_text(json.dumps(build_report(runs(critic))))
    heldout = {"data": "heldout.parquet", "examples": 8, "critics": {
        "trained": {"critic": "/run/05_train_critic/model", "examples": 8, "recall": 0.5, "precision": 1.0,
                    "false_positive_rate": 0.0, "type_accuracy": 0.25, "leakage_rate": 0.1, "unparsable_rate": 0.2}}}
    paths["heldout"] = tmp_path / "heldout_metrics.json"
    paths["heldout"].write_text(json.dumps(heldout))
    written = write_pipeline_report(tmp_path, {"eval_before": paths["before"], "eval_after": paths["after"]}, paths["heldout"])
    report = json.loads(written["report"].read_text())
    labels = [c["label"] for c in report["configurations"]]
    assert labels == ["before: no critic", "before: critic B=1 (rule)", "after: no critic",
                      "after: critic B=1 (trained)"]
    assert report["configurations"][3]["critic_used"] == "trained:/run/05_train_critic/model"
    assert report["configurations"][3]["critic"]["unparsable"] == 1
    assert report["configurations"][3]["critic"]["unparsable_rate"] == 0.25
    assert report["critic_heldout"] == heldout
    summary = written["summary"].read_text()
    assert "## Critic on the held-out split" in summary
    assert "| trained | `/run/05_train_critic/model` | 8 | 0.500 | 1.000 | 0.000 | - | 0.250 | 0.100 | 0.200 |" in summary
    assert any(line.startswith("held-out critic trained") and "recall=0.500" in line for line in headline(report))
