"""How well the policy's tokenizer fits text it was never built from: tokens per character.

A tokenizer trained on one database's strings (the tiny models' BPE is trained on the training
data, :func:`cast_rl.models.setup.training_corpus`) can split a new database's names and ids
into many more pieces than its own: then a policy that learnt on one database reads another as
a different language.  :func:`tokenizer_fit` measures tokens per character of the training
database's files (db, tasks of the train split) against each unseen database's
(``eval.unseen_seeds``); the pipeline report carries it as ``tokenizer`` with the ratio
unseen / training (1.0: the unseen text is as compact as the training text).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cast_rl.models.tiny import corpus_from_paths


def tokens_per_char(tokenizer: Any, texts: list[str]) -> float:
    """Tokens the tokenizer gives ``texts`` (no special tokens) per character."""
    chars = sum(len(t) for t in texts)
    if not chars:
        raise ValueError("no text to tokenize")
    return sum(len(tokenizer(t, add_special_tokens=False).input_ids) for t in texts) / chars


def tokenizer_fit(tokenizer: Any, train: list[Path], unseen: dict[str, list[Path]]) -> dict[str, Any]:
    """``{"training": tpc, "unseen": {split: tpc}, "unseen_over_training": max ratio}``."""
    base = tokens_per_char(tokenizer, corpus_from_paths(train))
    per_split = {split: tokens_per_char(tokenizer, corpus_from_paths(paths)) for split, paths in unseen.items()}
    return {
        "training": round(base, 4),
        "unseen": {split: round(v, 4) for split, v in per_split.items()},
        "unseen_over_training": round(max(per_split.values()) / base, 4) if per_split else None,
        "text": "database files and task files (JSON)",
    }
