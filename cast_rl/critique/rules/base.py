"""Visible-information rules shared by every domain, and the base class of the domain rules.

A rule looks at one action and its :class:`~cast_rl.critique.context.Visible` context and returns
:class:`Finding` objects.  Everything here uses only what the agent could see, so the same rules
serve the labeller (which adds privileged checks on top) and the rule-based critic.

Shared rules, in the order of the error types:

* hallucination: an argument value (id, name, amount, date, address) that occurs nowhere visible
  (an address's state code and country count as visible when its visible parts imply them:
  :mod:`cast_rl.critique.rules.address`);
  a reply naming an id or amount that occurs nowhere visible;
* policy_violation: more than one tool call in a message; user data touched before the user was
  authenticated the way the domain demands (:meth:`DomainRules.identified`: judged on the
  values the user gave, never on the words around them); a second user (the confirmation
  rules live in :mod:`cast_rl.critique.rules.confirmation`); plus each domain's own rules
  (:meth:`DomainRules.check`);
* wrong_tool_usage: a tool that does not exist, arguments that are not a JSON object, or argument
  names the tool's schema does not accept.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from cast_rl.critique.context import MALFORMED, RESPOND, ActionRef, Visible, leaves, numbers_in
from cast_rl.critique.rationale import Evidence
from cast_rl.critique.rules.address import derived_address_part

_REPLY_TOKEN = re.compile(
    r"(?<![\w@.$])(\$?\d[\d,]*\.\d{2}|#?[A-Za-z]*\d[\w-]*|[a-z]+_[\w]+|[\w.+-]+@[\w-]+\.[\w.]+)",
)
_ORDINAL = re.compile(r"^\d+(st|nd|rd|th|am|pm|h|k|m|s|x)$", re.I)
_TIME = re.compile(r"^\d{1,2}:\d{2}(:\d{2})?$")
_PAYMENT_ID = re.compile(r"^(credit_card|gift_card|certificate|paypal)_", re.I)
SMALL_INT = 10
"""Integers up to this size (counts of bags, passengers, limits) are never called made up."""


@dataclass
class Finding:
    """One broken rule: its type, what it rests on and how to fix it."""

    error_type: str
    explanation: str
    evidence: list[Evidence] = field(default_factory=list)
    clause: tuple[tuple[str, ...], ...] = ()
    """Keyword sets locating the policy line to cite (first line containing all of one set)."""
    suggested_fix: str = ""
    source: str = "rule"
    """Which rule produced it (for statistics and debugging)."""
    tool_checks: bool = False
    """The finding is that a condition was not looked at first, and the tool checks that
    condition itself (it rejects a call that breaks it): the privileged labeller drops it when
    the environment accepts the call; a visible-only critic keeps it."""


@dataclass
class Ctx:
    """What a rule sees: the action, its visible context and the domain's rules."""

    action: ActionRef
    visible: Visible
    rules: DomainRules
    message: dict[str, Any]

    def evidence(self, value: Any) -> list[Evidence]:
        hit = self.visible.find(value)
        return [Evidence(hit[0], hit[1])] if hit else []


def policy_clause(policy: str, clause: tuple[tuple[str, ...], ...]) -> str:
    """The first policy line that contains every keyword of one of the keyword sets."""
    lines = [line.strip().lstrip("-*# ").strip() for line in policy.splitlines()]
    for keys in clause:
        for line in lines:
            if line and all(k.lower() in line.lower() for k in keys):
                return line
    return ""


def fmt(value: Any) -> str:
    return str(value) if not isinstance(value, str) else value


