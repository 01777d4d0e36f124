"""A model directory that serves a checkpoint with cast_rl's chat template, weights linked, not copied.

Multi-turn rollouts need a chat template that renders a growing conversation by appending
(:func:`cast_rl.models.chat.check_appends_only`); some checkpoints' own templates rewrite earlier
turns (Qwen3's drops their ``<think>`` blocks).  The rollout worker refuses such a template before
any episode; this writes the directory to use instead::

    cast-rl model retemplate /models/Qwen3-4B /models/Qwen3-4B-cast_rl

Every file of the source is symlinked except the tokenizer's, which are saved anew with
``cast_rl/assets/chat_template.jinja`` (the Hermes/Qwen3 ``<tool_call>`` format, earlier turns
rendered as they were written, thoughts included).
"""

from __future__ import annotations

import json
from pathlib import Path

from cast_rl.models.tiny import chat_template

TOKENIZER_FILES = ("tokenizer", "chat_template", "special_tokens_map", "added_tokens", "vocab", "merges")
"""Name prefixes of the tokenizer's files: saved anew, never linked from the source."""
PROVENANCE_FILE = "cast_rl_retemplate.json"


def retemplate(src: str | Path, dst: str | Path, overwrite: bool = False) -> Path:
    """Write ``dst``: ``src``'s files linked, its tokenizer with cast_rl's chat template."""
    from transformers import AutoTokenizer

    src, dst = Path(src).resolve(), Path(dst)
    if not (src / "config.json").is_file():
        raise FileNotFoundError(f"{src} has no config.json: give a Hugging Face model directory")
    if dst.exists() and any(dst.iterdir()) and not overwrite:
        raise FileExistsError(f"{dst} exists and is not empty; pass --force to replace its files")
    dst.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(src)
    tokenizer.chat_template = chat_template()
    for old in dst.iterdir():  # a replaced directory keeps none of its old links or files
        if old.is_file() or old.is_symlink():
            old.unlink()
    tokenizer.save_pretrained(dst)
    for path in sorted(src.iterdir()):
        if path.is_file() and not path.name.startswith(TOKENIZER_FILES) and not (dst / path.name).exists():
            (dst / path.name).symlink_to(path)
    (dst / PROVENANCE_FILE).write_text(json.dumps({"source": str(src), "chat_template": "cast_rl"}, indent=1))
    return dst
