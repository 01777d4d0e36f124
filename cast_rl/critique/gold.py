"""Gold trajectories: a task's gold actions as a policy-abiding OpenAI-style conversation.

:func:`gold_trajectory` turns a task into the conversation a careful agent would have had:

1. the system prompt is the policy; the user opens with the task instruction;
2. the agent asks for the customer's identity, the user supplies it (the values of the task's
   own lookups, or the customer's email / user id from the database) and the agent authenticates
   them as the policy demands (variants: the user's first turn in other words, the identity
   said in it, an airline user id taken as stated with no lookup: :func:`gold_trajectory`);
3. for each gold action: reads that make every argument visible (a value the user never said is
   looked up first, e.g. the order list before an order id), the reads the policy asks for (the
   order's status, the provider's schedule, the reservation), then, for a write, the action's
   details listed with a request for confirmation and the user's "yes", then the call with the
   output of our :class:`~cast_rl.envs.core.ToolEnv`;
4. a closing reply, and the user's stop message.

A terminate tool ends the conversation where it stands, as it ends a live episode.
:class:`ConversationBuilder` is the shared machinery; :mod:`cast_rl.critique.inject` uses it to
build trajectories with deliberate errors.
"""

from __future__ import annotations

import json
import textwrap
from typing import Any

from cast_rl.critique.context import ActionRef, Visible, is_error
from cast_rl.critique.gold_domains import candidate_reads, identity, required_reads
from cast_rl.critique.rules import get_rules
from cast_rl.critique.rules.base import ungrounded
from cast_rl.envs.core import DomainData, ToolEnv, call_tool
from cast_rl.envs.types import RESPOND, STOP_TOKEN, Action
from cast_rl.records import Trajectory

Given = tuple[Action | None, str]
"""How the customer identifies: the call that identifies them (None: a stated id, no lookup)
and the user's words."""
ASK_IDENTITY = (
    "Before I can help, I need to verify your identity. Could you please give me your email "
    "address, or the other identifying details our policy asks for?"
)
YES = "Yes, please proceed."


