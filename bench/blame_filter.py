"""What ``pipeline.critic_data_blame=filter`` does to the critic's training data and to the trained critic.

Run (from the repo root, after ``make quickstart`` has warm-started the embedded default's policy)::

    .venv/bin/python bench/blame_filter.py [--policy runs/quickstart/00_warmstart/model] [--tasks 16]

    # smoke test without `make quickstart` (tests/bench): the JSON keys, not the figures
    .venv/bin/python bench/blame_filter.py --without-quickstart --tasks 12 --trials 1 --critic-steps 1

The embedded default (``configs/quickstart.yaml``: generated compact retail cancel tasks, the
3M policy warm-started on the noisy teacher, the tiny critic model) in one process, through the
same library calls as the pipeline's stages:

1. *collect*: ``--trials`` episodes per train task (the first ``--tasks``) with the warm-started
   policy (vLLM), no critic, as stage collect (``--without-quickstart``: with the noisy teacher
   that policy is warm-started on instead, its errors at ``pipeline.warmstart_error_rate``, and
   an untrained tiny critic built under ``--out``);
2. *label*: the privileged labeller (stage label);
3. *blame*: verified blame with ``--blame-k`` continuations per invalid label of a failed
   trajectory, with the same policy (``pipeline.blame_k``);
4. *critic data* twice: ``off`` (every label) and ``filter`` (the training split leaves out the
   invalid labels blame checked and did not confirm); the held-out split is the same for both;
5. *train the critic* twice from the same base tiny critic, as stage train_critic does
   (:func:`cast_rl.learner.loop.critic_learner_config` and ``train_critic_phase``: its steps,
   learning rate and schedule, examples per pass, seed) on one in-process learner rank;
6. *held-out metrics* of both trained critics on the one held-out split
   (:func:`cast_rl.eval.critic_heldout.compare_critics`, each critic served by its own vLLM engine).

The held-out false-positive rate counts a wrong ``invalid`` on a valid action; an unparsable answer
is neither, so a critic whose answers are all unparsable scores 0 and the FPR says nothing (the
quickstart's tiny critic after its 8 steps is such a critic; with ``--critic-steps 90
--critic-lr 3e-3`` it answers in its format).  What the filter changes for certain is the training
data, so that is measured too: the invalid training labels whose action is the gold plan's own
next step (:func:`cast_rl.critique.blame.privileged_correction` returns the action itself: the
gold plan calls it valid), i.e. the label precision against the gold plan, before and after the
filter, and how many of the dropped labels were such gold-valid actions.

The last line of stdout is one JSON object: ``heldout_fpr_off``, ``heldout_fpr_filter``,
``heldout_recall_off``, ``heldout_recall_filter``, ``train_examples_off``,
``train_examples_filter``, ``labels_dropped`` and the rest.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policy", default="runs/quickstart/00_warmstart/model",
                        help="the warm-started policy (a policy that makes errors)")
    parser.add_argument("--critic", default="runs/quickstart/models/tiny-critic", help="the base critic model")
    parser.add_argument("--tasks", type=int, default=16, help="train tasks collected")
    parser.add_argument("--trials", type=int, default=2)
    parser.add_argument("--blame-k", type=int, default=1)
    parser.add_argument("--critic-steps", type=int, default=None, help="default: the quickstart's")
    parser.add_argument("--critic-lr", type=float, default=None, help="default: the quickstart's")
    parser.add_argument("--out", default=None, help="work directory (default: a temporary one)")
    parser.add_argument("--without-quickstart", action="store_true",
                        help="collect with the noisy teacher (no policy model) and train a fresh tiny critic built "
                             "under --out: runs without `make quickstart` (smoke runs; the figures then say little)")
    args = parser.parse_args(argv)
    for path in () if args.without_quickstart else (args.policy, args.critic):
        if not (Path(path) / "config.json").exists():
            print(f"{path} holds no model; run `make quickstart` first (or pass --policy/--critic, or "
                  "--without-quickstart)", file=sys.stderr)
            return 2
    out = Path(args.out or tempfile.mkdtemp(prefix="blame-filter-"))
    if args.without_quickstart:
        args.policy, args.critic = str(out / "models" / "tiny-policy"), str(out / "models" / "tiny-critic")
    figures = run(args, out)
    print(json.dumps(figures))
    return 0


def run(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    from cast_rl.config import load_config

    t0 = time.perf_counter()
    fresh = str(args.without_quickstart).lower()  # build the tiny models the quickstart starts from
    cfg = load_config(REPO / "configs" / "quickstart.yaml", [
        f"run_dir={out}", f"policy.path={args.policy}", f"policy.make_tiny_if_missing={fresh}",
        f"critic.model.path={args.critic}", f"critic.model.make_tiny_if_missing={fresh}",
        "env.split=train", "env.task_indices=[]", "logging.mode=disabled",
        f"pipeline.blame_k={args.blame_k}",
        *([f"pipeline.critic_train_steps={args.critic_steps}"] if args.critic_steps else []),
        *([f"pipeline.critic_lr={args.critic_lr}"] if args.critic_lr else []),
    ])
    from cast_rl.envs.setup import load_env_data

    data = load_env_data(cfg)
    if args.without_quickstart:
        from cast_rl.models.setup import ensure_model, ensure_policy_model

        ensure_policy_model(cfg, data)  # its tokenizer is the teacher's
        ensure_model(cfg.critic.model, [data.data_dir])
    tasks = list(range(min(args.tasks, len(data.tasks("train")))))
    figures: dict[str, Any] = {"tasks": len(tasks), "trials": args.trials, "blame_k": args.blame_k,
                               "critic_train_steps": cfg.pipeline.critic_train_steps,
                               "policy": "noisy_expert" if args.without_quickstart else args.policy}
    timings: dict[str, float] = {}

    # 1-3: collect, label, blame (one policy engine for all three)
    start = time.perf_counter()
    collect = _teacher_label_blame if args.without_quickstart else _collect_label_blame
    trajs, labels, records = asyncio.run(collect(cfg, data, tasks, args.trials, out))
    timings["collect_label_blame_s"] = time.perf_counter() - start
    from cast_rl.critique.blame import blame_metrics, confirmed_keys, count_failed, write_blame

    write_blame(out / "blame.jsonl", records)
    blame = blame_metrics(records, count_failed(trajs))
    checked, confirmed = confirmed_keys(out / "blame.jsonl")
    figures.update({
        "episodes": len(trajs), "reward_mean": sum(t.reward for t in trajs) / max(len(trajs), 1),
        "labels": len(labels), "invalid_labels": sum(1 for lab in labels if lab["verdict"] == "invalid"),
        "blame_checked": len(checked), "blame_confirmed": len(confirmed), "blame_precision": blame["blame/precision"],
    })

    # 4: critic data, off and filter
    from cast_rl.critique.datasets import build_critic_data
    from cast_rl.critique.prompt import served_prompt

    data_dirs = {}
    for mode, drop in (("off", set()), ("filter", checked - confirmed)):
        data_dirs[mode] = out / f"critic_data_{mode}"
        summary = build_critic_data(out / "labels.jsonl", out / "collect" / "trajectories.jsonl",
                                    data_dirs[mode], heldout_fraction=cfg.pipeline.critic_heldout_fraction,
                                    seed=cfg.seed, drop_from_train=drop, **served_prompt(cfg.critic))
        figures[f"train_examples_{mode}"] = summary["train"]["examples"]
        figures[f"train_invalid_{mode}"] = summary["train"]["invalid"]
        figures[f"heldout_examples_{mode}"] = summary["heldout"]["examples"]
        if mode == "filter":
            figures["labels_dropped"] = summary.get("dropped_from_train", 0)
    figures.update(_label_precision(data, trajs, labels, data_dirs, checked - confirmed, cfg))

    # 5-6: train the critic twice, the same way; held-out metrics of both
    for mode in ("off", "filter"):
        start = time.perf_counter()
        model = _train_critic(cfg, data_dirs[mode] / "train.parquet", out / f"critic_{mode}")
        timings[f"train_{mode}_s"] = time.perf_counter() - start
        start = time.perf_counter()
        metrics = _heldout(cfg, data, data_dirs["off"] / "heldout.parquet", model)
        timings[f"heldout_{mode}_s"] = time.perf_counter() - start
        for key in ("false_positive_rate", "recall", "unparsable_rate", "precision"):
            short = {"false_positive_rate": "fpr"}.get(key, key)
            figures[f"heldout_{short}_{mode}"] = metrics.get(key)
    figures["timings_s"] = {k: round(v, 1) for k, v in timings.items()}
    figures["wall_s"] = round(time.perf_counter() - t0, 1)
    return figures


async def _collect_label_blame(cfg: Any, data: Any, tasks: list[int], trials: int, out: Path) -> tuple:
    from cast_rl.inference import build_engine
    from cast_rl.rollout.runner import EpisodeRunner, EpisodeSpec

    engine = build_engine(cfg.policy.path, cfg.inference, seed=cfg.seed, dtype=cfg.policy.dtype)
    try:
        runner = EpisodeRunner(cfg, data, engine, None)
        trajs = await runner.run_many([EpisodeSpec("train", i, t) for i in tasks for t in range(trials)])
        return await _label_blame(cfg, data, trajs, lambda _t: runner, out)
    finally:
        await engine.close()


async def _teacher_label_blame(cfg: Any, data: Any, tasks: list[int], trials: int, out: Path) -> tuple:
    """``_collect_label_blame`` with the quickstart's noisy teacher as the policy (its error per
    episode drawn from the episode's seed, as for the warm-start's demonstrations); a blame branch
    continues with the same teacher."""
    from transformers import AutoTokenizer

    from cast_rl.rollout.noisy_expert import episode_teacher
    from cast_rl.rollout.runner import EpisodeRunner, EpisodeSpec

    tok = AutoTokenizer.from_pretrained(cfg.policy.path)
    pipe = cfg.pipeline

    def runner_for(split: str, index: int, trial: int) -> EpisodeRunner:
        teacher = episode_teacher(tok, data, (split, index, trial), cfg.seed, pipe.warmstart_error_rate,
                                  tuple(pipe.warmstart_errors))
        return EpisodeRunner(cfg, data, teacher)

    specs = [EpisodeSpec("train", i, t) for i in tasks for t in range(trials)]
    trajs = list(await asyncio.gather(*(runner_for(*s.key).run(s) for s in specs)))
    return await _label_blame(cfg, data, trajs, lambda t: runner_for(t.split, t.task_index, t.trial), out)


async def _label_blame(cfg: Any, data: Any, trajs: list, runner_for: Any, out: Path) -> tuple:
    """Stage label's privileged labeller, then verified blame with ``runner_for``'s runners."""
    from cast_rl.critique.blame import verify_blame
    from cast_rl.critique.labeller import label_file
    from cast_rl.records import write_trajectories

    path = out / "collect" / "trajectories.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_trajectories(path, trajs)
    labelled, trajs, _ = label_file(data, path, out / "labels.jsonl")
    labels = [lab.to_json() for lab in labelled]
    records = await verify_blame(data, trajs, labels, runner_for, cfg.pipeline.blame_k, cfg.seed)
    return trajs, labels, records


def _label_precision(data: Any, trajs: list, labels: list[dict[str, Any]], data_dirs: dict[str, Path],
                     dropped: set[tuple[int, int]], cfg: Any) -> dict[str, Any]:
    """Invalid training labels on the gold plan's own next step (gold-valid), off and filter."""
    import pyarrow.parquet as pq

    from cast_rl.critique.blame import privileged_correction

    by_key = {(lab["trajectory_index"], lab["message_index"]): lab for lab in labels}

    def gold_valid(key: tuple[int, int]) -> bool:
        correction = privileged_correction(data, trajs[key[0]], key[1])
        return correction is not None and correction.to_json() == by_key[key]["action"]

    out: dict[str, Any] = {}
    for mode, directory in data_dirs.items():
        rows = pq.read_table(directory / "train.parquet", columns=["verdict", "trajectory_index", "message_index"])
        invalid = [(r["trajectory_index"], r["message_index"]) for r in rows.to_pylist() if r["verdict"] == "invalid"]
        wrong = sum(gold_valid(k) for k in invalid)
        out[f"train_invalid_gold_valid_{mode}"] = wrong
        out[f"train_label_precision_{mode}"] = (1 - wrong / len(invalid)) if invalid else None
    out["dropped_gold_valid"] = sum(gold_valid(k) for k in dropped)
    out["dropped_checked_labels"] = len(dropped)
    return out


