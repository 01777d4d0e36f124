"""Can a critic model learn its verdicts at all, label kind by label kind?  A verdict-only probe.

Run (from the repo root, after ``make quickstart``: its critic data and the model the critic
starts from)::

    .venv/bin/python bench/critic_verdict_probe.py --data runs/quickstart/04_critic_data \
        --model runs/quickstart/00_warmstart/model [--steps 400 --lrs 3e-4 3e-3 --control-arg reason]

    # smoke test without `make quickstart` (tests/bench): the JSON keys, not the figures
    .venv/bin/python bench/critic_verdict_probe.py --without-quickstart --tasks 12 --steps 2

Stage train_critic teaches the whole critique, and its held-out recall says how much of it
carries; it does not say whether a miss is data the critic has not seen or a decision the model
does not learn even on its own training examples.  This probe trains ``--model`` on the verdict
token alone (cross-entropy over the two tokens where "VERDICT: invalid" and "VERDICT: valid"
part, after the same prompt the served critic reads: the critic data's ``prompt_messages``
through the model's chat template), ``--steps`` steps of ``--batch-size`` examples, once per
learning rate in ``--lrs``, and reads off P(invalid) at four points on both splits, grouped by
what the label says: the invalid examples by their error type and explanation (the labeller's
reason, e.g. "the confirmation request did not name its reason"), the valid ones by the proposed
tool.  A group whose training examples stay at the valid examples' P(invalid) is a decision this
model does not learn in these steps, whatever the data's size.

``--control-arg NAME`` adds a control run per learning rate: the same examples (those whose
proposal has argument NAME), the label replaced by "the proposal's NAME is its most common value"
-- a fact read off one token of the prompt.  Learned where the verdict is not, the model reads the
argument and fails at what the verdict needs of it (on the quickstart: comparing the called
reason with the one the confirmation request named, two messages back).

``--before-verdict`` asks whether writing something before the verdict helps (an answer that
quotes its evidence first): ``evidence`` puts the transcript's last agent line (for a cancel, the
confirmation request naming its reason) as an EVIDENCE line between the prompt and ``VERDICT:``,
``evidence-call`` that line and the proposed action again, teacher-forced.  ``--max-tokens``
keeps only the prompt's last tokens (the instructions and the policy go first).  Measured on the
quickstart's twins data (2026-12-06, 200 steps at 3e-4): ``evidence-call`` stays on the plateau
(a wrong-reason cancel and its valid twin 0.484 / 0.484 on the training split); the prompt cut to
its last 120 tokens leaves it by step 300 (0.961 / 0.059, held-out AUC 1.0 at step 600); so does
a prompt of the last 600 characters of the conversation without the critic's system message
(``critic.system_prompt=false critic.max_prompt_chars=600``, at step 200).

The last line of stdout is one JSON object: ``model``, ``data``, ``train_examples``,
``heldout_examples``, ``steps``, ``batch_size``, ``before_verdict``, ``runs`` (per run, ``verdict@LR`` and
``control@LR``: ``curve`` with each point's ``step``, ``train`` and ``heldout`` groups, each group
``[examples, mean P(invalid), share above 0.5]``, and the final ``train_auc`` and
``heldout_auc``), ``wall_s``.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import re
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

VERDICT = "VERDICT: {}"
BEFORE_VERDICT = ("nothing", "evidence", "evidence-call")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(REPO / "configs" / "quickstart.yaml"),
                        help="without --data: the config whose environment the data is built from")
    parser.add_argument("--data", default=None, help="a critic_data stage directory (train.parquet, heldout.parquet)")
    parser.add_argument("--model", default=None, help="the model the probe trains (default with "
                        "--without-quickstart: the tiny policy built under --out)")
    parser.add_argument("--without-quickstart", action="store_true",
                        help="build the critic data here (noisy-teacher episodes, the privileged labeller)")
    parser.add_argument("--tasks", type=int, default=40, help="without --data: train tasks played")
    parser.add_argument("--trials", type=int, default=2, help="without --data: episodes per task")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lrs", type=float, nargs="+", default=[3e-4, 3e-3])
    parser.add_argument("--max-tokens", type=int, default=3000, help="the prompt's last tokens kept")
    parser.add_argument("--control-arg", default=None, help="a proposal argument for the control runs")
    parser.add_argument("--before-verdict", choices=BEFORE_VERDICT, default="nothing",
                        help="what the answer holds before its verdict (teacher-forced): nothing (the served "
                        "format), the last agent message as an EVIDENCE line, or that line and the proposal again")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="work directory (default: a temporary one)")
    args = parser.parse_args(argv)
    if not args.without_quickstart and not (args.data and args.model):
        parser.error("give --data and --model (a pipeline run's critic data and critic base), or --without-quickstart")
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    out = Path(args.out or tempfile.mkdtemp(prefix="critic-probe-"))
    out.mkdir(parents=True, exist_ok=True)
    print(json.dumps(run(args, out)))
    return 0


def run(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    from transformers import AutoTokenizer

    t0 = time.perf_counter()
    data_dir, model_dir = _inputs(args, out)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    splits = {s: load_examples(data_dir / f"{s}.parquet", tokenizer, args.max_tokens, args.before_verdict)
              for s in ("train", "heldout")}
    control = {s: control_examples(ex, args.control_arg) for s, ex in splits.items()} if args.control_arg else {}
    runs: dict[str, Any] = {}
    for lr in args.lrs:
        runs[f"verdict@{lr:g}"] = probe(model_dir, splits, args, lr)
        if control.get("train"):
            runs[f"control@{lr:g}"] = probe(model_dir, control, args, lr)
    return {"model": str(model_dir), "data": str(data_dir), "train_examples": len(splits["train"]),
            "heldout_examples": len(splits["heldout"]), "steps": args.steps, "batch_size": args.batch_size,
            "before_verdict": args.before_verdict,
            "runs": runs, "wall_s": round(time.perf_counter() - t0, 1)}


def _inputs(args: argparse.Namespace, out: Path) -> tuple[Path, Path]:
    if not args.without_quickstart:
        return Path(args.data), Path(args.model)
    import asyncio

    from bench.blame_filter import _teacher_label_blame
    from cast_rl.config import load_config
    from cast_rl.critique.datasets import build_critic_data
    from cast_rl.critique.prompt import served_prompt
    from cast_rl.envs.setup import load_env_data
    from cast_rl.models.setup import ensure_policy_model

    cfg = load_config(args.config, [f"run_dir={out}", f"policy.path={out / 'models' / 'tiny-policy'}",
                                    "policy.make_tiny_if_missing=true", "env.split=train", "env.task_indices=[]",
                                    "logging.mode=disabled", "pipeline.blame_k=0"])
    data = load_env_data(cfg)
    model = ensure_policy_model(cfg, data)
    tasks = list(range(min(args.tasks, len(data.tasks("train")))))
    asyncio.run(_teacher_label_blame(cfg, data, tasks, args.trials, out))
    build_critic_data(out / "labels.jsonl", out / "collect" / "trajectories.jsonl", out / "critic_data",
                      heldout_fraction=0.5, seed=cfg.seed, **served_prompt(cfg.critic))
    return out / "critic_data", Path(args.model or model)


def load_examples(path: Path, tokenizer: Any, max_tokens: int, before_verdict: str = "nothing") -> list[dict[str, Any]]:
    """Each row: the prompt's ids up to where the two verdicts part, the two verdicts' next
    tokens, the label (1: invalid), its group and the proposal's arguments."""
    import pyarrow.parquet as pq

    examples = []
    for row in pq.read_table(path).to_pylist():
        messages = json.loads(row["prompt_messages"]) if isinstance(row["prompt_messages"], str) else row["prompt_messages"]
        prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        prompt += answer_prefix(messages, before_verdict)
        invalid, valid = (tokenizer.encode(prompt + VERDICT.format(v)) for v in ("invalid", "valid"))
        cut = next(i for i, (a, b) in enumerate(zip(invalid, valid)) if a != b)
        proposal = json.loads(row["request"])["proposal"]
        examples.append({"ids": invalid[:cut][-max_tokens:], "tokens": (invalid[cut], valid[cut]),
                         "label": int(row["verdict"] == "invalid"), "group": group_of(row, proposal),
                         "kwargs": proposal.get("kwargs") or {}})
    return examples


