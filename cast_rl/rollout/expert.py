"""The expert policy: plays a task's gold actions through the real episode runner.

``inference.backend=expert`` makes every episode's policy an :class:`ExpertEngine` for that
episode's task (see :meth:`cast_rl.rollout.runner.EpisodeRunner.run`): it asks the user to identify
themselves, then runs the gold actions in order, proposing each write with all its arguments and
asking for an explicit yes first (as every domain policy requires), reports back after it, tells
the user the task's required outputs before a transfer or the closing line, and says goodbye.
It reacts to one thing only: a reply to a confirmation question that is not a yes makes it ask
again (up to ``max_asks`` times in all), after which it skips that write.  Everything else is the
fixed gold plan, so a failure points at the user, the environment or the reward, not the policy.

The expert is a policy of its own, not a model: no engine is started, and ``env.max_steps`` and
``inference.max_model_len`` do not bind it (:func:`expert_limits`).  It still produces token ids
(through the policy model's tokenizer, as :class:`~cast_rl.rollout.tokens.ConversationTokens`
needs them), so its trajectories and reports are laid out exactly like a model's.  The
supervised warm-start's demonstrations (:mod:`cast_rl.rollout.demonstrations`) are the same
expert.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from dataclasses import dataclass
from typing import Any

from cast_rl.config.schema import CastConfig
from cast_rl.envs.types import RESPOND, Task, confirmation_text
from cast_rl.inference.base import Completion, Sampling
from cast_rl.inference.expert import ExpertPolicy as ExpertPolicy  # the engine build_engine returns

IDENTITY_QUESTION = "Could you give me your email, or your first name, last name and zip code?"
"""The retail (and generated retail) identity question; the warm-start teaches this text."""
IDENTITY_QUESTIONS = {
    "retail": IDENTITY_QUESTION,
    "airline": "Could you give me your user id?",
    "telecom": "Could you give me your email address or phone number so I can find your account?",
    "telehealth": "Could you give me your email, or your full name and date of birth?",
}
ASSISTANT_TURN = "<|im_start|>assistant\n"
_USER_TURN = "<|im_start|>user\n"
_END = "<|im_end|>"
_YES = re.compile(
    r"^\W*(yes|yeah|yep|sure|ok|okay|correct|confirm(ed)?)\b|\b(go ahead|please do|please proceed|do it)\b"
)
_NO = re.compile(r"^\W*(no|nope|not)\b|\b(don't|do not|wait|hold on)\b")
EXPERT_STEP_LIMIT = 100
"""Action limit of expert episodes: twice the longest plan with every confirmation asked three
times (51 actions, over the four domains' splits)."""


def tool_call_text(name: str, arguments: dict[str, Any]) -> str:
    """A tool call exactly as the chat template renders it."""
    payload = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"<tool_call>\n{payload}\n</tool_call>"


@dataclass(frozen=True)
class ExpertTurn:
    """One planned policy turn: ``say`` a message, ``confirm`` a write, or ``call`` a tool."""

    kind: str
    text: str


def expert_plan(
    task: Task,
    write_tools: frozenset[str],
    terminate_tools: tuple[str, ...] = (),
    identity_question: str = IDENTITY_QUESTION,
) -> list[ExpertTurn]:
    """The expert's planned turns for ``task`` (see the module docstring)."""
    turns = [ExpertTurn("say", identity_question)]
    outputs = ""
    if task.outputs:
        outputs = "Here is what I found: " + "; ".join(task.outputs) + "."
    for action in task.actions:
        if action.name == RESPOND:
            turns.append(ExpertTurn("say", str(action.kwargs.get("content", ""))))
            continue
        if action.name in terminate_tools and outputs:
            turns.append(ExpertTurn("say", outputs))
            outputs = ""
        if action.name in write_tools:
            turns.append(ExpertTurn("confirm", confirmation_text(action.name, action.kwargs)))
        turns.append(ExpertTurn("call", tool_call_text(action.name, action.kwargs)))
        if action.name in write_tools:
            turns.append(ExpertTurn("say", "Done. Is there anything else I can help you with?"))
    if outputs:
        turns.append(ExpertTurn("say", outputs))
    turns.append(ExpertTurn("say", "Thank you. Goodbye."))
    return turns


def expert_script(task: Task, write_tools: frozenset[str]) -> list[str]:
    """The expert's turns for a task, in order, when every confirmation gets a yes."""
    return [turn.text for turn in expert_plan(task, write_tools)]


def is_affirmative(reply: str) -> bool:
    """Whether a user's reply to a confirmation question says yes: it opens with a yes word or
    says "go ahead" (so "Are you sure?" is not a yes), and has no no, wait or hold on."""
    text = reply.lower()
    return bool(_YES.search(text)) and not _NO.search(text)


def _encode(tokenizer: Any, body: str, eos: int) -> Completion:
    ids = [*tokenizer(body, add_special_tokens=False).input_ids, eos]
    return Completion(text=body, token_ids=ids, logprobs=[0.0] * len(ids))


class ScriptEngine:
    """An engine that answers the n-th policy turn of a prompt with ``turns[n]`` (canonical ids)."""

    writes_real_ids = True
    """It reads and writes real identifiers (see :mod:`cast_rl.models.aliases`)."""

    def __init__(self, tokenizer: Any, turns: list[str]) -> None:
        self.tokenizer = tokenizer
        self.turns = turns
        self._eos = tokenizer.convert_tokens_to_ids(tokenizer.eos_token)

    async def generate(self, prompt_ids: list[int], sampling: Sampling) -> Completion:
        text = self.tokenizer.decode(prompt_ids, skip_special_tokens=False)
        n = text.count(ASSISTANT_TURN) - 1
        return _encode(self.tokenizer, self.turns[min(n, len(self.turns) - 1)], self._eos)

    async def chat(self, messages, sampling, tools=None):
        raise NotImplementedError("ScriptEngine only serves token prompts")

    async def close(self) -> None:
        return None


class ExpertEngine:
    """One episode's expert: its plan, and how far it got (see the module docstring)."""

    writes_real_ids = True
    """It reads and writes real identifiers (see :mod:`cast_rl.models.aliases`)."""

    def __init__(self, tokenizer: Any, plan: list[ExpertTurn], max_asks: int = 3) -> None:
        if max_asks < 1:
            raise ValueError(f"max_asks={max_asks!r} is not allowed; it must be >= 1")
        self.tokenizer = tokenizer
        self.plan = plan
        self.max_asks = max_asks
        self.position = 0
        """Index in ``plan`` of the turn the expert gives next."""
        self.asks = 0
        """Times the pending confirmation question has been asked."""
        self.skipped_writes = 0
        self._eos = tokenizer.convert_tokens_to_ids(tokenizer.eos_token)

    def _last_user_text(self, prompt_ids: list[int]) -> str:
        text = self.tokenizer.decode(prompt_ids, skip_special_tokens=False)
        start = text.rfind(_USER_TURN)
        if start < 0:
            return ""
        body = text[start + len(_USER_TURN):]
        return body.split(_END, 1)[0]

    def next_turn(self, last_reply: str) -> str:
        """The next turn's text, given the last message the policy received."""
        if self.asks:  # the previous turn asked for a confirmation
            if is_affirmative(last_reply):
                self.asks = 0
                self.position += 1  # on to the call
            elif self.asks < self.max_asks:
                self.asks += 1
                return self.plan[self.position].text
            else:  # no consent: skip the call and the report after it
                self.asks = 0
                self.skipped_writes += 1
                self.position += 3 if self._reports_after(self.position + 1) else 2
                return self._emit("I understand; I will not make that change.")
        return self._emit()

    def _reports_after(self, call_index: int) -> bool:
        after = call_index + 1
        return after < len(self.plan) and self.plan[after].text.startswith("Done.")

    def _emit(self, text: str | None = None) -> str:
        if text is not None:
            return text
        turn = self.plan[min(self.position, len(self.plan) - 1)]
        if turn.kind == "confirm":
            self.asks = 1
        else:
            self.position += 1
        return turn.text

    async def generate(self, prompt_ids: list[int], sampling: Sampling) -> Completion:
        body = self.next_turn(self._last_user_text(prompt_ids) if self.asks else "")
        return _encode(self.tokenizer, body, self._eos)

    async def chat(self, messages, sampling, tools=None):
        raise NotImplementedError("the expert only serves token prompts")

    def fork(self) -> ExpertEngine:
        """A copy with its own progress (a counterfactual branch continues from it)."""
        return copy.copy(self)

    async def close(self) -> None:
        return None


def expert_engine(tokenizer: Any, task: Task, spec: Any) -> ExpertEngine:
    """The expert for one episode of ``task`` in the domain ``spec`` (a DomainSpec)."""
    question = IDENTITY_QUESTIONS.get(spec.name, IDENTITY_QUESTION)
    return ExpertEngine(tokenizer, expert_plan(task, spec.write_tools, spec.terminate_tools, question))


def expert_limits(cfg: CastConfig) -> CastConfig:
    """``cfg`` with the step and context limits lifted: they bind a model, not the expert."""
    return dataclasses.replace(
        cfg,
        env=dataclasses.replace(cfg.env, max_steps=max(cfg.env.max_steps, EXPERT_STEP_LIMIT)),
        inference=dataclasses.replace(cfg.inference, max_model_len=1 << 24),
    )
