"""The critique text format, its parser and the leakage check."""

from __future__ import annotations

from cast_rl.critique.context import ActionRef, Visible
from cast_rl.critique.rationale import (
    Evidence,
    Rationale,
    format_critique,
    leakage_problems,
    parse_critique,
    value_tokens,
)

POLICY = "# Policy\n- Before taking consequential actions, obtain explicit user confirmation (yes).\n"
MESSAGES = [
    {"role": "system", "content": POLICY},
    {"role": "user", "content": "Please cancel order #W1234567, I no longer need it."},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {
        "name": "get_order_details", "arguments": '{"order_id": "#W1234567"}'}}]},
    {"role": "tool", "tool_call_id": "c1", "content": '{"order_id": "#W1234567", "status": "pending"}'},
]
ACTION = ActionRef(4, 0, "cancel_pending_order", {"order_id": "#W1234567", "reason": "no longer needed"})
TOOLS = [{"type": "function", "function": {"name": "cancel_pending_order", "parameters": {}}}]


def _rationale(**kw) -> Rationale:  # noqa: ANN003
    base = dict(
        verdict="invalid", error_type="policy_violation",
        evidence=[Evidence(1, "Please cancel order #W1234567"), Evidence(None, "explicit user confirmation")],
        policy_clause="Before taking consequential actions, obtain explicit user confirmation (yes).",
        explanation="cancel_pending_order for #W1234567 runs without asking the user to confirm.",
        suggested_fix="List the cancellation of '#W1234567' and wait for a yes.",
    )
    base.update(kw)
    return Rationale(**base)


def test_format_begins_with_verdict_and_error_and_round_trips() -> None:
    r = _rationale()
    text = format_critique(r)
    assert text.startswith("VERDICT: invalid\nERROR: policy_violation\n")
    assert parse_critique(text) == r
    valid = Rationale("valid", "none", explanation="Fine.")
    assert parse_critique(format_critique(valid)) == valid


def test_parser_rejects_what_does_not_follow_the_format() -> None:
    assert parse_critique("") is None
    assert parse_critique("The action looks fine to me.") is None
    assert parse_critique("VERDICT: maybe\nERROR: none") is None
    assert parse_critique("VERDICT: valid\nERROR: hallucination") is None  # disagree
    assert parse_critique("VERDICT: invalid\nERROR: none") is None
    assert parse_critique("VERDICT: invalid\nERROR: made_up_type") is None
    # surrounding chatter and odd case are tolerated; a broken evidence line is dropped
    parsed = parse_critique("Sure.\nverdict: Invalid\nERROR: hallucination\nEVIDENCE: 3 not-json\n")
    assert parsed is not None and parsed.error_type == "hallucination" and parsed.evidence == []


def test_a_rationale_resting_on_visible_text_passes() -> None:
    visible = Visible(POLICY, MESSAGES, TOOLS)
    assert leakage_problems(_rationale(), visible, ACTION) == []


def test_leakage_check_catches_invisible_ids_and_bad_quotes() -> None:
    visible = Visible(POLICY, MESSAGES, TOOLS)
    leaky = _rationale(explanation="The user meant order #W7654321 instead.")
    assert any("#W7654321" in p for p in leakage_problems(leaky, visible, ACTION))
    quote = _rationale(evidence=[Evidence(1, "cancel order #W7654321")])
    assert leakage_problems(quote, visible, ACTION)
    future = _rationale(evidence=[Evidence(4, "pending")])  # not before the action
    assert leakage_problems(future, visible, ACTION)
    clause = _rationale(policy_clause="Never cancel orders.")
    assert leakage_problems(clause, visible, ACTION)
    amount = _rationale(suggested_fix="Refund $123.45 to the card.")
    assert leakage_problems(amount, visible, ACTION)
    # a made-up value of the action itself is described, never repeated
    made_up = ActionRef(4, 0, "cancel_pending_order", {"order_id": "#W9999999", "reason": "no longer needed"})
    repeats = _rationale(explanation="Order #W9999999 appears nowhere.")
    assert any("#W9999999" in p for p in leakage_problems(repeats, visible, made_up))


def test_value_tokens_find_ids_and_quoted_values_but_not_apostrophes() -> None:
    tokens = value_tokens("The customer's order #W1 and 'gift_card_9' and the user's \"blue shirt\".")
    assert tokens == ["#W1", "gift_card_9", "gift_card_9", "blue shirt"]


def test_every_label_the_critic_trains_on_is_in_the_structured_language(retail_data_dir) -> None:  # noqa: ANN001
    """Structured decoding (critic.structured) must allow exactly what critic training teaches:
    each labelled rationale's text, as build_critic_data writes it, matches CRITIQUE_REGEX, and
    whatever matches it parses with an agreeing verdict and error type."""
    import re

    from cast_rl.critique.gold import gold_trajectory
    from cast_rl.critique.inject import INJECTORS, inject
    from cast_rl.critique.labeller import Labeller
    from cast_rl.critique.rationale import (
        CRITIQUE_REGEX,
        Rationale,
        format_critique,
        parse_critique,
    )
    from cast_rl.envs.core import load_domain_data

    data = load_domain_data("retail", retail_data_dir)
    labeller, pattern, kinds = Labeller(data), re.compile(CRITIQUE_REGEX), set()
    for task in range(4):
        trajs = [gold_trajectory(data, "train", task)]
        trajs += [i.trajectory for kind in INJECTORS if (i := inject(kind, data, "train", task)) is not None]
        for traj in trajs:
            for label in labeller.label(traj):
                if label.rationale is None:
                    continue
                text = format_critique(Rationale.from_json(label.rationale))
                assert pattern.fullmatch(text), text
                kinds.add(label.error_type)
    assert {"none", "hallucination", "policy_violation"} <= kinds
    assert pattern.fullmatch("VERDICT: valid\nERROR: none")  # critic_valid_answer=verdict
    for bad in ("VERDICT: valid\nERROR: hallucination", "VERDICT: invalid\nERROR: none", "VERDICT: valid\nEROR: none",
                "VERDICT: invalid\nERROR: policy_violation\nEXPLANATION: a\nCLAUSE: out of order"):
        assert not pattern.fullmatch(bad)
    assert parse_critique("VERDICT: invalid\nERROR: policy_violation\nCLAUSE: x\nEVIDENCE: 3 \"y\"") is not None
