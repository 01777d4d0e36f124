"""The one JSON Lines reader (cast_rl.jsonl): blank lines, torn last lines, errors, Unicode."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from cast_rl.jsonl import JsonlError, iter_jsonl


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_blank_lines_are_skipped_and_still_counted(tmp_path: Path) -> None:
    path = _write(tmp_path / "a.jsonl", b'{"a": 1}\n\n   \n{"a": 2}\r\n\t\n[3]\n\n')
    assert list(iter_jsonl(path)) == [(1, {"a": 1}), (4, {"a": 2}), (6, [3])]


def test_empty_file_yields_nothing(tmp_path: Path) -> None:
    assert list(iter_jsonl(_write(tmp_path / "e.jsonl", b""))) == []
    assert list(iter_jsonl(_write(tmp_path / "b.jsonl", b"\n \n"), torn_tail="skip")) == []


def test_torn_last_line_raises_by_default(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.jsonl", b'{"a": 1}\n{"a": 2}\n{"a": 3, "b')
    with pytest.raises(JsonlError, match=rf"^{path}:3: not JSON: ") as info:
        list(iter_jsonl(path))
    assert "\n" not in str(info.value)


def test_torn_last_line_is_skipped_with_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # trailing blank lines do not make the torn line a middle one
    path = _write(tmp_path / "t.jsonl", b'{"a": 1}\n\n{"a": 2}\n{"a": 3, "b\n\n  \n')
    with caplog.at_level(logging.WARNING, logger="cast_rl.jsonl"):
        assert list(iter_jsonl(path, torn_tail="skip")) == [(1, {"a": 1}), (3, {"a": 2})]
    assert f"{path}:4: ignoring a torn last line" in caplog.text


def test_a_torn_multibyte_character_at_the_end_is_a_torn_line(tmp_path: Path) -> None:
    whole = json.dumps({"text": "é"}, ensure_ascii=False).encode()
    torn = whole[: whole.index(b"\xc3") + 1]  # the first byte of a two-byte character
    path = _write(tmp_path / "t.jsonl", whole + b"\n" + torn)
    assert list(iter_jsonl(path, torn_tail="skip")) == [(1, {"text": "é"})]
    with pytest.raises(JsonlError, match=rf"{path}:2: not JSON: .*utf-8"):
        list(iter_jsonl(path))


@pytest.mark.parametrize("torn_tail", ["raise", "skip"])
def test_a_bad_middle_line_names_path_and_line_whatever_the_tail_policy(tmp_path: Path, torn_tail: str) -> None:
    path = _write(tmp_path / "m.jsonl", b'{"a": 1}\n\n{"a": \n{"a": 2}\n')
    got = []
    with pytest.raises(JsonlError, match=rf"^{path}:3: not JSON: Expecting value"):
        got.extend(iter_jsonl(path, torn_tail=torn_tail))  # type: ignore[arg-type]
    assert got == [(1, {"a": 1})]  # lines before the bad one were yielded


def test_parse_and_what_and_error_class(tmp_path: Path) -> None:
    class RowError(ValueError):
        pass

    def row(obj: object) -> int:
        if not isinstance(obj, dict):
            raise TypeError(f"expected an object, got {type(obj).__name__}")
        return int(obj["n"])

    path = _write(tmp_path / "r.jsonl", b'{"n": 1}\n{"n": "2"}\n[3]\n')
    rows = iter_jsonl(path, row, what="a row", error=RowError)
    assert next(rows) == (1, 1)
    assert next(rows) == (2, 2)
    with pytest.raises(RowError, match=rf"^{path}:3: not a row: expected an object, got list$"):
        next(rows)


def test_a_complete_last_line_that_parse_rejects_is_never_forgiven(tmp_path: Path) -> None:
    def positive(obj: int) -> int:
        if obj <= 0:
            raise ValueError(f"{obj} is not positive")
        return obj

    path = _write(tmp_path / "p.jsonl", b"1\n-2")
    with pytest.raises(JsonlError, match=rf"{path}:2: not JSON: -2 is not positive"):
        list(iter_jsonl(path, positive, torn_tail="skip"))


def test_unicode_round_trips_and_u2028_is_not_a_line_break(tmp_path: Path) -> None:
    objs = [{"text": "héllo wörld ✓ 日本語 🎉"}, {"text": "line\u2028separator\u2029paragraph\x85next"}]
    path = tmp_path / "u.jsonl"
    path.write_text("".join(json.dumps(o, ensure_ascii=False) + "\n" for o in objs), encoding="utf-8")
    assert list(iter_jsonl(path)) == [(1, objs[0]), (2, objs[1])]


def test_bytes_that_are_not_utf8_name_the_line(tmp_path: Path) -> None:
    path = _write(tmp_path / "n.jsonl", b'{"a": 1}\n{"a": "\xff\xfe"}\n{"a": 2}\n')
    with pytest.raises(JsonlError, match=rf"^{path}:2: not JSON: .*can't decode byte 0xff"):
        list(iter_jsonl(path, torn_tail="skip"))


def test_nesting_deeper_than_the_parser_is_an_error_not_a_crash(tmp_path: Path) -> None:
    path = _write(tmp_path / "d.jsonl", b"[" * 100_000 + b"]" * 100_000 + b"\n{}\n")
    with pytest.raises(JsonlError, match=rf"^{path}:1: not JSON: maximum recursion depth"):
        list(iter_jsonl(path))


def test_unknown_tail_policy_is_refused(tmp_path: Path) -> None:
    path = _write(tmp_path / "x.jsonl", b"{}\n")
    with pytest.raises(ValueError, match="torn_tail='ignore' is not allowed; expected 'raise' or 'skip'"):
        list(iter_jsonl(path, torn_tail="ignore"))  # type: ignore[arg-type]
