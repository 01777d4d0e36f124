"""A stage run on its own in an existing run directory starts from the policy the run holds at
that point: every finished stage that moves the policy moves it, listed or not
(``launchers.pipeline.run_stages``; before, ``pipeline.stages=[eval_critic]`` on a finished
quickstart evaluated the untrained ``policy.path``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from launchers.pipeline import run_stages


class _Run:
    """The part of a PipelineContext ``run_stages`` uses, over a dict of finished stages."""

    def __init__(self, done: dict[str, dict[str, Any]]) -> None:
        self.finished = dict(done)
        self.policy_path = Path("initial")
        self.seen: dict[str, Path] = {}

    def done(self, stage: str) -> dict[str, Any] | None:
        return self.finished.get(stage)

    def begin(self, stage: str) -> Path:
        return Path(stage)

    def finish(self, stage: str, summary: dict[str, Any]) -> None:
        self.finished[stage] = summary

    def policy_moved(self, path: Path) -> None:
        self.policy_path = path


def _stage(name: str, model: str | None = None) -> Any:
    def run(ctx: _Run, out: Path) -> dict[str, Any]:
        ctx.seen[name] = ctx.policy_path
        if model:
            ctx.policy_path = Path(model)
            return {"model": model}
        return {}
    return run


STAGES = {"warmstart": _stage("warmstart", "00/model"), "eval_critic": _stage("eval_critic"),
          "optimise": _stage("optimise", "07/model"), "eval_after": _stage("eval_after"),
          "optimise_rft": _stage("optimise_rft", "08a/model"), "eval_rft": _stage("eval_rft"),
          "eval_before": _stage("eval_before")}
FINISHED = {"warmstart": {"model": "00/model"}, "eval_before": {}, "optimise": {"model": "07/model"},
            "eval_after": {}, "optimise_rft": {"model": "08a/model"}}


def test_a_stage_run_alone_starts_from_the_policy_the_run_holds_there() -> None:
    run = _Run(FINISHED)
    assert set(run_stages(run, ["eval_critic"], STAGES)) == {"eval_critic"}
    assert run.seen == {"eval_critic": Path("00/model")}  # after the warm-start, before optimise
    run = _Run(FINISHED)
    run_stages(run, ["eval_rft"], STAGES)
    assert run.seen == {"eval_rft": Path("08a/model")}  # the RFT arm's model, not CAST's
    run = _Run({k: v for k, v in FINISHED.items() if k != "optimise_rft"})
    run_stages(run, ["eval_after", "optimise_rft", "eval_rft"], STAGES)  # eval_after done: skipped
    assert run.seen == {"optimise_rft": Path("07/model"), "eval_rft": Path("08a/model")}


def test_a_fresh_run_moves_the_policy_only_through_the_stages_it_runs() -> None:
    run = _Run({})
    run_stages(run, ["eval_before", "eval_critic"], STAGES)
    assert run.seen == {"eval_before": Path("initial"), "eval_critic": Path("initial")}
    run = _Run({})
    summaries = run_stages(run, ["warmstart", "eval_before", "optimise", "eval_after"], STAGES)
    assert list(summaries) == ["warmstart", "eval_before", "optimise", "eval_after"]
    assert run.seen["eval_before"] == Path("00/model") and run.seen["eval_after"] == Path("07/model")
    assert all("wall_s" in s for s in summaries.values())
