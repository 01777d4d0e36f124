"""Confirmation rules: consequential actions need an explicit yes; once-only tools run once.

* a write (``DomainRules.is_write``) must follow, with no other write in between, a user message
  that is an explicit yes, answering an assistant message that asked for confirmation and named
  the action's details (the domain's ``confirm_keys``, or at least one argument value).  A write
  the critic sent back never ran, so it is no write in between, and neither is the critic's
  message the user's answer: the revision of a rejected cancel stands on the confirmation before
  the rejected one;
* a tool the policy allows once per record (``DomainRules.once_per_record``) must not run again
  on that record.
"""

from __future__ import annotations

import re
from typing import Any

from cast_rl.critique.context import (
    RESPOND,
    ActionRef,
    iter_actions,
    month_days_in,
    numbers_in,
    rejected_by_critic,
)
from cast_rl.critique.rationale import Evidence
from cast_rl.critique.rules.base import Ctx, Finding, fmt

_YES = re.compile(
    r"^\W*(yes|yeah|yep|yup|sure|ok(ay)?|correct|confirm(ed)?|please do|go ahead|proceed"
    r"|absolutely|alright|of course|sounds good|that'?s (right|correct))\b"
    r"|\b(yes|i confirm|confirmed|go ahead|please proceed|please do it|please do so)\b",
    re.I,
)
_NO = re.compile(r"^\s*(no|nope|don't|do not|wait|stop)\b|\bdo not (proceed|do)\b", re.I)
_ASKS = re.compile(
    r"\?|confirm|proceed|yes/no|go ahead|shall i|should i|would you like me to|do you want me to",
    re.I,
)


def is_yes(text: str) -> bool:
    return bool(_YES.search(text)) and not _NO.search(text)


def check_confirmation(ctx: Ctx) -> list[Finding]:
    """policy_violation: a write without an explicit yes right after its details were listed."""
    action, rules, messages = ctx.action, ctx.rules, ctx.visible.messages
    if not rules.is_write(action):
        return []
    keys = [(k, action.kwargs.get(k)) for k in rules.confirm_keys.get(action.name, ())]
    keys = [(k, v) for k, v in keys if v not in (None, "", [])]
    problem = None
    user_index = None
    for i in range(len(messages) - 1, -1, -1):
        m = messages[i]
        if m.get("role") == "assistant" and not rejected_by_critic(messages, i) and any(
            rules.is_write(a) for a in _calls(m, i)
        ):
            problem = "no confirmation was asked for this action since the previous change"
            break
        if m.get("role") == "user" and m.get("name") != "critic":
            user_index = i
            break
    if problem is None and user_index is None:
        problem = "the user has not said anything yet"
    if problem is None:
        assert user_index is not None
        reply = str(messages[user_index].get("content") or "")
        asked = next(
            (j for j in range(user_index - 1, -1, -1) if messages[j].get("role") == "assistant"),
            None,
        )
        ask_text = str(messages[asked].get("content") or "") if asked is not None else ""
        if not is_yes(reply):
            problem = "the user's last message is not an explicit yes"
        elif asked is None or messages[asked].get("tool_calls") or not _ASKS.search(ask_text):
            problem = "the agent did not list the action and ask for confirmation before the user's yes"
        else:
            unnamed = [k for k, v in keys if not _mentions(ask_text, v)]
            named_any = any(
                _mentions(ask_text, v)
                for k, v in action.kwargs.items()
                if k != rules.subject_arg and isinstance(v, (str, int, float)) and not isinstance(v, bool)
            )
            if not keys and not named_any:
                problem = "the confirmation request did not list the action's details"
            elif unnamed:
                problem = "the confirmation request did not name its " + " and ".join(
                    k.replace("_", " ") for k in unnamed[:2]
                )
    if problem is None:
        return []
    last_user = ctx.visible.user_texts[-1] if ctx.visible.user_texts else None
    evidence = []
    if last_user and last_user[1].strip():
        evidence.append(Evidence(last_user[0], last_user[1].strip()[:200]))
    return [
        Finding(
            "policy_violation",
            f"{action.name} changes the database, but {problem}.",
            evidence=evidence,
            clause=rules.confirm_clause,
            suggested_fix=f"List the details of {action.name} to the user and wait for an explicit "
            "yes before calling it.",
            source="confirmation",
        )
    ]


def _calls(message: dict[str, Any], index: int) -> list[ActionRef]:
    return [a for a in iter_actions([message]) if a.name != RESPOND]


def _mentions(text: str, value: Any) -> bool:
    """Whether the text names the value, in any usual spelling.

    ``#W2378156`` as ``W2378156`` or ``2378156``; ``2025-09-23`` as ``September 23``; ``85.0`` as
    ``$85.00``; a list item by item; a record (dict) by any of its values.
    """
    values = value if isinstance(value, list) else [value]
    low = text.lower()
    for v in values:
        if isinstance(v, dict):
            if not any(_mentions(text, x) for x in v.values() if isinstance(x, str)):
                return False
        elif not _names(low, fmt(v).lower()):
            return False
    return True


def _names(low: str, s: str) -> bool:
    if s in low or s.lstrip("#") in low:
        return True
    iso = re.fullmatch(r"\d{4}-(\d{2})-(\d{2})", s)
    if iso:
        return (int(iso.group(1)), int(iso.group(2))) in month_days_in(low)
    try:
        return float(s) in numbers_in(low)
    except ValueError:
        pass
    digits = re.sub(r"\D", "", s)
    return len(digits) >= 4 and re.search(rf"(?<!\d){digits}(?!\d)", low) is not None


def check_once(ctx: Ctx) -> list[Finding]:
    """policy_violation: a tool the policy allows once per record, used again on that record."""
    arg = ctx.rules.once_per_record.get(ctx.action.name)
    if arg is None:
        return []
    value = ctx.action.kwargs.get(arg)
    earlier = [r for r in ctx.visible.calls(ctx.action.name, ok=True) if r.kwargs.get(arg) == value]
    if not earlier:
        return []
    return [
        Finding(
            "policy_violation",
            f"{ctx.action.name} was already called for {arg}={fmt(value)!r}; the policy allows it "
            "only once.",
            evidence=ctx.evidence(value),
            clause=(("only be called once",), ("once",)),
            suggested_fix="Collect every change into a single call; do not call it again.",
            source="once",
        )
    ]
