"""Tools that several tau-style domains share with identical behaviour.

tau-bench's retail and airline ``calculate``, ``think`` and ``transfer_to_human_agents`` differ only
in their schema descriptions (which live in each domain's ``tools.json``), not in what ``invoke``
does, so both domains import these classes.  Keyword names, defaults and error behaviour follow
the source so that bad calls produce the same observation text.
"""

from __future__ import annotations

from typing import Any

from cast_rl.envs.arith import evaluate

_CALCULATOR_CHARS = "0123456789+-*/(). "


class Calculate:
    """``calculate``: arithmetic on a character-filtered expression, rounded to two decimals."""

    @staticmethod
    def invoke(data: Any, expression: str) -> str:
        # The source's filter runs outside its try block: a non-iterable argument raises (and the
        # env reports "Error: <exc>"), and a non-string item is tested with `in` like the source.
        if not all(char in _CALCULATOR_CHARS for char in expression):
            return "Error: invalid characters in expression"
        try:
            if not isinstance(expression, str):
                # What eval() says about a list or dict whose items passed the filter.
                raise TypeError("eval() arg 1 must be a string, bytes or code object")
            return str(round(float(evaluate(expression)), 2))
        except Exception as exc:  # the source turns every evaluation error into its observation
            return f"Error: {exc}"


class Think:
    """``think``: a no-op that lets the agent write down reasoning."""

    @staticmethod
    def invoke(data: Any, thought: str) -> str:
        return ""


class TransferToHumanAgents:
    """``transfer_to_human_agents``: the retail and airline terminate tool."""

    @staticmethod
    def invoke(data: Any, summary: str) -> str:
        return "Transfer successful"
