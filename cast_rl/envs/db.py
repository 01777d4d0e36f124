"""Copy-on-write in-memory database shared by every domain environment.

A domain database is a dict of tables keyed like the source data files (file stem -> content).
Most tables are dicts of records keyed by id (``orders["#W2611340"]``); a few are plain lists.

``Database.fork()`` is O(records changed so far), not O(database): forks share every record
object they have not written.  The contract for tool code:

* read through ``db[name]`` (a :class:`Table` for dict tables, the raw object for list tables)
  and never mutate what a read returns;
* before changing a record, take a private copy with ``db[name].mutable(key)``;
  for a list table, ``db.mutable(name)`` returns a private copy of the whole list;
* add records with ``table[key] = value`` and remove them with ``table.pop(key)``.

Tests fuzz every tool on forks and check that the parent's state hash never moves, which catches
a tool that mutates a shared record.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Callable, Iterator, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

_MISSING = object()


def to_hashable(item: Any) -> Any:
    """The source benchmarks' canonical form: dicts sorted by key, lists and sets as tuples."""
    if isinstance(item, dict):
        return tuple((key, to_hashable(value)) for key, value in sorted(item.items()))
    if isinstance(item, list):
        return tuple(to_hashable(element) for element in item)
    if isinstance(item, set):
        return tuple(sorted(to_hashable(element) for element in item))
    return item


def source_hash(data: Mapping[str, Any]) -> str:
    """``sha256(str(to_hashable(data)))``: the hash the source benchmarks compare for reward."""
    return hashlib.sha256(str(to_hashable(dict(data))).encode("utf-8")).hexdigest()


def json_state_hash(data: Mapping[str, Any]) -> str:
    """sha256 hex of ``json.dumps(data, sort_keys=True)``: the hash written by ``env replay``."""
    return hashlib.sha256(json.dumps(dict(data), sort_keys=True).encode("utf-8")).hexdigest()


class Table(Mapping[str, Any]):
    """A dict table with per-record copy-on-write.

    ``_base`` is shared between forks and never mutated; ``_overlay`` holds records this fork has
    added or replaced (``_DELETED`` marks removals); ``_owned`` are overlay keys whose record
    objects belong to this fork alone and may be mutated in place.
    """

    _DELETED = object()

    __slots__ = ("_base", "_overlay", "_owned", "_order")

    def __init__(self, base: dict[str, Any]) -> None:
        self._base = base
        self._overlay: dict[str, Any] = {}
        self._owned: set[str] = set()
        self._order: list[str] | None = None  # keys added after the base, in insertion order

    def fork(self) -> Table:
        child = Table.__new__(Table)
        child._base = self._base
        child._overlay = dict(self._overlay)
        child._owned = set()
        child._order = list(self._order) if self._order is not None else None
        self._owned = set()  # overlay records are now shared with the child
        return child

    def __getitem__(self, key: str) -> Any:
        value = self._overlay.get(key, _MISSING)
        if value is _MISSING:
            return self._base[key]
        if value is Table._DELETED:
            raise KeyError(key)
        return value

    def __contains__(self, key: object) -> bool:
        value = self._overlay.get(key, _MISSING)  # type: ignore[call-overload]
        if value is _MISSING:
            return key in self._base
        return value is not Table._DELETED

    def __iter__(self) -> Iterator[str]:
        for key in self._base:
            if self._overlay.get(key, _MISSING) is not Table._DELETED:
                yield key
        for key in self._order or ():
            if key in self._overlay and self._overlay[key] is not Table._DELETED:
                yield key

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def mutable(self, key: str) -> Any:
        """The record under ``key`` as an object this fork owns and may change in place."""
        if key in self._owned:
            return self._overlay[key]
        record = copy.deepcopy(self[key])
        self._overlay[key] = record
        self._owned.add(key)
        return record

    def __setitem__(self, key: str, value: Any) -> None:
        if key not in self._base and key not in self._overlay:
            if self._order is None:
                self._order = []
            self._order.append(key)
        elif key not in self._base and self._overlay.get(key) is Table._DELETED:
            assert self._order is not None
            self._order.remove(key)
            self._order.append(key)
        self._overlay[key] = value
        self._owned.add(key)

    def pop(self, key: str, default: Any = _MISSING) -> Any:
        if key not in self:
            if default is _MISSING:
                raise KeyError(key)
            return default
        value = self[key]
        self._overlay[key] = Table._DELETED
        self._owned.discard(key)
        return value

    def touched_keys(self) -> set[str]:
        """Keys this table (or a fork ancestor) may have changed relative to the shared base."""
        return set(self._overlay)

    def to_dict(self) -> dict[str, Any]:
        return {key: self[key] for key in self}


