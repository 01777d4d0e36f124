"""Per-domain policy rules over the visible context; see :mod:`cast_rl.critique.rules.base`.

:func:`visible_findings` runs the shared rules and the domain's own; :func:`to_rationale` turns
the finding that wins (first error type in the order hallucination, policy_violation,
wrong_tool_usage) into a structured rationale.
"""

from __future__ import annotations

import re
from typing import Any

from cast_rl.critique.context import ActionRef, Visible
from cast_rl.critique.rationale import PRIORITY, Rationale
from cast_rl.critique.rules.airline import AirlineRules
from cast_rl.critique.rules.base import (
    Ctx,
    DomainRules,
    Finding,
    check_authentication,
    check_grounding,
    check_one_call,
    check_schema,
    policy_clause,
)
from cast_rl.critique.rules.confirmation import check_confirmation, check_once
from cast_rl.critique.rules.retail import RetailRules
from cast_rl.critique.rules.telecom import TelecomRules
from cast_rl.critique.rules.telehealth import TelehealthRules

RULES: dict[str, type[DomainRules]] = {
    "retail": RetailRules,
    "airline": AirlineRules,
    "telecom": TelecomRules,
    "telehealth": TelehealthRules,
}

SHARED_CHECKS = (check_grounding, check_one_call, check_authentication, check_confirmation,
                 check_once, check_schema)
"""Shared rules, in the order of the error types; the domain's ``check`` runs after them."""

KNOWN_NAMES = frozenset(
    name
    for rules in RULES.values()
    for name in (*rules.auth_tools, *rules.public_tools, *rules.write_tools, *rules.terminate_tools,
                 "get_order_details", "get_user_details", "get_reservation_details",
                 "get_provider_details", "get_customer_details", "get_appointment_details")
)
"""Tool names the rules mention in suggested fixes (written in words in rationales)."""

__all__ = ["RULES", "Ctx", "DomainRules", "Finding", "choose", "get_rules", "to_rationale",
           "visible_findings"]


def get_rules(domain: str) -> DomainRules:
    if domain not in RULES:
        raise ValueError(f"no critique rules for domain {domain!r}; known: {', '.join(RULES)}")
    return RULES[domain]()


def visible_findings(
    action: ActionRef, visible: Visible, rules: DomainRules, message: dict[str, Any] | None = None
) -> list[Finding]:
    """Every rule the action breaks, judged only from the visible context."""
    ctx = Ctx(action=action, visible=visible, rules=rules, message=message or {})
    findings: list[Finding] = []
    for check in SHARED_CHECKS:
        findings += check(ctx)
    findings += rules.check(ctx)
    return findings


def choose(findings: list[Finding]) -> Finding | None:
    """The finding to report: the first of the highest-priority error type."""
    if not findings:
        return None
    return min(enumerate(findings), key=lambda p: (PRIORITY[p[1].error_type], p[0]))[1]


def to_rationale(finding: Finding | None, visible: Visible, action: ActionRef) -> Rationale:
    """The structured rationale of a verdict (valid when ``finding`` is None)."""
    if finding is None:
        what = "reply" if action.is_reply else f"call to {action.name.replace('_', ' ')}"
        return Rationale(
            verdict="valid",
            error_type="none",
            explanation=f"The {what} is grounded in what the user and the tools said and follows "
            "the policy.",
        )
    names = {action.name, *action.kwargs, *KNOWN_NAMES}
    names |= {t["function"]["name"] for t in visible.tools if "function" in t}
    return Rationale(
        verdict="invalid",
        error_type=finding.error_type,
        evidence=[e for e in finding.evidence if e.quote],
        policy_clause=policy_clause(visible.policy, finding.clause) if finding.clause else "",
        explanation=humanize(finding.explanation, names),
        suggested_fix=humanize(finding.suggested_fix, names),
    )


def humanize(text: str, names: set[str]) -> str:
    """Tool and argument names in words (``get_order_details`` -> ``get order details``).

    Only the given names are rewritten, so ids such as ``sarah_johnson_1234`` or
    ``dr_garcia_primary`` keep their exact spelling.
    """
    for name in sorted(names, key=len, reverse=True):
        if "_" in name:
            text = re.sub(rf"(?<![\w#@.-]){re.escape(name)}(?![\w@-])", name.replace("_", " "), text)
    return text
