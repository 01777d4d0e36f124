"""The offline tiny model: loads in transformers and vLLM, renders tool chats and parses back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cast_rl.models.chat import parse_assistant, render

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_order_details",
            "description": "Get the status and details of an order.",
            "parameters": {
                "type": "object",
                "properties": {"order_id": {"type": "string"}},
                "required": ["order_id"],
            },
        },
    }
]


def _conversation() -> list[dict]:
    return [
        {"role": "system", "content": "You are a retail agent. Follow the policy."},
        {"role": "user", "content": "Where is my order #W0001?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_0",
                    "type": "function",
                    "function": {"name": "get_order_details", "arguments": {"order_id": "#W0001"}},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_0", "content": '{"status": "pending"}'},
        {"role": "assistant", "content": "Your order #W0001 is pending."},
    ]


def test_tiny_model_directory_loads_in_transformers(tiny_model_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert model.config.head_dim == 64
    ids = tok("hello world", return_tensors="pt").input_ids
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], len(tok))
    assert tok.eos_token == "<|im_end|>"


def test_chat_with_tool_schema_renders_and_parses_back(tiny_model_dir: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    messages = _conversation()
    text = render(tok, messages, tools=TOOLS, add_generation_prompt=True)
    assert json.dumps(TOOLS[0]) in text  # the schema is in the system turn
    assert text.endswith("<|im_start|>assistant\n")
    # The assistant turn with the tool call, cut out of the rendering, parses back to the call.
    start = text.index("<|im_start|>assistant\n") + len("<|im_start|>assistant\n")
    turn = text[start : text.index("<|im_end|>", start)]
    parsed = parse_assistant(turn)
    assert parsed.errors == []
    assert parsed.tool_calls == [{"name": "get_order_details", "arguments": {"order_id": "#W0001"}}]
    assert "<tool_response>\n{\"status\": \"pending\"}\n</tool_response>" in text
    # Tokenising the rendering and decoding it gives the same text (byte-level BPE is lossless).
    ids = tok(text, add_special_tokens=False).input_ids
    assert tok.decode(ids) == text


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ('<tool_call>{"name": "x", "arguments": {</tool_call>', "not valid JSON"),
        ('<tool_call>["x"]</tool_call>', 'string "name"'),
        ('<tool_call>{"name": "x", "arguments": [1]}</tool_call>', "must be a JSON object"),
        ('sure <tool_call>{"name": "x"', "unterminated"),
    ],
)
def test_malformed_tool_calls_are_reported_not_raised(text: str, error: str) -> None:
    parsed = parse_assistant(text)
    assert parsed.tool_calls == []
    assert any(error in e for e in parsed.errors)


def test_arguments_given_as_json_string_are_accepted() -> None:
    parsed = parse_assistant('<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>')
    assert parsed.tool_calls == [{"name": "f", "arguments": {"a": 1}}]


def test_tiny_model_generates_through_vllm(vllm_llm, tiny_model_dir: Path) -> None:
    from transformers import AutoTokenizer
    from vllm import SamplingParams

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    prompt = render(tok, _conversation()[:2], tools=TOOLS, add_generation_prompt=True)
    params = SamplingParams(max_tokens=12, temperature=1.0, seed=1, logprobs=0, ignore_eos=True)
    (out,) = vllm_llm.generate([prompt], params, use_tqdm=False)
    completion = out.outputs[0]
    assert len(completion.token_ids) == 12
    # vLLM holds back a trailing incomplete UTF-8 sequence, which a one-shot decode shows as U+FFFD
    assert completion.text == tok.decode(completion.token_ids, skip_special_tokens=True).rstrip("\ufffd")
    assert tok.decode(tok("<tool_call>x</tool_call>").input_ids, skip_special_tokens=True) == (
        "<tool_call>x</tool_call>"
    )
    assert len(completion.logprobs) == 12
    greedy = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    a, b = vllm_llm.generate([prompt, prompt], greedy, use_tqdm=False)
    assert a.outputs[0].token_ids == b.outputs[0].token_ids