class DomainRules:
    """A domain's policy as rules; subclasses fill the tables and add :meth:`check`."""

    name = ""
    subject_arg = "user_id"
    """The argument naming the customer an action is about."""
    auth_tools: tuple[str, ...] = ()
    """Lookups that authenticate the customer; a successful one returns the customer's id."""
    stated_id_identifies = False
    """Whether the policy lets the customer identify by giving their id (the ``subject_arg``
    value) in their own words, with no lookup by email, name or phone first."""
    stated_id_shape: re.Pattern[str] = re.compile(r"(?<![\w.@#-])([a-z]+(?:_[a-z]+)+_\d+)(?![\w@-])", re.I)
    """What such an id looks like (the tool schemas' examples: ``sara_doe_496``,
    ``john_smith_1234``); payment method ids of that shape are not ids of a customer."""
    public_tools: frozenset[str] = frozenset({"think", "calculate"})
    """Tools that touch no customer's data (allowed before authentication)."""
    write_tools: frozenset[str] = frozenset()
    terminate_tools: frozenset[str] = frozenset()
    confirm_keys: dict[str, tuple[str, ...]] = {}
    """For each write tool, the arguments the confirmation request must name."""
    once_per_record: dict[str, str] = {}
    """Tools the policy allows once per record, and the argument naming the record."""
    free_text: dict[str, frozenset[str]] = {}
    """Arguments that hold the agent's own words, not facts (exempt from the grounding check)."""
    derived: dict[str, frozenset[str]] = {}
    """Arguments computed from visible numbers (prices, totals): not checked for grounding."""
    auth_clause: tuple[tuple[str, ...], ...] = (("authenticat",),)
    one_user_clause: tuple[tuple[str, ...], ...] = (("one user",), ("one patient",), ("only the",))
    confirm_clause: tuple[tuple[str, ...], ...] = (("confirmation",), ("confirm",), ('"yes"',))
    made_up_clause: tuple[tuple[str, ...], ...] = (("make up",), ("not provide any information",))

    def is_write(self, action: ActionRef) -> bool:
        return action.name in self.write_tools

    def authenticated(self, visible: Visible) -> tuple[str, int] | None:
        """(customer id, message index of the tool output) of the first successful lookup."""
        for record in visible.calls(*self.auth_tools, ok=True):
            ident = (record.output or "").strip().strip('"')
            if ident and " " not in ident:
                return ident, record.output_index or record.message_index
        return None

    def identified(self, visible: Visible, action: ActionRef) -> tuple[str, int] | None:
        """(customer id, message index) once the customer is identified as the policy demands.

        A lookup (:meth:`authenticated`) always counts; where :attr:`stated_id_identifies`, so
        does an id the user gave, whatever the words around it: the subject of an earlier
        successful call, or of ``action`` itself, that occurs in a user message; else the first
        token of a user message shaped like an id (:attr:`stated_id_shape`).  Whose records the
        agent then touches is checked against it (:meth:`record_owner`, the one-user rule).
        """
        auth = self.authenticated(visible)
        if auth is not None or not self.stated_id_identifies:
            return auth
        subjects = [r.kwargs.get(self.subject_arg) for r in visible.calls(ok=True)]
        subjects.append(action.kwargs.get(self.subject_arg))
        for subject in subjects:
            if isinstance(subject, str) and subject.strip():
                said = visible.user_stated(subject)
                if said is not None:
                    return subject, said
        # an id the user gave before any call names it (a reservation or ticket read first)
        for index, text in visible.user_texts:
            for match in self.stated_id_shape.finditer(text):
                ident = match.group(1).lower()
                if not _PAYMENT_ID.match(ident):
                    return ident, index
        return None

    def record_owner(self, ctx: Ctx, arg: str, value: Any) -> tuple[str, Evidence] | None:
        """Whose record ``value`` is, as visible, with the quote that shows it."""
        return None

    def family(self, ctx: Ctx, other: str) -> bool:
        """Whether acting for ``other`` is allowed beside the authenticated customer."""
        return False

    def check(self, ctx: Ctx) -> list[Finding]:
        """The domain's own rules (state preconditions and the like)."""
        return []


def check_grounding(ctx: Ctx) -> list[Finding]:
    """hallucination: argument values, or ids and amounts in a reply, not visible anywhere."""
    action, rules = ctx.action, ctx.rules
    if action.name == RESPOND:
        return _check_reply(ctx)
    missing = ungrounded(action.name, action.kwargs, ctx.visible, rules)
    if not missing:
        return []
    paths = sorted({p.split(".")[-1] for p, _ in missing})
    what = " and ".join(f"the {p}" for p in paths[:3])
    return [
        Finding(
            "hallucination",
            f"The call to {action.name} uses a value for {what} that appears nowhere in the "
            "policy, the user's messages or the tool outputs so far.",
            clause=rules.made_up_clause,
            suggested_fix=f"Ask the user for {what} or look it up with a tool before using it.",
            source="grounding",
        )
    ]


def ungrounded(
    name: str, kwargs: dict[str, Any], visible: Visible, rules: DomainRules
) -> list[tuple[str, Any]]:
    """(path, value) of the arguments that occur nowhere visible."""
    skip = rules.free_text.get(name, frozenset()) | rules.derived.get(name, frozenset())
    missing: list[tuple[str, Any]] = []
    for path, value in leaves(kwargs):
        if path.split(".")[0] in skip or path in skip or _exempt_value(value):
            continue
        if visible.contains(value):
            continue
        if isinstance(value, (int, float)) and _policy_multiple(float(value), visible.policy):
            continue
        if derived_address_part(path, value, kwargs, visible):
            continue
        missing.append((path, value))
    return missing


def _exempt_value(value: Any) -> bool:
    if isinstance(value, bool) or value is None:
        return True
    if isinstance(value, (int, float)):
        return float(value).is_integer() and abs(value) <= SMALL_INT
    text = str(value).strip()
    return not text or len(text.split()) >= 5