def _train_critic(cfg: Any, train: Path, out: Path) -> Path:
    import torch
    from transformers import AutoTokenizer

    from cast_rl.learner.engine import LearnerEngine
    from cast_rl.learner.loop import critic_learner_config, train_critic_phase
    from cast_rl.samples.parquet import supervised_from_parquet
    from cast_rl.telemetry import MetricsLogger

    torch.set_num_threads(max(1, int(cfg.learner.num_cpus_per_worker)))
    samples = supervised_from_parquet(train, AutoTokenizer.from_pretrained(cfg.critic.model.path), mark_verdict=True)
    learner = LearnerEngine(critic_learner_config(cfg, cfg.critic.model.path))
    with MetricsLogger(cfg.logging, out) as log:
        train_critic_phase(learner, samples, cfg, log)
    model = learner.save_hf(out / "model")
    del learner
    return model


def _heldout(cfg: Any, data: Any, heldout: Path, model: Path) -> dict[str, Any]:
    from cast_rl.critique.datasets import read_requests
    from cast_rl.critique.service import build_verifier
    from cast_rl.eval.critic_heldout import compare_critics

    tools = {data.spec.name: data.tools}
    critic = dataclasses.replace(cfg.critic, backend="trained", model=dataclasses.replace(
        cfg.critic.model, path=str(model), make_tiny_if_missing=False))

    async def start() -> tuple[Any, str]:
        return build_verifier(critic, tools), str(model)

    rows = read_requests(heldout)
    return asyncio.run(compare_critics({"trained": start}, rows, tools))["trained"]


if __name__ == "__main__":
    sys.exit(main())
