"""The engine ``inference.backend=expert`` names: the tokenizer, no model.

The scripted expert itself (:mod:`cast_rl.rollout.expert`) plays per episode; this placeholder
only carries the tokenizer for the runner, so the engine registry needs nothing of the rollout
layer.
"""

from __future__ import annotations

from cast_rl.inference.base import Completion, Sampling


class ExpertPolicy:
    """What ``build_engine`` returns for ``inference.backend=expert``: the tokenizer, no model.

    The runner binds a :class:`cast_rl.rollout.expert.ExpertEngine` per episode
    (:func:`cast_rl.rollout.expert.expert_engine`); this object itself generates nothing.
    """

    def __init__(self, model_path: str) -> None:
        from transformers import AutoTokenizer

        self.model_path = model_path
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)

    async def generate(self, prompt_ids: list[int], sampling: Sampling) -> Completion:
        raise RuntimeError(
            "inference.backend=expert plays per episode: EpisodeRunner binds an ExpertEngine "
            "to each task; this engine generates nothing itself"
        )

    async def chat(self, messages, sampling, tools=None):
        raise NotImplementedError("the expert only serves token prompts")

    async def close(self) -> None:
        return None
