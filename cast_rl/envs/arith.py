"""Safe arithmetic for the ``calculate`` tool: numbers, + - * /, unary signs and parentheses.

The source benchmarks call ``eval(expression, {"__builtins__": None}, {})`` after a check that
every character is in ``0123456789+-*/(). ``.  We never execute model output: the expression is
compiled only to obtain CPython's own syntax errors (so their text is identical to ``eval``'s),
then its AST is walked without recursion by code that knows exactly the node kinds those
characters can form.  Besides numbers that includes the empty tuple ``()``, the ellipsis ``...``
and calls such as ``(1)(2)``; they produce the same ``TypeError`` texts as under ``eval``.

Deliberate bounds, where ``eval`` would spend unbounded time or memory:

* expressions longer than :data:`MAX_EXPRESSION_CHARS` raise ``ValueError``;
* an integer result wider than :data:`MAX_INT_BITS` bits raises ``OverflowError("int too large
  to convert to float")`` before it is computed.  That is what the source reports once such a
  value reaches ``float()``; it differs only for expressions that divide a huge intermediate
  value back into float range.

Known residual difference: at exactly the nesting depth where CPython's compiler hits its
recursion limit, building the AST fails one level earlier than ``eval`` does.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable
from typing import Any

_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type, Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}
MAX_EXPRESSION_CHARS = 10_000
"""Longer expressions are rejected with ``ValueError``."""
MAX_INT_BITS = 1 << 16
"""Integer intermediate results wider than this raise ``OverflowError`` (see the module doc)."""
_TOO_LARGE = "int too large to convert to float"


def evaluate(expression: str) -> Any:
    """Value of an arithmetic expression, with ``eval``'s result and exception for it.

    Returns an ``int`` or ``float`` for arithmetic (a ``complex`` for a fractional power of a
    negative number, a tuple or ``Ellipsis`` for the odd inputs ``eval`` also accepts); raises
    ``SyntaxError``, ``ZeroDivisionError``, ``TypeError``, ``OverflowError`` as ``eval`` would,
    and ``ValueError`` for expressions outside the supported subset or over the size bound.
    """
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    text = expression.lstrip(" \t")  # eval() strips leading spaces and tabs itself
    compile(text, "<string>", "eval")  # eval's own syntax and compiler errors, never run
    tree = compile(text, "<string>", "eval", ast.PyCF_ONLY_AST)
    return _evaluate(tree.body)


def _children(node: ast.AST) -> list[ast.AST]:
    """Sub-expressions in CPython's evaluation order."""
    if isinstance(node, ast.BinOp):
        return [node.left, node.right]
    if isinstance(node, ast.UnaryOp):
        return [node.operand]
    if isinstance(node, ast.Tuple):
        return list(node.elts)
    if isinstance(node, ast.Call):
        args = [arg.value if isinstance(arg, ast.Starred) else arg for arg in node.args]
        return [node.func, *args, *(keyword.value for keyword in node.keywords)]
    return []


def _evaluate(root: ast.AST) -> Any:
    # Explicit stack: compile() accepts nesting about 3000 deep, far beyond Python recursion.
    stack: list[tuple[ast.AST, list[ast.AST], list[Any]]] = [(root, _children(root), [])]
    result: Any = None
    while stack:
        node, pending, values = stack[-1]
        if len(values) < len(pending):
            child = pending[len(values)]
            stack.append((child, _children(child), []))
            continue
        stack.pop()
        result = _combine(node, values)
        if stack:
            parent, _, parent_values = stack[-1]
            parent_values.append(result)
            if isinstance(parent, ast.Call):
                _check_call_argument(parent, parent_values)
    return result


def _combine(node: ast.AST, values: list[Any]) -> Any:
    if isinstance(node, ast.Constant):
        if type(node.value) in (int, float) or node.value is Ellipsis:
            return node.value
    elif isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = values
        if (
            isinstance(node.op, ast.Pow)
            and type(left) is int
            and type(right) is int
            and right > 0
            and abs(left) > 1
            and (abs(left).bit_length() - 1) * right > MAX_INT_BITS
        ):
            raise OverflowError(_TOO_LARGE)
        return _bounded(_BINARY[type(node.op)](left, right))
    elif isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](values[0])
    elif isinstance(node, ast.Tuple) and not any(isinstance(e, ast.Starred) for e in node.elts):
        return tuple(values)
    elif isinstance(node, ast.Call):
        func = values[0]
        if _single_starred(node) and not isinstance(values[1], tuple) and not _iterable(values[1]):
            raise TypeError(
                f"{_function_str(func)} argument after * must be an iterable, "
                f"not {type(values[1]).__name__}"
            )
        if not callable(func):
            raise TypeError(f"'{type(func).__name__}' object is not callable")
    raise ValueError(f"unsupported expression element: {type(node).__name__}")


def _check_call_argument(call: ast.Call, values: list[Any]) -> None:
    """The checks CPython makes right after evaluating a call's ``*`` or ``**`` argument."""
    index, value = len(values) - 1, values[-1]
    if index == 0:
        return
    if index <= len(call.args):
        starred = isinstance(call.args[index - 1], ast.Starred) and not _single_starred(call)
        if starred and not _iterable(value):
            raise TypeError(f"Value after * must be an iterable, not {type(value).__name__}")
        return
    keyword = call.keywords[index - 1 - len(call.args)]
    if keyword.arg is not None:
        raise ValueError("unsupported expression element: keyword")
    if not hasattr(value, "keys"):
        raise TypeError(
            f"{_function_str(values[0])} argument after ** must be a mapping, "
            f"not {type(value).__name__}"
        )


def _single_starred(call: ast.Call) -> bool:
    """``f(*x)`` alone passes ``x`` straight to the call (checked there), not via a list."""
    return len(call.args) == 1 and isinstance(call.args[0], ast.Starred)


def _iterable(value: Any) -> bool:
    return hasattr(type(value), "__iter__") or hasattr(type(value), "__getitem__")


def _function_str(func: Any) -> str:
    qualname = getattr(func, "__qualname__", None)
    return f"{qualname}()" if isinstance(qualname, str) else str(func)


def _bounded(value: Any) -> Any:
    if type(value) is int and value.bit_length() > MAX_INT_BITS:
        raise OverflowError(_TOO_LARGE)
    return value
