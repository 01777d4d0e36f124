"""A noisy expert: a teacher policy that solves generated tasks but makes CAST's errors at set rates.

The embedded default warm-starts its tiny policy on demonstrations of this teacher, so that the
policy inherits the mistakes CAST exists to catch and the critic has real errors to stop:

``missing_confirmation``
    runs a write without first listing its details and waiting for a "yes" (policy violation;
    the outcome is unharmed, the policy is not);
``wrong_argument``
    runs a write with an argument the user did not ask for (a cancel with the other reason):
    the task fails unless a critic stops it;
``fabricated_id``
    calls a tool on an id that appears nowhere (one digit of the order id changed): the tool
    rejects it and the teacher retries, a wasted step.

Each episode draws at most one error (probability ``error_rate``, kind uniformly from
``error_kinds``) from a seed derived from the episode, so a trial replays identically.  The
teacher is reactive: every turn it reads the episode's messages (which gold actions ran without
an error, what the user last said, whether a critic just rejected a proposal) and
takes the next step of the task's gold actions, asking the user for identity, for a missing
cancel reason and for confirmation as the policy requires.  Unlike the gold-plan expert
(:mod:`cast_rl.rollout.expert`, whose identity question and call format it shares) it never
uses what the user has not said: it asks for the cancel reason instead of reading it from the
gold action.  After a critique it proposes the
correct step (it never repeats an error), which is what critique-corrected data looks like.

``defers=True`` makes it a teacher that trusts the critic over itself, as instruction-tuned models
told "invalid" tend to: a proposal the critic rejected is not proposed again for the same decision
while an alternative is left.  The one alternative it knows is the other allowed cancel reason,
so a rejected *correct* cancel is revised into a cancel with the reason the user did not give
(the task then fails), while a rejected wrong cancel is still revised into the right one; any
other rejected step has no alternative and is proposed again.  This is how a critic's false
positives harm outcomes (:mod:`cast_rl.eval.net_benefit` measures it); the default teacher,
which repeats a step it knows is right, is immune to them.

It is a :class:`~cast_rl.rollout.policy.ScriptedPolicy`: it reads the messages turn by turn as
the chat template writes them (:func:`~cast_rl.rollout.policy.chat_turns`), decides, and its turn
gets the policy tokenizer's canonical ids.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import re
import zlib
from dataclasses import dataclass
from typing import Any

from cast_rl.critique.verifier import RuleVerifier
from cast_rl.envs.types import RESPOND, Action, Task
from cast_rl.rollout.expert import IDENTITY_QUESTION
from cast_rl.rollout.policy import ScriptedPolicy, chat_turns, tool_call_text
from cast_rl.rollout.runner import EpisodeRunner, EpisodeSpec

ERROR_KINDS = ("missing_confirmation", "wrong_argument", "fabricated_id")
REASON_QUESTION = "What is the reason for the cancellation: no longer needed or ordered by mistake?"
DONE = "Done. Is there anything else I can help you with?"
GOODBYE = "Thank you. Goodbye."
_CALL = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.S)
_CRITIQUE = "VERDICT: invalid"
_OTHER_REASON = {"no longer needed": "ordered by mistake", "ordered by mistake": "no longer needed"}


def draw_error(seed: int, error_rate: float, kinds: tuple[str, ...]) -> str | None:
    """The error an episode will make (or None), reproducible from ``seed``."""
    rng = random.Random(seed)
    if not kinds or rng.random() >= error_rate:
        return None
    return rng.choice(sorted(kinds))


def episode_seed(seed: int, key: tuple[str, int, int]) -> int:
    return zlib.crc32(repr(("noisy-expert", seed, key)).encode()) & 0x7FFFFFFF


def episode_teacher(
    tokenizer: Any, data: Any, key: tuple[str, int, int], seed: int, error_rate: float,
    error_kinds: tuple[str, ...], defers: bool = False,
) -> NoisyExpertPolicy:
    """The noisy teacher of the episode ``key`` (split, task index, trial): its error, if any,
    drawn from the episode's seed, so a rerun or a branch of the episode makes the same one."""
    error = draw_error(episode_seed(seed, key), error_rate, error_kinds)
    return NoisyExpertPolicy(tokenizer, data.task(key[0], key[1]), data.spec.write_tools, error, defers=defers)


