"""The expert policy: plays a task's gold actions through the real episode runner.

``inference.backend=expert`` makes every episode's policy an :class:`ExpertPolicy` for that
episode's task (:class:`GoldExpert`, the policy :func:`cast_rl.rollout.runner.build_policy`
maps the backend to): it asks the user to identify
themselves, then runs the gold actions in order, proposing each write with all its arguments and
asking for an explicit yes first (as every domain policy requires), reports back after it, tells
the user the task's required outputs before a transfer or the closing line, and says goodbye.
It reacts to one thing only: a reply to a confirmation question that is not a yes makes it ask
again (up to ``max_asks`` times in all), after which it skips that write.  Everything else is the
fixed gold plan, so a failure points at the user, the environment or the reward, not the policy.

The expert is a policy of its own, not a model: no engine is started, and ``env.max_steps`` and
``inference.max_model_len`` do not bind it (:func:`expert_limits`).  It reads the episode's
messages (:class:`~cast_rl.rollout.policy.ScriptedPolicy`) and its turns get the policy model's
canonical token ids, so its trajectories and reports are laid out exactly like a model's.  The
supervised warm-start's demonstrations (:mod:`cast_rl.rollout.demonstrations`) are the same
expert.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

from cast_rl.config.schema import CastConfig
from cast_rl.envs.core import DomainData
from cast_rl.envs.types import RESPOND, Task, confirmation_text
from cast_rl.inference.base import Completion, Sampling

# ExpertTokenizer: what build_engine returns for inference.backend=expert (re-exported)
from cast_rl.inference.expert import ExpertTokenizer as ExpertTokenizer
from cast_rl.rollout.episode import EpisodeSpec, EpisodeState, Policy
from cast_rl.rollout.policy import ScriptedPolicy, chat_turns
from cast_rl.rollout.policy import tool_call_text as tool_call_text  # re-exported: the call format

IDENTITY_QUESTION = "Could you give me your email, or your first name, last name and zip code?"
"""The retail (and generated retail) identity question; the warm-start teaches this text."""
IDENTITY_QUESTIONS = {
    "retail": IDENTITY_QUESTION,
    "airline": "Could you give me your user id?",
    "telecom": "Could you give me your email address or phone number so I can find your account?",
    "telehealth": "Could you give me your email, or your full name and date of birth?",
}
ASSISTANT_TURN = "<|im_start|>assistant\n"
_YES = re.compile(
    r"^\W*(yes|yeah|yep|sure|ok|okay|correct|confirm(ed)?)\b|\b(go ahead|please do|please proceed|do it)\b"
)
_NO = re.compile(r"^\W*(no|nope|not)\b|\b(don't|do not|wait|hold on)\b")
EXPERT_STEP_LIMIT = 100
"""Action limit of expert episodes: twice the longest plan with every confirmation asked three
times (51 actions, over the four domains' splits)."""


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


class ScriptPolicy(ScriptedPolicy):
    """A policy that answers the n-th policy turn of an episode with ``turns[n]`` (the last one
    from then on)."""

    def __init__(self, tokenizer: Any, turns: list[str]) -> None:
        self.tokenizer = tokenizer
        self.turns = turns

    def decide(self, messages: list[dict[str, Any]]) -> str:
        n = sum(1 for m in messages if m["role"] == "assistant")
        return self.turns[min(n, len(self.turns) - 1)]


class ExpertPolicy(ScriptedPolicy):
    """One episode's expert: its plan, and how far it got (see the module docstring)."""

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

    def decide(self, messages: list[dict[str, Any]]) -> str:
        return self.next_turn(_last_user_text(messages) if self.asks else "")

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


def _last_user_text(messages: list[dict[str, Any]]) -> str:
    """The text of the last user turn the chat template writes (a user's or critic's message, or
    the tool results of one step); empty when there is none."""
    users = [text for role, text, _ in chat_turns(messages) if role == "user"]
    return users[-1] if users else ""


class GoldExpert:
    """``inference.backend=expert``: each episode is played by the gold-plan expert of its task
    (:func:`expert_policy`), and the run's step and context limits are lifted
    (:func:`expert_limits`).  Only the policy model's tokenizer is needed."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    async def act(self, state: EpisodeState, sampling: Sampling) -> Completion:
        raise RuntimeError("GoldExpert plays per episode: for_episode gives the task's ExpertPolicy")

    def for_episode(self, data: DomainData, spec: EpisodeSpec) -> Policy:
        return expert_policy(self.tokenizer, data.task(spec.split, spec.task_index), data.spec)

    def fork(self) -> Policy:
        return self

    def limits(self, cfg: CastConfig) -> CastConfig:
        return expert_limits(cfg)


def expert_policy(tokenizer: Any, task: Task, spec: Any) -> ExpertPolicy:
    """The expert for one episode of ``task`` in the domain ``spec`` (a DomainSpec)."""
    question = IDENTITY_QUESTIONS.get(spec.name, IDENTITY_QUESTION)
    return ExpertPolicy(tokenizer, expert_plan(task, spec.write_tools, spec.terminate_tools, question))


def expert_limits(cfg: CastConfig) -> CastConfig:
    """``cfg`` with the step and context limits lifted: they bind a model, not the expert."""
    return dataclasses.replace(
        cfg,
        env=dataclasses.replace(cfg.env, max_steps=max(cfg.env.max_steps, EXPERT_STEP_LIMIT)),
        inference=dataclasses.replace(cfg.inference, max_model_len=1 << 24),
    )