_LINE = re.compile(r"^\[(\d+)\] (\w+)(?: \([^)]*\))?: ", re.M)


def answer_prefix(messages: list[dict[str, str]], before_verdict: str) -> str:
    """What the answer holds before ``VERDICT:`` (``--before-verdict``): the transcript's last
    agent line (as the prompt shows it, aliases and all) quoted as an EVIDENCE line, and with
    ``evidence-call`` the proposed action again.  Read off the critic's user message."""
    if before_verdict == "nothing":
        return ""
    transcript, _, action = messages[-1]["content"].partition("\n\n# Proposed action")
    starts = list(_LINE.finditer(transcript))
    agent = [(m, starts[i + 1].start() if i + 1 < len(starts) else len(transcript))
             for i, m in enumerate(starts) if m.group(2) == "assistant"]
    line = ""
    if agent:
        m, end = agent[-1]
        line = f"EVIDENCE: {m.group(1)} {json.dumps(transcript[m.end():end].strip(), ensure_ascii=False)}\n"
    if before_verdict == "evidence-call":
        line += f"ACTION: {action.split(chr(10), 1)[-1].strip()}\n"
    return line


def group_of(row: dict[str, Any], proposal: dict[str, Any]) -> str:
    """``invalid/<error type>: <explanation>`` or ``valid: <proposed tool>``."""
    from cast_rl.critique.rationale import parse_critique

    if row["verdict"] != "invalid":
        return f"valid: {proposal.get('name')}"
    critique = parse_critique(row["completion"])
    return f"invalid/{row['error_type']}: {critique.explanation if critique else ''}"


