"""The one JSON Lines reader: every file of records, labels, results and logs is read through it.

A file is read as bytes and split on ``\\n`` only (a ``\\u2028`` inside a string is not a line
break), each line decoded as UTF-8 and parsed as JSON.  Blank lines are skipped; line numbers
count them, so an error names the line an editor shows.  A line that is not JSON, or that the
caller's ``parse`` rejects, raises one line ``PATH:LINE: not WHAT: REASON``.

``torn_tail`` says what a last line that is not JSON means.  ``"raise"`` (files written whole:
trajectories, labels, results) treats it like any other bad line.  ``"skip"`` (append-only logs
a crash may leave mid-line) logs it and stops; only the last non-blank line is forgiven, and only
for not being JSON: a complete line the caller's ``parse`` rejects still raises.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

logger = logging.getLogger(__name__)

TornTail = Literal["raise", "skip"]


class JsonlError(ValueError):
    """A JSON Lines line that cannot be read; the message names the file and the line."""


def iter_jsonl(
    path: str | Path,
    parse: Callable[[Any], Any] | None = None,
    *,
    what: str = "JSON",
    error: type[ValueError] = JsonlError,
    torn_tail: TornTail = "raise",
) -> Iterator[tuple[int, Any]]:
    """(line number, ``parse(object)``) per non-blank line of ``path``.

    ``parse`` checks or builds each object; a ``ValueError`` or ``TypeError`` it raises becomes
    ``error`` naming the line, with ``what`` naming what the line should have been.
    """
    if torn_tail not in ("raise", "skip"):
        raise ValueError(f"torn_tail={torn_tail!r} is not allowed; expected 'raise' or 'skip'")
    path = Path(path)
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw.decode("utf-8"))
            except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
                if torn_tail == "skip" and not f.read().strip():
                    logger.warning("%s:%d: ignoring a torn last line (a writer stopped mid-line)", path, lineno)
                    return
                raise error(f"{path}:{lineno}: not {what}: {_reason(exc)}") from None
            if parse is not None:
                try:
                    obj = parse(obj)
                except (ValueError, TypeError, RecursionError) as exc:  # RecursionError: nested too deep
                    raise error(f"{path}:{lineno}: not {what}: {_reason(exc)}") from None
            yield lineno, obj


def _reason(exc: BaseException) -> str:
    """The exception as one line (error messages here are one line each)."""
    return str(exc).replace("\n", " ") or type(exc).__name__
