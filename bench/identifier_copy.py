"""Can a policy trained from scratch copy an identifier it never saw?  Frozen vs trainable rows.

    .venv/bin/python bench/identifier_copy.py [--steps 200] [--eval-every 25] [--tasks 150] [--heldout 200]

    # smoke test (tests/bench): the JSON keys, not the figures
    .venv/bin/python bench/identifier_copy.py --steps 2 --eval-every 1 --batch 4 --tasks 20 --heldout 16

The embedded default's tiny policy must put the order id the customer typed into its tool calls.
With ``policy.tiny.whole_tokens`` every order id, user id and e-mail of the generated database is
one token, so copying is one attention lookup.  Two tiny Qwen3 models, identical but for
``policy.tiny.freeze_whole_tokens``, are trained through the real learner (:class:`LearnerEngine`,
one gloo rank) on the same copy drills cut in the domain's format: a customer names an order
(``Hi! I'd like to cancel order #W...``), some conversation follows, and the agent's
``get_order_details`` call must carry that id.  Drills use the order ids of 80% of the database;
accuracy (greedy next token == the id) is measured on drills with the other 20%, ids neither
model was trained on.

With trainable rows the loss falls by memorising the training ids and held-out accuracy stays at
0; with frozen rows the only way to produce an id is to copy it, and the copy carries over to
unseen ids.  The last stdout line is one JSON object with ``heldout_copy_acc_frozen``,
``heldout_copy_acc_trainable`` (at the last step), ``steps_to_90pct_frozen`` /
``steps_to_90pct_trainable`` (first evaluation at >= 0.9; null if never) and the curves.
"""

from __future__ import annotations

import argparse
import atexit
import json
import random
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

WHOLE_TOKENS = [r"#W\d{7}", r"\b[a-z]+_[a-z]+_\d{4}\b", r"[\w.]+@example\.com"]
FILLER = [
    "Could you give me your email, or your first name, last name and zip code?",
    "My name is Tara Haddad and my zip code is 37297.",
    "What is the reason for the cancellation: no longer needed or ordered by mistake?",
    "Because I no longer need it.",
]


def drill(tok, order_id: str, rng: random.Random) -> list[int]:
    """A conversation whose last token is the agent copying ``order_id`` into its call."""
    messages = [{"role": "user", "content": f"Hi! I'd like to cancel order {order_id}."}]
    for i in range(rng.randint(0, len(FILLER))):
        messages.append({"role": "assistant" if i % 2 == 0 else "user", "content": FILLER[i]})
    if messages[-1]["role"] == "assistant":
        messages.append({"role": "user", "content": "Sure."})
    prompt = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    call = '<tool_call>\n{"name": "get_order_details", "arguments": {"order_id": "'
    return tok(prompt + call)["input_ids"] + [tok.convert_tokens_to_ids(order_id)]


def run(model_dir: Path, run_dir: Path, train_ids: list[str], test: list[list[int]], steps: int, every: int,
        batch: int, lr: float, seed: int) -> list[tuple[int, float, float]]:
    from transformers import AutoTokenizer

    from cast_rl.config import load_config
    from cast_rl.learner.engine import LearnerEngine
    from cast_rl.learner.sample import Sample

    cfg = load_config(None, [f"policy.path={model_dir}", f"run_dir={run_dir}", f"learner.lr={lr}",
                             "logging.mode=disabled", "learner.checkpoint_every=null", f"learner.seed={seed}", "learner.num_workers=1",
                             f"learner.micro_batch_size={batch}", f"learner.global_batch_size={batch}"])
    engine = LearnerEngine(cfg)
    tok = AutoTokenizer.from_pretrained(model_dir)
    rng = random.Random(seed)
    curve = []
    for step in range(steps + 1):
        if step % every == 0:
            curve.append((step, accuracy(engine.model, test), float("nan")))
        if step == steps:
            break
        seqs = [drill(tok, rng.choice(train_ids), rng) for _ in range(batch)]
        out = engine.train_step([Sample(f"d{step}-{i}", "supervised", s, [0] * (len(s) - 1) + [1], [0.0] * len(s))
                                 for i, s in enumerate(seqs)])
        if step % every == 0:
            curve[-1] = (step, curve[-1][1], out["supervised_loss"])
    return curve


@torch.no_grad()
def accuracy(model: torch.nn.Module, test: list[list[int]]) -> float:
    model.eval()
    hits = 0
    for seq in test:
        logits = model(input_ids=torch.tensor([seq[:-1]])).logits[0, -1]
        hits += int(logits.argmax()) == seq[-1]
    model.train()
    return hits / len(test)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--eval-every", type=int, default=25)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tasks", type=int, default=150, help="generated cancel tasks (their database holds the ids)")
    parser.add_argument("--heldout", type=int, default=200, help="held-out drills at most")
    args = parser.parse_args()
    torch.set_num_threads(2)

    from transformers import AutoTokenizer

    from cast_rl.config.schema import TinyConfig
    from cast_rl.envs.generate import write_retail
    from cast_rl.models.tiny import corpus_from_paths, make_tiny_model

    tmp = Path(tempfile.mkdtemp(prefix="identifier-copy-"))
    atexit.register(shutil.rmtree, tmp, True)  # models and runs of this bench only
    data = tmp / "retail"
    write_retail(data, seed=0, num_tasks=args.tasks, kinds=("cancel",), compact=True)
    corpus = corpus_from_paths([data])
    results, t0 = {}, time.perf_counter()
    for frozen in (True, False):
        name = "frozen" if frozen else "trainable"
        spec = TinyConfig(whole_tokens=WHOLE_TOKENS, freeze_whole_tokens=frozen)
        model_dir = make_tiny_model(tmp / name, spec, seed=args.seed, extra_corpus=corpus)
        tok = AutoTokenizer.from_pretrained(model_dir)
        orders = sorted(t for t in tok.get_vocab() if re.fullmatch(WHOLE_TOKENS[0], t))
        random.Random(args.seed).shuffle(orders)
        cut = int(0.8 * len(orders))
        rng = random.Random(args.seed + 1)
        test = [drill(tok, order_id, rng) for order_id in orders[cut:][:args.heldout]]
        curve = run(model_dir, tmp / f"run-{name}", orders[:cut], test, args.steps, args.eval_every, args.batch,
                    args.lr, args.seed)
        for step, acc, loss in curve:  # the last evaluation has no step after it
            shown = "-" if loss != loss else f"{loss:.3f}"
            print(f"{name:9s} step {step:4d}  held-out copy accuracy {acc:.3f}  drill loss {shown}", flush=True)
        results[name] = {"curve": [[s, a] for s, a, _ in curve], "orders_train": cut, "orders_heldout": len(test)}
    summary = {
        "heldout_copy_acc_frozen": results["frozen"]["curve"][-1][1],
        "heldout_copy_acc_trainable": results["trainable"]["curve"][-1][1],
        "steps_to_90pct_frozen": next((s for s, a in results["frozen"]["curve"] if a >= 0.9), None),
        "steps_to_90pct_trainable": next((s for s, a in results["trainable"]["curve"] if a >= 0.9), None),
        "steps": args.steps, "batch": args.batch, "lr": args.lr,
        "curve_frozen": results["frozen"]["curve"], "curve_trainable": results["trainable"]["curve"],
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