def control_examples(examples: list[dict[str, Any]], arg: str) -> list[dict[str, Any]]:
    """The examples whose proposal has ``arg``, labelled 1 where it is the most common value."""
    having = [e for e in examples if arg in e["kwargs"]]
    if not having:
        return []
    common, _ = Counter(json.dumps(e["kwargs"][arg]) for e in having).most_common(1)[0]
    return [{**e, "label": int(json.dumps(e["kwargs"][arg]) == common),
             "group": f"{arg}={'most common' if json.dumps(e['kwargs'][arg]) == common else 'other'}"} for e in having]


def probe(model_dir: Path, splits: dict[str, list[dict[str, Any]]], args: argparse.Namespace, lr: float) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    train = splits["train"]
    points = sorted({round(args.steps * f) for f in (0, 0.25, 0.5, 0.75, 1.0)})
    curve = []
    probs: dict[str, list[float]] = {}
    for step in range(args.steps + 1):
        if step in points:
            probs = {s: p_invalid(model, ex) for s, ex in splits.items()}
            curve.append({"step": step, **{s: groups(probs[s], ex) for s, ex in splits.items()}})
            print(f"lr {lr:g} step {step}: {json.dumps(curve[-1])}", file=sys.stderr, flush=True)  # progress
        if step == args.steps:
            break
        batch = rng.sample(train, min(args.batch_size, len(train)))
        loss = sum(verdict_loss(model, e) for e in batch) / len(batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    final = {s: auc(probs[s], [e["label"] for e in ex]) for s, ex in splits.items()}  # the last point's
    return {"lr": lr, "curve": curve, "train_auc": final["train"], "heldout_auc": final["heldout"]}


def _logits(model: Any, example: dict[str, Any]) -> Any:
    import torch

    out = model(torch.tensor([example["ids"]])).logits[0, -1]
    return out[list(example["tokens"])]


def verdict_loss(model: Any, example: dict[str, Any]) -> Any:
    import torch

    target = torch.tensor([0 if example["label"] else 1])  # index 0: the "invalid" token
    return torch.nn.functional.cross_entropy(_logits(model, example)[None], target)


def p_invalid(model: Any, examples: list[dict[str, Any]]) -> list[float]:
    import torch

    model.eval()
    with torch.no_grad():
        probs = [torch.softmax(_logits(model, e), 0)[0].item() for e in examples]
    model.train()
    return probs


def groups(probs: list[float], examples: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Group -> [examples, mean P(invalid), share of examples above 0.5]."""
    by: dict[str, list[float]] = {}
    for p, e in zip(probs, examples):
        by.setdefault(e["group"], []).append(p)
    return {g: [len(ps), round(sum(ps) / len(ps), 3), round(sum(p > 0.5 for p in ps) / len(ps), 3)]
            for g, ps in sorted(by.items())}


def auc(scores: list[float], labels: list[int]) -> float | None:
    """The probability that an invalid example scores above a valid one (ties: half)."""
    pos = [s for s, y in zip(scores, labels) if y]
    neg = [s for s, y in zip(scores, labels) if not y]
    if not pos or not neg:
        return None
    wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    return round(wins / (len(pos) * len(neg)), 3)


if __name__ == "__main__":
    sys.exit(main())
