"""Teacher rewrites pass the leakage check or are discarded (scripted engine: logic only)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from cast_rl.critique.context import iter_actions
from cast_rl.critique.inject import inject
from cast_rl.critique.labeller import Labeller, teacher_items
from cast_rl.critique.teacher import Teacher
from cast_rl.envs.core import load_domain_data
from cast_rl.inference.base import Completion


class _Scripted:
    def __init__(self, answers: list[str]) -> None:
        self.answers, self.prompts = answers, []

    async def chat(self, messages, sampling, tools=None):  # noqa: ANN001, ANN201
        self.prompts.append(messages)
        return Completion(text=self.answers.pop(0))


def test_teacher_keeps_grounded_rewrites_and_discards_the_rest(retail_data_dir: Path) -> None:
    data = load_domain_data("retail", retail_data_dir)
    injected = inject("missing_confirmation", data, "train", 0)
    assert injected is not None
    labels = Labeller(data).label(injected.trajectory, 0)
    items = teacher_items(data, labels, [injected.trajectory])
    (item,) = [it for pos, it in items if labels[pos].message_index == injected.message_index]
    rationale, visible, action, domain = item
    order = action.kwargs.get("order_id") or next(iter(action.kwargs.values()))
    good = (f"VERDICT: invalid\nERROR: policy_violation\nCLAUSE: {rationale.policy_clause}\n"
            f"EXPLANATION: The agent went ahead with {action.name} on {order} before the customer "
            "had said yes to the listed details.\nFIX: Describe the change and wait for a yes.")
    leaky = good.replace("before the customer", "instead of order #W0000001 before the customer")
    answers = [good, leaky, "sure, looks wrong", good.replace("invalid", "valid", 1)]
    teacher = Teacher(_Scripted(answers))
    results = asyncio.run(teacher.rewrite_many([item] * 4, concurrency=1))
    assert results[0] is not None and "went ahead" in results[0].explanation
    assert results[1:] == [None, None, None]
    assert (teacher.stats.rewritten, teacher.stats.discarded) == (1, 3)
    # the teacher saw the visible conversation and the rule-based critique, nothing else
    prompt = teacher.engine.prompts[0][-1]["content"]
    assert "# Rule-based critique" in prompt and action.name in prompt
    assert len(list(iter_actions(visible.messages))) < len(list(iter_actions(injected.trajectory.messages)))
    assert domain == "retail"
