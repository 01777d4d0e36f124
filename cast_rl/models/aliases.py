"""Per-conversation aliases for identifiers: what a policy too small to copy them sees instead.

A model pretrained on the web copies a 7-digit order id from the user's message into a tool call
without effort; a policy of a few million parameters trained from scratch on a laptop does not
(``bench/identifier_copy.py`` and docs/quickstart.md, "Why aliases", give the measurements).  This is the
delexicalisation that task-oriented dialogue systems have used since before pretraining: every
identifier matching one of ``policy.entity_aliases``'s patterns is shown to the policy as
``[<label>_<n>]``, numbered by first appearance in the conversation (the order the user names
first is ``[order_1]``), and the aliases in the policy's own turns are mapped back before anything
runs.

Only what the policy model reads and writes changes:

* messages, trajectories, the environment, the user, the critic and the labeller keep the real
  identifiers; :class:`~cast_rl.rollout.tokens.ConversationTokens` applies the aliases when it
  renders the conversation, so ``token_ids`` (what the learner trains on) are exactly what the
  policy saw and wrote;
* the table is a function of the messages (first appearance, in message order), so every
  rendering of a conversation's prefix agrees with the longer one and nothing needs storing;
* aliases name only identifiers the conversation has shown (in a system, user or tool message):
  an identifier that first appears in an assistant turn (a scripted teacher that knows the gold
  plan names an order the user never gave) stays real in that turn, so it reaches the tool as
  written, and the alias it gets once a tool shows it is never one that has to be mapped back;
* an alias the table cannot map back (``[order_5]`` when one order was named) never reaches a
  tool or the user: the turn becomes an error observation, like a malformed call
  (:meth:`EntityAliases.unmapped`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

ALIAS_TOKENS_PER_LABEL = 8
"""Aliases per label the tiny policy's tokenizer holds as single tokens (more still work, as text)."""


def alias(label: str, n: int) -> str:
    return f"[{label}_{n}]"


def alias_tokens(labels: list[str] | tuple[str, ...]) -> list[str]:
    """The aliases a tokenizer should keep whole: ``[<label>_1]`` .. ``[<label>_8]`` per label."""
    return [alias(label, n) for label in labels for n in range(1, ALIAS_TOKENS_PER_LABEL + 1)]


@dataclass
class AliasTable:
    """Real identifier <-> alias, for one conversation prefix."""

    to_alias: dict[str, str] = field(default_factory=dict)
    to_real: dict[str, str] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)

    def name(self, label: str, value: str) -> str:
        """The alias of ``value`` (a new one on its first appearance)."""
        found = self.to_alias.get(value)
        if found is None:
            n = self.counts.get(label, 0) + 1
            self.counts[label] = n
            found = self.to_alias[value] = alias(label, n)
            self.to_real[found] = value
        return found


class EntityAliases:
    """Applies ``policy.entity_aliases`` (label -> regular expression, checked by the config) to
    conversations."""

    def __init__(self, patterns: Mapping[str, str]) -> None:
        self.labels = tuple(patterns)
        self._find = re.compile("|".join(f"(?P<{label}>{p})" for label, p in patterns.items()))
        self._alias = re.compile(r"\[(" + "|".join(map(re.escape, self.labels)) + r")_\d+\]")

    def _sub(self, table: AliasTable, text: str) -> str:
        """``text`` with every identifier aliased, naming those it shows first."""
        return self._find.sub(lambda m: table.name(m.lastgroup or "", m.group(0)), text)

    def _known(self, table: AliasTable, text: str) -> str:
        """``text`` with the identifiers the table names aliased; the others stay as they are."""
        return self._find.sub(lambda m: table.to_alias.get(m.group(0), m.group(0)), text)

    def apply(self, messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], AliasTable]:
        """The messages as the policy sees them, and the table they define.

        Within a message, its content comes before its tool calls' arguments, as chat templates
        write them.  Assistant turns introduce no aliases (see the module docstring).
        """
        table = AliasTable()
        out = []
        for message in messages:
            shown = dict(message)
            sub = self._known if shown.get("role") == "assistant" else self._sub
            if isinstance(shown.get("content"), str):
                shown["content"] = sub(table, shown["content"])
            if shown.get("tool_calls"):
                shown["tool_calls"] = [self._call(sub, table, call) for call in shown["tool_calls"]]
            out.append(shown)
        return out, table

    @staticmethod
    def _call(sub: Any, table: AliasTable, call: dict[str, Any]) -> dict[str, Any]:
        function = dict(call.get("function", {}))
        if isinstance(function.get("arguments"), str):
            function["arguments"] = sub(table, function["arguments"])
        return {**call, "function": function}

    def to_policy(self, table: AliasTable, text: str) -> str:
        """``text`` (real identifiers) as the policy would write it after ``table``'s prefix:
        identifiers the prefix has shown become their aliases, any other stays real."""
        return self._known(table, text)

    def to_real(self, table: AliasTable, text: str) -> str:
        """The policy's ``text`` with every alias the table knows replaced by its identifier."""
        return self._alias.sub(lambda m: table.to_real.get(m.group(0), m.group(0)), text)

    def unmapped(self, table: AliasTable, text: str) -> list[str]:
        """The aliases in the policy's ``text`` that the table cannot map back, in order of first
        appearance: they name nothing, and must reach neither a tool nor the user."""
        found = (m.group(0) for m in self._alias.finditer(text))
        return list(dict.fromkeys(a for a in found if a not in table.to_real))
