"""A chat template that rewrites earlier turns is refused before any episode, with the fix named;
``cast-rl model retemplate`` writes the directory that fixes it (weights linked, not copied).

The rewriting template below is written for this test: like Qwen3's own, it drops the
``<think>`` block of every assistant turn before the latest user message, so a conversation's
rendering stops extending the previous one once the user speaks again.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
from transformers import AutoTokenizer

from cast_rl.cli import main
from cast_rl.config import load_config
from cast_rl.envs.core import load_domain_data
from cast_rl.models.chat import check_appends_only
from cast_rl.models.retemplate import PROVENANCE_FILE
from cast_rl.models.tiny import chat_template
from cast_rl.rollout.worker import RolloutWorker

REWRITING_TEMPLATE = (
    "{%- set ns = namespace(last_user=0) -%}"
    "{%- for m in messages -%}{%- if m.role == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}"
    "{%- endfor -%}"
    "{%- for m in messages -%}<|im_start|>{{ m.role }}\n"
    "{%- if m.role == 'assistant' and loop.index0 < ns.last_user and '</think>' in m.content -%}"
    "{{ m.content.split('</think>')[-1] }}{%- else -%}{{ m.content }}{%- endif -%}<|im_end|>\n"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_start|>assistant\n{%- endif -%}"
)


@pytest.fixture()
def rewriting_model(tiny_model_dir: Path, tmp_path: Path) -> Path:
    """The session's tiny model with the rewriting template in its tokenizer."""
    src = tmp_path / "rewriting"
    shutil.copytree(tiny_model_dir, src)
    tok = AutoTokenizer.from_pretrained(src)
    tok.chat_template = REWRITING_TEMPLATE
    tok.save_pretrained(src)
    return src


def test_the_project_template_appends_in_every_thinking_mode(tiny_model_dir: Path) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    for thinking in ("off", "keep", "strip"):
        check_appends_only(tok, thinking)


def test_a_template_that_rewrites_earlier_turns_is_refused_with_the_fix(rewriting_model: Path) -> None:
    tok = AutoTokenizer.from_pretrained(rewriting_model)
    check_appends_only(tok, "off")  # without thoughts there is nothing it rewrites
    with pytest.raises(ValueError, match=r"re-renders earlier turns once a user turn follows.*cast-rl model retemplate"):
        check_appends_only(tok, "keep", name=str(rewriting_model))


def test_the_rollout_worker_refuses_it_before_any_episode(rewriting_model: Path, retail_data_dir: Path) -> None:
    cfg = load_config(None, [f"env.data_dir={retail_data_dir}", f"policy.path={rewriting_model}",
                             "inference.thinking=keep"])
    engine = SimpleNamespace(tokenizer=AutoTokenizer.from_pretrained(rewriting_model))
    with pytest.raises(ValueError, match=f"chat template of {rewriting_model} re-renders"):
        RolloutWorker(cfg, load_domain_data("retail", retail_data_dir), engine)


def test_retemplate_links_the_weights_and_writes_the_project_template(rewriting_model: Path, tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture) -> None:
    from transformers import AutoModelForCausalLM

    out = tmp_path / "fixed"
    assert main(["model", "retemplate", str(rewriting_model), str(out)]) == 0
    assert str(out) in capsys.readouterr().out
    weights = out / "model.safetensors"
    assert weights.is_symlink() and weights.resolve() == (rewriting_model / "model.safetensors").resolve()
    assert not any(p.is_symlink() for p in out.iterdir() if p.name.startswith(("tokenizer", "chat_template")))
    tok = AutoTokenizer.from_pretrained(out)
    assert tok.chat_template == chat_template()
    assert tok.get_vocab() == AutoTokenizer.from_pretrained(rewriting_model).get_vocab()
    check_appends_only(tok, "keep")
    assert AutoModelForCausalLM.from_pretrained(out).num_parameters() > 0
    assert (out / PROVENANCE_FILE).is_file()
    with pytest.raises(FileExistsError, match="--force"):
        main(["model", "retemplate", str(rewriting_model), str(out)])
    assert main(["model", "retemplate", str(rewriting_model), str(out), "--force"]) == 0
