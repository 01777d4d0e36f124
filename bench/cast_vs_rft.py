"""CAST against rejection-sampling fine-tuning and outcome GRPO, at equal collection episodes, on unseen databases.

Run (from the repo root)::

    .venv/bin/python bench/cast_vs_rft.py [--seeds 0 1 2] [--out runs/cast_vs_rft]
        [--plot docs/figures/cast_vs_rft.png] [key=value ...]

    # smoke test (tests/bench): one seed at toy sizes; the JSON keys, not the figures
    .venv/bin/python bench/cast_vs_rft.py --seeds 0 --out /tmp/cvr --plot /tmp/cvr/plot.png \
        pipeline.warmstart_epochs=1 eval.unseen_tasks=2 eval.trials=4 ...

Per seed (the run's ``seed``, ``policy.seed`` and ``critic.model.seed``: the tiny models' random
weights, built under ``<out>/seed<k>/models``, and every sampling seed; the training database
stays ``env.generated_seed``), the embedded default (``configs/quickstart.yaml``) runs as
users run it, ``python -m launchers.pipeline``, in a process of its own:

* **CAST and RFT** in one pipeline: the quickstart's stages, whose ``optimise_rft`` arm starts
  from the same warm-started policy with no critic anywhere, collects as many episodes as CAST
  collected after ``02_collect`` and takes as many optimizer steps (:func:`launchers.stages.optimise_rft`);
* **outcome GRPO**: a second pipeline that reuses that run's warm-start and ``01_eval_before``
  (the same starting policy, the same starting figures) and runs only ``optimise`` with
  ``algorithm.samples=[outcome_groups]`` and no critic (``pipeline.collect_budget=0``), one
  collection per step (``algorithm.max_collections_per_step=1``), for as many steps as make
  CAST's episode count (``02_collect`` + ``06_collect_with_critic`` + its GRPO steps' episodes)
  to the nearest collection, at the config's GRPO learning rate (``pipeline.grpo_lr``, else
  ``learner.lr``; pass ``pipeline.grpo_lr=...`` to change it).

Every arm is evaluated without the critic on the unseen databases (``retail/unseen``:
``eval.unseen_seeds``, generated with seeds no stage trains on), before training (shared) and
after.  The plot (``--plot``) shows pass^1 and pass^4 against the collection episodes spent, a
thin line per seed and the mean over seeds per method; ``results.jsonl`` has one line per
(method, seed, point).  CAST - RFT comes from the CAST run's own report: paired over the unseen
tasks, with its 95% interval (:mod:`cast_rl.eval.uncertainty`).

The last line of stdout is one JSON object: ``<method>_pass1_after`` / ``_pass4_after`` (means
over seeds; methods cast, rft, grpo), ``pass1_before``, ``pass4_before``, ``by_seed``,
``episodes_by_method``, ``cast_minus_rft`` (per seed: pass^1 and pass^4 differences with
intervals), ``seeds``, ``plot``, ``results``, ``wall_s``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("WANDB_MODE", "disabled")

METHODS = ("cast", "rft", "grpo")
ARMS = ["pipeline.stages=[warmstart,eval_before,collect,label,critic_data,train_critic,collect_with_critic,"
        "optimise,eval_after,optimise_rft,eval_rft]", "eval.unseen_seeds=[1000,1001]", "eval.unseen_tasks=20",
        "eval.trials=8"]
"""On top of the config: the RFT arm's stages and the unseen databases (overrides given later win)."""
GROUP = "retail/unseen"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(REPO / "configs" / "quickstart.yaml"))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--out", default="runs/cast_vs_rft")
    parser.add_argument("--plot", default=str(REPO / "docs" / "figures" / "cast_vs_rft.png"))
    parser.add_argument("overrides", nargs="*", help="config overrides (key=value) for every run")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    rows: list[dict[str, Any]] = []
    paired: dict[int, Any] = {}
    for seed in args.seeds:
        seed_rows, paired[seed] = run_seed(args, out, seed)
        rows += seed_rows
    (out / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    plot = plot_results(rows, Path(args.plot))
    print(json.dumps(figures(rows, paired, args.seeds, plot, out / "results.jsonl", time.perf_counter() - t0)))
    return 0


def pipeline(config: str, run_dir: Path, overrides: list[str]) -> dict[str, Any]:
    """One ``python -m launchers.pipeline`` run; returns its ``pipeline.json`` and report."""
    log = run_dir.with_suffix(".log")
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "launchers.pipeline", config, f"run_dir={run_dir}", *overrides]
    with log.open("w") as f:
        done = subprocess.run(cmd, cwd=REPO, stdout=f, stderr=subprocess.STDOUT, check=False)
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed (exit {done.returncode}); see {log}")
    result = json.loads((run_dir / "pipeline.json").read_text())
    return {**result, "report_json": json.loads(Path(result["report"]).read_text())}