@dataclass
class _Seen:
    """What the conversation so far shows."""

    done: int
    """Gold actions that ran without an error, in order."""
    last_role: str
    last_text: str
    critiqued: bool
    """The last message is a critic's rejection."""
    rejected: list[str]
    """The proposals (assistant texts) critics rejected since the last step that ran."""
    asked_reason: bool
    confirmed: str
    """The assistant's last confirmation question, when the user's latest reply is a yes to it
    (a proposal a critic rejected since then does not count as a reply)."""


class NoisyExpertPolicy(ScriptedPolicy):
    """One episode's teacher: the next step of ``task``'s gold actions, with one drawn error."""

    def __init__(
        self, tokenizer: Any, task: Task, write_tools: frozenset[str], error: str | None, defers: bool = False,
    ) -> None:
        if error is not None and error not in ERROR_KINDS:
            raise ValueError(f"error={error!r} is not allowed; choose one of {ERROR_KINDS}")
        self.tokenizer = tokenizer
        self.task = task
        self.write_tools = write_tools
        self.error = error
        self.defers = defers
        self.made_error = False
        self._gold = [a for a in task.actions if a.name != RESPOND]

    # ------------------------------------------------------------------ the policy

    def decide(self, messages: list[dict[str, Any]]) -> str:
        return self.next_turn(messages)

    def next_turn(self, messages: list[dict[str, Any]]) -> str:
        seen = self._read(messages)
        body = self._step(messages, seen)
        if self.defers and body in seen.rejected:
            body = next((alt for alt in self._alternatives(body) if alt not in seen.rejected), body)
        return body

    def _alternatives(self, body: str) -> list[str]:
        """What a deferential teacher proposes instead of a rejected ``body``: a cancel with the
        other allowed reason; nothing for any other step."""
        calls = _CALL.findall(body)
        call = json.loads(calls[0]) if calls else {}
        kwargs = dict(call.get("arguments") or {})
        if call.get("name") != "cancel_pending_order" or kwargs.get("reason") not in _OTHER_REASON:
            return []
        kwargs["reason"] = _OTHER_REASON[kwargs["reason"]]
        return [tool_call_text("cancel_pending_order", kwargs)]

    def _step(self, messages: list[dict[str, Any]], seen: _Seen) -> str:
        if seen.last_role == "system" or (seen.last_role == "user" and seen.done == 0 and not _asked_identity(messages)):
            return IDENTITY_QUESTION
        if seen.done >= len(self._gold):
            return DONE if seen.last_role == "tool" else GOODBYE
        action = self._gold[seen.done]
        if seen.last_role == "tool" and seen.done and self._gold[seen.done - 1].name in self.write_tools:
            return DONE
        if action.name not in self.write_tools:
            return self._call(action, seen)
        if seen.confirmed == _confirmation(action):
            return self._call(action, seen)
        if action.name == "cancel_pending_order" and not seen.asked_reason:
            return self._maybe("missing_confirmation", seen, action) or REASON_QUESTION
        return self._maybe("missing_confirmation", seen, action) or _confirmation(action)

    def _maybe(self, kind: str, seen: _Seen, action: Action) -> str | None:
        """The erroneous turn of ``kind`` when it is this episode's error and not yet made."""
        if self.error != kind or self.made_error or seen.critiqued:
            return None
        self.made_error = True
        if kind == "missing_confirmation":
            return tool_call_text(action.name, action.kwargs)
        kwargs = dict(action.kwargs)
        if kind == "wrong_argument":
            kwargs["reason"] = _OTHER_REASON[kwargs["reason"]]
        else:  # fabricated_id
            kwargs["order_id"] = _change_digit(kwargs["order_id"])
        return tool_call_text(action.name, kwargs)

    def _call(self, action: Action, seen: _Seen) -> str:
        if action.name == "cancel_pending_order":
            wrong = self._maybe("wrong_argument", seen, action)
            if wrong:
                return wrong
        if "order_id" in action.kwargs and action.name == "get_order_details":
            wrong = self._maybe("fabricated_id", seen, action)
            if wrong:
                return wrong
        return tool_call_text(action.name, action.kwargs)

    # ------------------------------------------------------------------ reading the messages

    def _read(self, messages: list[dict[str, Any]]) -> _Seen:
        done, last_role, last_text = 0, "system", ""
        asked_reason = critiqued = False
        rejected: list[str] = []
        pending: str | None = None  # the tool name of the assistant's last call
        confirm_question, confirmed, before = "", "", ("", "")
        for role, text, responses in chat_turns(messages):
            if role == "assistant":
                calls = _CALL.findall(text)
                pending = json.loads(calls[0]).get("name") if calls else None
                before = (last_text, confirmed)
                if not calls:
                    asked_reason |= text == REASON_QUESTION
                    confirm_question = text if text.startswith("I will ") else confirm_question
                last_role, last_text, critiqued, confirmed = "assistant", text, False, ""
                continue
            if responses:
                ok = pending is not None and not responses[0].startswith("Error")
                rejected = []
                if ok and done < len(self._gold) and pending == self._gold[done].name:
                    done += 1
                last_role, last_text, pending = "tool", responses[0], None
                continue
            if role == "user" and text.startswith(_CRITIQUE):  # the proposal never ran
                rejected.append(last_text)
                last_role, critiqued, pending = "user", True, None
                last_text, confirmed = before
                continue
            if role == "user":
                yes = text.lower().startswith("yes") and last_text == confirm_question
                confirmed = confirm_question if yes else ""
                last_role, last_text, critiqued, rejected = "user", text, False, []
        return _Seen(done, last_role, last_text, critiqued, rejected, asked_reason, confirmed)


