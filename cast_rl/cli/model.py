"""``cast-rl model make-tiny OUT_DIR``: build an offline tiny Qwen3 model and tokenizer."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("model", help="models: build tiny offline models")
    sub = parser.add_subparsers(dest="model_command", required=True)
    tiny = sub.add_parser("make-tiny", help="write a tiny Qwen3 + BPE tokenizer HF directory")
    tiny.add_argument("out_dir")
    tiny.add_argument("--seed", type=int, default=0)
    tiny.add_argument("--vocab-size", type=int, default=4096)
    tiny.add_argument("--hidden-size", type=int, default=128)
    tiny.add_argument("--num-layers", type=int, default=2)
    tiny.add_argument(
        "--corpus",
        action="append",
        default=[],
        help="text files or directories (e.g. a domain data dir) to train the tokenizer on; repeatable",
    )
    tiny.set_defaults(func=_make_tiny)


def _make_tiny(args: argparse.Namespace) -> int:
    from cast_rl.models.tiny import TinyModelSpec, corpus_from_paths, make_tiny_model

    spec = TinyModelSpec(
        vocab_size=args.vocab_size, hidden_size=args.hidden_size, num_layers=args.num_layers
    )
    extra = corpus_from_paths(args.corpus)
    out = make_tiny_model(args.out_dir, spec=spec, seed=args.seed, extra_corpus=extra)
    print(out)
    return 0
