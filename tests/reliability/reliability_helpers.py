"""Shared pieces of the fault-injection tests: a scripted policy, fault triggers, Ray probes.

The scripted policy is a fake, used only where the fault under test is elsewhere (the critic
service, the replay buffer); the rollout-worker test kills workers that run the real vLLM engine.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

from cast_rl.inference.base import Completion, Sampling


def tool_call(name: str, **kwargs: Any) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": kwargs}) + "\n</tool_call>"


class ScriptedPolicy:
    """Answers a prompt holding n assistant turns with ``turns[n]`` (canonical token ids)."""

    def __init__(self, tokenizer: Any, turns: list[str]) -> None:
        self.tokenizer = tokenizer
        self.turns = turns
        self.calls = 0

    async def generate(self, prompt_ids: list[int], sampling: Sampling) -> Completion:
        self.calls += 1
        text = self.tokenizer.decode(prompt_ids, skip_special_tokens=False)
        n = text.count("<|im_start|>assistant\n") - 1
        body = self.turns[min(n, len(self.turns) - 1)]
        ids = self.tokenizer(body, add_special_tokens=False).input_ids
        ids.append(self.tokenizer.convert_tokens_to_ids("<|im_end|>"))
        await asyncio.sleep(0)  # yield to the other episodes, like a real engine
        return Completion(text=body, token_ids=ids, logprobs=[-0.5] * len(ids))


def actor_failures() -> tuple[type[BaseException], ...]:
    from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError

    return (RayActorError, ActorDiedError, ActorUnavailableError)


def num_restarts(handle: Any) -> int:
    """How many times Ray restarted the actor (read from the GCS; no dashboard needed)."""
    import ray._private.state as state

    return int(state.actors(handle._actor_id.hex())["NumRestarts"])


def retry_on_actor_failure(call: Callable[[], Any], deadline_s: float = 120.0) -> Any:
    """``call()`` until the actor behind it answers (a restarting actor fails calls at first).

    A call to a restarting actor blocks until it is up or fails at once; either way the next
    attempt goes out immediately, bounded by the deadline.
    """
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            return call()
        except actor_failures():
            if time.monotonic() > deadline:
                raise


def lost_and_duplicated(requested: list[Any], delivered: list[Any]) -> tuple[int, int]:
    """(samples lost, samples delivered more than once) of a run."""
    lost = len(set(requested) - set(delivered))
    return lost, len(delivered) - len(set(delivered))
