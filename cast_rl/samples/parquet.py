"""Cross-entropy samples from Parquet datasets: the critic's training data (``04_critic_data``),
or any file of chat prompts and completions."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cast_rl.critique.rationale import verdict_length
from cast_rl.samples import Sample


def supervised_from_parquet(path: str | Path, tokenizer: Any, policy_version: int = 0,
                            mark_verdict: bool = False) -> list[Sample]:
    """Cross-entropy samples from a Parquet file with ``prompt_messages`` and ``completion``.

    ``prompt_messages`` is a JSON string of OpenAI-style messages; the prompt is rendered with the
    model's chat template and a generation prompt, the completion is the assistant's text followed
    by the end-of-turn token, and only the completion's tokens carry loss.  With ``mark_verdict``
    (critic data: every completion a critique in the fixed format) each sample's ``verdict_mask``
    marks the completion tokens that start inside its VERDICT and ERROR lines; the rest, the
    end-of-turn token included, are its explanation.
    """
    import pyarrow.parquet as pq

    table = pq.read_table(path, columns=["prompt_messages", "completion"]).to_pylist()
    eos = tokenizer.eos_token
    out = []
    for i, row in enumerate(table):
        messages = json.loads(row["prompt_messages"])
        prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        p_ids = tokenizer(prompt, add_special_tokens=False).input_ids
        completion = tokenizer(row["completion"] + eos, add_special_tokens=False, return_offsets_mapping=mark_verdict)
        c_ids = completion.input_ids
        ids = p_ids + c_ids
        verdict: list[int] = []
        if mark_verdict:
            try:
                end = verdict_length(row["completion"])
            except ValueError as exc:
                raise ValueError(f"{path}: row {i}: {exc}") from None
            verdict = [0] * len(p_ids) + [int(start < end) for start, _ in completion.offset_mapping]
        out.append(Sample(
            key=f"parquet/{Path(path).name}/{i}", source="supervised", token_ids=ids,
            loss_mask=[0] * len(p_ids) + [1] * len(c_ids), logprobs=[0.0] * len(ids),
            policy_version=policy_version, group=f"parquet/{Path(path).name}", verdict_mask=verdict,
        ))
    return out
