"""What ``inference.backend=expert`` builds: the policy model's tokenizer, no model.

The scripted expert (:mod:`cast_rl.rollout.expert`) is a policy, not an engine: the episode
runner maps the backend to :class:`cast_rl.rollout.expert.GoldExpert`, which plays each episode
with its task's expert.  This placeholder only carries the tokenizer to it, so the engine
registry needs nothing of the rollout layer.
"""

from __future__ import annotations


class ExpertTokenizer:
    """What ``build_engine`` returns for ``inference.backend=expert``: the tokenizer, no model;
    it generates nothing (the runner's :class:`~cast_rl.rollout.expert.GoldExpert` plays)."""

    def __init__(self, model_path: str) -> None:
        from transformers import AutoTokenizer

        self.model_path = model_path
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)

    async def close(self) -> None:
        return None