class ConversationBuilder:
    """Builds one conversation over a live :class:`ToolEnv` of a task."""

    def __init__(self, data: DomainData, split: str, task_index: int) -> None:
        self.data = data
        self.split, self.task_index = split, task_index
        self.env = ToolEnv(data, split, task_index, max_steps=None)
        self.task = self.env.task
        self.rules = get_rules(data.domain)
        self.messages: list[dict[str, Any]] = [{"role": "system", "content": data.policy}]
        self._calls = 0
        self.last_call = -1
        """Message index of the latest tool call."""
        self.consumed = 0
        """Leading gold actions already performed by :meth:`authenticate`."""
        self.ended = False

    # -- raw turns -------------------------------------------------------------------------
    def user(self, text: str) -> None:
        self.messages.append({"role": "user", "content": text})

    def say(self, text: str) -> None:
        self.messages.append({"role": "assistant", "content": text})

    def call(self, action: Action, execute: bool = True) -> str:
        """An assistant tool call and, when executed, the tool message with our env's output."""
        self._calls += 1
        call_id = f"call_{self._calls}"
        self.last_call = len(self.messages)
        self.messages.append({
            "role": "assistant",
            "content": "",
            "tool_calls": [{
                "id": call_id,
                "type": "function",
                "function": {"name": action.name, "arguments": json.dumps(action.kwargs)},
            }],
        })
        if not execute:
            return ""
        observation = call_tool(self.data, self.env.db, action)
        self.env.actions.append(action)
        self.messages.append(
            {"role": "tool", "tool_call_id": call_id, "name": action.name, "content": observation}
        )
        if action.name in self.rules.terminate_tools:
            self.ended = True
        return observation

    # -- policy-abiding steps ----------------------------------------------------------------
    def visible(self) -> Visible:
        return Visible(self.data.policy, self.messages, self.data.tools)

    def missing(self, action: Action) -> list[Any]:
        return [v for _, v in ungrounded(action.name, action.kwargs, self.visible(), self.rules)]

    def reveal(self, action: Action, depth: int = 2) -> None:
        """Look up every argument value of ``action`` the conversation has not shown yet."""
        for value in self.missing(action):
            if self.visible().contains(value):
                continue
            for read in candidate_reads(self.data.domain, self.env.db, self.task.user_id, value):
                trial = self.env.db.fork()
                if _shows(call_tool(self.data, trial, read), value):
                    if depth > 0:
                        self.reveal(read, depth - 1)
                    self.call(read)
                    break

    def authenticate(
        self, gold: list[Action], given: Given | None = None, ask: bool = True
    ) -> None:
        """The identity exchange and the authentication lookup.

        ``given`` replaces the default exchange: the call that identifies the customer (the
        task's own leading lookups are then skipped), or None where the policy takes an id the
        user states with no lookup (airline), and the user's words that give its values.
        ``ask=False``: the user already said them in their first turn; the agent does not ask.
        """
        if given is None and not ask:
            raise ValueError("ask=False needs given: the words that identify the customer")
        if ask:
            self.say(ASK_IDENTITY)
        attempts = []
        for action in gold:
            if action.name not in self.rules.auth_tools:
                break
            attempts.append(action)
        if given is not None:
            if ask:
                self.user(given[1])
            if given[0] is not None:
                self.call(given[0])
                self.consumed = len(attempts)
            return
        own = identity(self.data.domain, self.env.db, self.task.user_id)
        said = [own[1]] if own else []
        said += [_render(a.kwargs, "My details") for a in attempts if own is None or a != own[0]]
        self.user(" ".join(said) or "Here are my details.")
        succeeded = False
        for attempt in attempts:
            succeeded = succeeded or not is_error(self.call(attempt))
        if own is not None and not succeeded:
            self.call(own[0])
        self.consumed = len(attempts)

    def confirm(self, action: Action) -> None:
        """List the write's details and get the user's explicit yes."""
        skip = self.rules.free_text.get(action.name, frozenset()) | self.rules.derived.get(
            action.name, frozenset()
        )
        shown = {k: v for k, v in action.kwargs.items() if k not in skip and not _has_derived(k, skip)}
        self.say(
            f"Here is what I am going to do: {action.name.replace('_', ' ')} with "
            f"{_render(shown, '')}. Do you confirm that I should proceed (yes/no)?"
        )
        self.user(YES)

    def perform(self, action: Action) -> str:
        """Reveal, required reads, confirmation if it writes, then the call."""
        if action.name == RESPOND:
            self.say(str(action.kwargs.get("content", "")))
            return ""
        if self.rules.is_write(action_ref(action)):
            # made even where the tool fails (a provider record that breaks get_provider_details):
            # a careful agent asks all the same, and sees that the tool cannot show it
            for read in required_reads(self.data.domain, self.env.db, self.task.user_id, action):
                if not self._fresh(read):
                    self.reveal(read)
                    self.call(read)
        self.reveal(action)
        if self.rules.is_write(action_ref(action)):
            self.confirm(action)
        return self.call(action)

    def _fresh(self, read: Action) -> bool:
        """Whether the same read already ran since the last write."""
        for record in reversed(self.visible().history):
            if record.name == read.name and record.kwargs == read.kwargs:
                return True
            if self.rules.is_write(action_ref(Action(record.name, record.kwargs))):
                return False
        return False

    def finish(self) -> None:
        if not self.ended:
            visible = self.visible()
            facts = [o for o in self.task.outputs if visible.contains_text(o)]
            summary = f" For your reference: {', '.join(facts)}." if facts else ""
            self.say(f"Everything you asked for has been handled.{summary} Is there anything else?")
        self.user(f"No, that's all. Thank you! {STOP_TOKEN}")

    def trajectory(self, reward: float | None = None) -> Trajectory:
        if reward is None:
            reward = 1.0 if self.env.db.same_state(self.data.gold_db(self.split, self.task_index)) else 0.0
        return Trajectory(
            domain=self.data.domain, split=self.split, task_index=self.task_index, trial=0,
            reward=reward, policy_version=0, messages=self.messages, info={"source": "gold"},
        )


def gold_trajectory(
    data: DomainData,
    split: str,
    task_index: int,
    given: Given | None = None,
    opening: str | None = None,
    ask: bool = True,
) -> Trajectory:
    """The task's gold actions as a policy-abiding conversation (see the module docstring).

    ``given``: the customer identifies themselves this way instead (see
    :meth:`ConversationBuilder.authenticate` and :func:`~cast_rl.critique.gold_domains.identities`).
    ``opening``: the user's first turn (default: "Hi! " and the task instruction).  With
    ``ask=False`` the first turn is ``given``'s words (they open the conversation, the agent does
    not ask who the customer is) and ``opening`` must be None.
    """
    builder = ConversationBuilder(data, split, task_index)
    task = builder.task
    if not ask:
        if given is None or opening is not None:
            raise ValueError("ask=False takes the first turn from given's words; pass given and no opening")
        opening = given[1]
    builder.user(opening if opening is not None else "Hi! " + textwrap.dedent(task.instruction).strip())
    gold = list(task.actions)
    builder.authenticate(gold, given, ask)
    for action in gold[builder.consumed :]:
        if builder.ended:
            break
        builder.perform(action)
    builder.finish()
    return builder.trajectory()


def action_ref(action: Action) -> ActionRef:
    return ActionRef(0, 0, action.name, action.kwargs)


def _shows(output: str, value: Any) -> bool:
    probe = Visible("", [{"role": "tool", "content": output}], [])
    return probe.contains(value)


def _has_derived(key: str, skip: frozenset[str]) -> bool:
    return any(s.startswith(key + ".") for s in skip)


def _render(kwargs: dict[str, Any], lead: str) -> str:
    parts = [f"{k.replace('_', ' ')}: {json.dumps(v) if not isinstance(v, str) else v}"
             for k, v in kwargs.items()]
    body = "; ".join(parts) if parts else "no further details"
    return f"{lead}: {body}." if lead else body