def _check_reply(ctx: Ctx) -> list[Finding]:
    content = str(ctx.action.kwargs.get("content", ""))
    missing = []
    for match in _REPLY_TOKEN.finditer(content):
        token = match.group().rstrip(".,;:")
        if _ORDINAL.match(token) or _TIME.match(token) or not any(c.isdigit() or c == "_" for c in token):
            continue
        value: Any = token.lstrip("$")
        if re.fullmatch(r"[\d,]+(\.\d+)?", value):
            number = float(value.replace(",", ""))
            if (number.is_integer() and abs(number) <= SMALL_INT) or _derivable(number, ctx.visible):
                continue
            value = number
        if not ctx.visible.contains(value):
            missing.append(token)
    if not missing:
        return []
    kinds = "an amount" if all(re.fullmatch(r"\$?[\d,.]+", t) for t in missing) else "an id or value"
    return [
        Finding(
            "hallucination",
            f"The reply states {kinds} that appears nowhere in the policy, the user's messages or "
            "the tool outputs so far.",
            clause=ctx.rules.made_up_clause,
            suggested_fix="Only tell the user facts that a tool returned or the user said.",
            source="grounding",
        )
    ]


def _policy_multiple(number: float, policy: str) -> bool:
    """A small multiple of an amount the policy states ($50 times the number of passengers)."""
    return any(
        abs(unit * k - number) < 0.005
        for unit in numbers_in(policy)
        if unit >= 1
        for k in range(1, SMALL_INT + 1)
    )


def _derivable(number: float, visible: Visible) -> bool:
    """A sum, difference or small multiple of visible amounts (a total the agent computed)."""
    if number in visible.numbers:
        return True
    amounts = sorted(n for n in visible.numbers if 0 < abs(n) < 100_000)[:400]
    pool = set(amounts)
    for a in amounts:
        for k in range(2, 11):
            if abs(a * k - number) < 0.005:
                return True
        if round(number - a, 2) in pool or round(a - number, 2) in pool:
            return True
    return False


def check_one_call(ctx: Ctx) -> list[Finding]:
    """policy_violation: a second tool call in the same message."""
    if ctx.action.call_index < 1:
        return []
    return [
        Finding(
            "policy_violation",
            "This is not the first tool call of the message; the policy allows one tool call at a time.",
            clause=(("one tool call",),),
            suggested_fix="Make one tool call, read its output, then make the next.",
            source="one_call",
        )
    ]


def check_authentication(ctx: Ctx) -> list[Finding]:
    """policy_violation: customer data touched before authentication, or a second customer."""
    action, rules, visible = ctx.action, ctx.rules, ctx.visible
    if action.name in (RESPOND, MALFORMED) or action.name in rules.public_tools | set(rules.auth_tools):
        return []
    if action.name in rules.terminate_tools:
        return []
    auth = rules.identified(visible, action)
    if auth is None:
        return [
            Finding(
                "policy_violation",
                f"{action.name} works on the customer's data, but the customer has not been "
                "authenticated yet in the way the policy requires.",
                clause=rules.auth_clause,
                suggested_fix="Authenticate the customer first with "
                + " or ".join(rules.auth_tools or ("their user id",))
                + ", then continue.",
                source="authentication",
            )
        ]
    ident = auth[0]
    others: list[tuple[str, list[Evidence]]] = []
    subject = action.kwargs.get(rules.subject_arg)
    if isinstance(subject, str) and subject != ident and not rules.family(ctx, subject):
        others.append((subject, ctx.evidence(subject)))
    for arg, value in action.kwargs.items():
        if arg == rules.subject_arg or not isinstance(value, str):
            continue
        owner = rules.record_owner(ctx, arg, value)
        if owner and owner[0] != ident and not rules.family(ctx, owner[0]):
            others.append((owner[0], [owner[1]]))
    if not others:
        return []
    other, evidence = others[0]
    return [
        Finding(
            "policy_violation",
            f"The authenticated customer is {ident}, but this action concerns {other}; the policy "
            "allows helping only one customer per conversation.",
            evidence=ctx.evidence(ident) + evidence,
            clause=rules.one_user_clause,
            suggested_fix=f"Only act on records of {ident}; decline requests about other customers.",
            source="one_user",
        )
    ]


def check_schema(ctx: Ctx) -> list[Finding]:
    """wrong_tool_usage: unknown tool, arguments that are not an object, wrong argument names."""
    action = ctx.action
    if action.name == RESPOND:
        return []
    schemas = {t["function"]["name"]: t["function"] for t in ctx.visible.tools if "function" in t}
    problem = None
    if action.name == MALFORMED:
        problem = "the tool call is malformed and could not be parsed"
    elif schemas and action.name not in schemas:
        problem = "no tool of that name is available"
    elif not action.arguments_ok:
        problem = "its arguments are not a JSON object"
    elif schemas:
        params = schemas[action.name].get("parameters") or {}
        allowed = set((params.get("properties") or {}).keys())
        required = set(params.get("required") or ())
        unknown = sorted(set(action.kwargs) - allowed)
        absent = sorted(required - set(action.kwargs))
        if unknown:
            problem = f"it passes {action.name} an argument that the tool does not take"
        elif absent:
            problem = f"{action.name} needs the argument {absent[0]}, which it leaves out"
    if problem is None:
        return []
    return [
        Finding(
            "wrong_tool_usage",
            f"The call cannot work: {problem}.",
            suggested_fix="Use one of the listed tools with exactly the arguments its schema names.",
            source="schema",
        )
    ]
