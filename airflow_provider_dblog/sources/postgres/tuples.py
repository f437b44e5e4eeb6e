"""A relation's tuples as rows: the PostgreSQL mapping's hot loop, compiled with mypyc.

A Relation message fixes a table's columns and their converters until the next one, and nearly
every message after it is a row change of that table. `TupleReader` holds what those columns
need, chosen once per Relation message (`changes._Table.of`), and reads a tuple into its row and
its key in one pass: from a decoded `pgoutput.TupleData`, or straight from a message's bytes with
no message object or tuple of values in between.

This module and `changes.py` are compiled to C by mypyc when it is available
(`scripts/compile.py`, run by setup and by the tests); the same source runs as plain Python
otherwise, and the tests run both (tests/unit/sources/postgres/test_fast_path.py). So it is
written for mypyc: typed locals, a native class, loops over indexes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from airflow_provider_dblog.core.event import JsonValue, Row
from airflow_provider_dblog.sources.postgres import pgoutput

Parser = Callable[[str], JsonValue]

_TEXT: Final = 116  # b"t": a text value, its length, its bytes
_NULL: Final = 110  # b"n"
_KEEP: Final = 0
"""The value's JSON is its text."""
_INT: Final = 1
"""An integer: read from the digits' bytes (`int` reads ASCII digits from bytes as from text)."""
_PARSE: Final = 2
"""Another type: the column's converter of the decoded text."""


class TupleReader:
    """One relation's tuples as rows of JSON values, and their keys."""

    def __init__(
        self,
        names: tuple[str, ...],
        parsers: tuple[Parser | None, ...],
        key_indexes: tuple[int, ...],
    ) -> None:
        self.names = names
        self.parsers = parsers
        self.key_indexes = key_indexes
        self.count = len(names)
        self.count_bytes = self.count.to_bytes(2, "big")
        self.kinds = [_KEEP if p is None else _INT if p is int else _PARSE for p in parsers]

    def row(self, values: pgoutput.TupleData) -> Row:
        """A whole tuple (its length checked, no unchanged TOAST value) as its row."""
        names, parsers = self.names, self.parsers
        row: Row = {}
        for i in range(self.count):
            value = values[i]
            if value is None:
                row[names[i]] = None
            else:
                assert isinstance(value, str)
                parse = parsers[i]
                row[names[i]] = value if parse is None else parse(value)
        return row

    def read(self, data: bytes, at: int) -> tuple[Row, Row, int] | None:
        """The tuple at `at` in a message's bytes (an Insert's new tuple, an Update's old and
        new ones, a Delete's old one) as its row, its key and the offset where it ends.

        None for anything but a whole tuple of text and null values (an unchanged TOAST value,
        a wrong column count, a tuple running past the message, a value its converter
        refuses): the caller then decodes the message the general way, which gives the row or
        raises the error as always."""
        end = len(data)
        if data[at : at + 2] != self.count_bytes:
            return None
        names, kinds, parsers = self.names, self.kinds, self.parsers
        p = at + 2
        row: Row = {}
        try:
            for i in range(self.count):
                if p >= end:
                    return None
                kind = data[p]
                if kind == _NULL:
                    row[names[i]] = None
                    p += 1
                    continue
                if kind != _TEXT or p + 5 > end:
                    return None
                start = p + 5
                p = start + (
                    (data[p + 1] << 24) | (data[p + 2] << 16) | (data[p + 3] << 8) | data[p + 4]
                )
                if p > end:
                    return None
                how = kinds[i]
                if how == _KEEP:
                    row[names[i]] = data[start:p].decode()
                elif how == _INT:
                    row[names[i]] = int(data[start:p])
                else:
                    parse = parsers[i]
                    assert parse is not None
                    row[names[i]] = parse(data[start:p].decode())
        except Exception:  # a value its converter refuses: the general way raises it
            return None
        key: Row = {}
        for i in self.key_indexes:
            name = names[i]
            key[name] = row[name]
        return row, key, p