def run_seed(args: argparse.Namespace, out: Path, seed: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    # The seed's own tiny models (their random weights seeded too): the config's shared path would
    # hand every seed the first one built, or a `make quickstart`'s.
    models = out / f"seed{seed}" / "models"
    common = [f"seed={seed}", f"policy.seed={seed}", f"policy.path={models / 'tiny-policy'}",
              f"critic.model.seed={seed}", f"critic.model.path={models / 'tiny-critic'}", *ARMS, *args.overrides]
    cast_dir = out / f"seed{seed}" / "cast"
    cast = pipeline(args.config, cast_dir, common)
    stages = cast["stages"]
    episodes = {"cast": stages["collect"]["episodes"] + stages["collect_with_critic"]["episodes"]
                + stages["optimise"].get("grpo_episodes", 0),
                "rft": stages["optimise_rft"]["episodes"]}
    # One collection per GRPO step (no dynamic-sampling re-collection: from the warm-start most
    # groups have equal outcomes, and re-collecting them took the arm to 608 episodes where CAST
    # spent 224), so the arm's cost is steps x one collection, the nearest to CAST's episodes.
    per_collection = collection_episodes(args.config, common)
    grpo_steps = max(1, round(episodes["cast"] / per_collection))
    grpo_dir = out / f"seed{seed}" / "grpo"
    for stage in ("00_warmstart", "01_eval_before"):  # the same start: skipped, not rerun
        if not (grpo_dir / stage).exists():
            shutil.copytree(cast_dir / stage, grpo_dir / stage)
    grpo = pipeline(args.config, grpo_dir, [
        *common, "pipeline.stages=[warmstart,eval_before,optimise,eval_after]", "algorithm.samples=[outcome_groups]",
        f"algorithm.steps={grpo_steps}", "algorithm.max_collections_per_step=1", "pipeline.collect_budget=0",
        "critic.backend=rule",
        "eval.verification_budgets=[0]"])
    episodes["grpo"] = grpo["stages"]["optimise"].get("grpo_episodes", 0)
    before = _passk(cast["report_json"], "before_no_critic")
    rows = [{"method": m, "seed": seed, "point": "before", "episodes": 0, **before} for m in METHODS]
    for method, report, name in (("cast", cast, "after_no_critic"), ("rft", cast, "rft_no_critic"),
                                 ("grpo", grpo, "after_no_critic")):
        rows.append({"method": method, "seed": seed, "point": "after", "episodes": episodes[method],
                     **_passk(report["report_json"], name)})
    comparison = next((c for c in cast["report_json"]["comparisons"]
                       if c["kind"] == "CAST - RFT" and c["a"] == "after_no_critic" and c["group"] == GROUP), None)
    diff = {k: comparison["pass^k"][k] for k in ("pass^1", "pass^4") if comparison and k in comparison["pass^k"]}
    return rows, diff


def collection_episodes(config: str, overrides: list[str]) -> int:
    """Episodes one GRPO collection of that config runs: tasks per step x trials per task."""
    from cast_rl.config import load_config
    from cast_rl.learner.loop import tasks_per_step

    cfg = load_config(config, overrides)
    return tasks_per_step(cfg) * cfg.rollout.trials_per_task


def _passk(report: dict[str, Any], name: str) -> dict[str, float]:
    config = next(c for c in report["configurations"] if c["name"] == name)
    passk = config["groups"][GROUP]["pass^k"]
    return {"pass1": passk["pass^1"], "pass4": passk.get("pass^4", float("nan")),
            "tasks": config["groups"][GROUP]["tasks"]}


def plot_results(rows: list[dict[str, Any]], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    colours = {"cast": "tab:blue", "rft": "tab:orange", "grpo": "tab:green"}
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharex=True)
    for ax, metric in zip(axes, ("pass1", "pass4"), strict=True):
        for method in METHODS:
            mine = [r for r in rows if r["method"] == method]
            for seed in sorted({r["seed"] for r in mine}):
                line = [r for r in mine if r["seed"] == seed]
                ax.plot([r["episodes"] for r in line], [r[metric] for r in line], color=colours[method], alpha=0.3,
                        linewidth=0.8)
            points = [[r for r in mine if r["point"] == p] for p in ("before", "after")]
            ax.plot([statistics.fmean(r["episodes"] for r in p) for p in points],
                    [statistics.fmean(r[metric] for r in p) for p in points], color=colours[method], linewidth=2,
                    marker="o", label=method.upper() if method != "grpo" else "outcome GRPO")
        ax.set_xlabel("collection episodes after the warm-start")
        ax.set_ylabel(f"pass^{metric[-1]} on unseen databases")
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle("CAST vs RFT vs outcome GRPO at equal collection episodes (mean over seeds; thin: one seed)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def figures(rows: list[dict[str, Any]], paired: dict[int, Any], seeds: list[int], plot: Path, results: Path,
            wall_s: float) -> dict[str, Any]:
    after = {m: [r for r in rows if r["method"] == m and r["point"] == "after"] for m in METHODS}
    before = [r for r in rows if r["method"] == "cast" and r["point"] == "before"]
    out: dict[str, Any] = {f"{m}_{k}_after": round(statistics.fmean(r[k] for r in after[m]), 4)
                           for m in METHODS for k in ("pass1", "pass4")}
    out.update({f"{k}_before": round(statistics.fmean(r[k] for r in before), 4) for k in ("pass1", "pass4")})
    out["by_seed"] = {str(s): {m: {k: next(r[k] for r in after[m] if r["seed"] == s) for k in ("pass1", "pass4")}
                               for m in METHODS} for s in seeds}
    out["episodes_by_method"] = {m: [r["episodes"] for r in after[m]] for m in METHODS}
    out["cast_minus_rft"] = {str(s): paired[s] for s in seeds}
    out.update({"unseen_tasks": before[0]["tasks"], "seeds": seeds, "plot": str(plot), "results": str(results),
                "wall_s": round(wall_s, 1)})
    return out


if __name__ == "__main__":
    sys.exit(main())