class Database(Mapping[str, Any]):
    """Tables keyed like the source data files; see the module docstring for the write contract."""

    __slots__ = ("_tables", "_lists", "_owned_lists", "clock")

    def __init__(
        self, tables: Mapping[str, Any], clock: Callable[[], datetime] = datetime.now
    ) -> None:
        self.clock = clock
        """What tools read as "now" (the source calls ``datetime.now()``); injectable for replays."""
        self._tables: dict[str, Table] = {}
        self._lists: dict[str, Any] = {}
        self._owned_lists: set[str] = set()
        for name, content in tables.items():
            if isinstance(content, dict):
                self._tables[name] = Table(content)
            else:
                self._lists[name] = content

    @classmethod
    def load(cls, db_dir: str | Path, clock: Callable[[], datetime] = datetime.now) -> Database:
        """Read every ``*.json`` file of a directory as one table named by its file stem."""
        db_dir = Path(db_dir)
        files = sorted(db_dir.glob("*.json"))
        if not files:
            raise FileNotFoundError(f"no database files (*.json) in {db_dir}")
        return cls({path.stem: json.loads(path.read_text()) for path in files}, clock=clock)

    def fork(self) -> Database:
        child = Database.__new__(Database)
        child.clock = self.clock
        child._tables = {name: table.fork() for name, table in self._tables.items()}
        child._lists = dict(self._lists)
        child._owned_lists = set()
        self._owned_lists = set()
        return child

    def __getitem__(self, name: str) -> Any:
        if name in self._tables:
            return self._tables[name]
        return self._lists[name]

    def __iter__(self) -> Iterator[str]:
        yield from self._tables
        yield from self._lists

    def __len__(self) -> int:
        return len(self._tables) + len(self._lists)

    def mutable(self, name: str) -> Any:
        """A private, mutable copy of a list table (dict tables use ``Table.mutable``)."""
        if name in self._tables:
            raise TypeError(f"table {name!r} is a dict table: use db[{name!r}].mutable(key)")
        if name not in self._owned_lists:
            self._lists[name] = copy.deepcopy(self._lists[name])
            self._owned_lists.add(name)
        return self._lists[name]

    def to_dict(self) -> dict[str, Any]:
        """The whole state as plain data, keyed like the source data files."""
        out: dict[str, Any] = {name: table.to_dict() for name, table in self._tables.items()}
        out.update(self._lists)
        return out

    def source_hash(self) -> str:
        return source_hash(self.to_dict())

    def state_hash(self) -> str:
        return json_state_hash(self.to_dict())

    def same_state(self, other: Database) -> bool:
        """Whether two forks of one base have equal ``source_hash`` without hashing everything.

        Only records either side touched are compared, in the source's canonical form, so
        ``5`` vs ``5.0`` or list order still count as differences, exactly as in the source.
        """
        if self._tables.keys() != other._tables.keys() or self._lists.keys() != other._lists.keys():
            return self.source_hash() == other.source_hash()
        for name, table in self._tables.items():
            other_table = other._tables[name]
            if table._base is not other_table._base:
                return self.source_hash() == other.source_hash()
            for key in table.touched_keys() | other_table.touched_keys():
                mine, theirs = table.get(key, _MISSING), other_table.get(key, _MISSING)
                if mine is theirs:
                    continue
                if mine is _MISSING or theirs is _MISSING:
                    return False
                if str(to_hashable(mine)) != str(to_hashable(theirs)):
                    return False
        for name, content in self._lists.items():
            theirs = other._lists[name]
            if content is not theirs and str(to_hashable(content)) != str(to_hashable(theirs)):
                return False
        return True