def _asked_identity(messages: list[dict[str, Any]]) -> bool:
    return any(IDENTITY_QUESTION in (m.get("content") or "") for m in messages)


def _details(action: Action) -> str:
    return f"call {action.name} with {json.dumps(action.kwargs, ensure_ascii=False)}"


def _confirmation(action: Action) -> str:
    return f"I will {_details(action)}. Do you confirm (yes/no)?"


def _change_digit(order_id: str) -> str:
    digits = list(order_id)
    last = len(digits) - 1
    digits[last] = str((int(digits[last]) + 1) % 10)
    return "".join(digits)


def collect_noisy_demonstrations(
    cfg: Any, data: Any, tokenizer: Any, split: str, trials: int, error_rate: float,
    error_kinds: tuple[str, ...], critic_share: float,
) -> list[Any]:
    """``trials`` teacher episodes per task of ``split``, through the real episode runner.

    A ``critic_share`` of the episodes (chosen per episode from its seed) run with the rule critic
    in the loop at budget 1, so the demonstrations hold rejected proposals, critiques and the
    corrected step; the rest show the teacher's errors unchecked.  Each trajectory's ``info``
    records ``teacher_error`` (the drawn kind or None) and whether the critic was on.
    """
    specs = [EpisodeSpec(split, i, t) for i in range(len(data.tasks(split))) for t in range(trials)]
    checked = dataclasses.replace(cfg, critic=dataclasses.replace(cfg.critic, verification_budget=1))
    verifier = RuleVerifier({data.spec.name: data.tools})

    async def one(spec: EpisodeSpec) -> Any:
        teacher = episode_teacher(tokenizer, data, spec.key, cfg.seed, error_rate, error_kinds)
        with_critic = random.Random(episode_seed(cfg.seed, spec.key) + 1).random() < critic_share
        runner = EpisodeRunner(checked if with_critic else cfg, data, teacher, verifier if with_critic else None)
        traj = await runner.run(spec)
        traj.policy_version = -1  # not produced by any policy version
        traj.info.update(demonstration=True, teacher_error=teacher.error, teacher_critic=with_critic)
        return traj

    async def run_all() -> list[Any]:
        return list(await asyncio.gather(*(one(s) for s in specs)))

    return asyncio.run(run_all())
