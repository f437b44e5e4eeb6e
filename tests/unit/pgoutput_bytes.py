"""pgoutput protocol version 1 messages built as bytes, the way a server sends them, so the
decoder and the mapping are tested without one.

Tuple values are text, None for a null ('n') or `TOAST` for an unchanged TOAST value ('u').
See https://www.postgresql.org/docs/current/protocol-logicalrep-message-formats.html
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

TOAST = b"u"
"""An unchanged TOAST value in a tuple."""

PG_TS = 789_000_000_000
"""A commit time in microseconds since 2000-01-01 (PostgreSQL's epoch)."""

TupleValue = str | bytes | None


def cstr(text: str) -> bytes:
    return text.encode() + b"\0"


def tuple_data(*values: TupleValue) -> bytes:
    out = struct.pack("!H", len(values))
    for value in values:
        if value is None:
            out += b"n"
        elif value == TOAST:
            out += b"u"
        else:
            assert isinstance(value, str)
            encoded = value.encode()
            out += b"t" + struct.pack("!I", len(encoded)) + encoded
    return out


def begin(final_lsn: int, xid: int, commit_ts: int = PG_TS) -> bytes:
    return b"B" + struct.pack("!QqI", final_lsn, commit_ts, xid)


def commit(commit_lsn: int, end_lsn: int, commit_ts: int = PG_TS) -> bytes:
    return b"C" + struct.pack("!BQQq", 0, commit_lsn, end_lsn, commit_ts)


def relation(
    relation_id: int,
    namespace: str,
    name: str,
    columns: Sequence[tuple[str, int, bool]],
    identity: str = "d",
) -> bytes:
    """`columns`: (name, type OID, part of the replica identity)."""
    out = b"R" + struct.pack("!I", relation_id) + cstr(namespace) + cstr(name) + identity.encode()
    out += struct.pack("!H", len(columns))
    for column, type_oid, is_key in columns:
        out += bytes([int(is_key)]) + cstr(column) + struct.pack("!Ii", type_oid, -1)
    return out


def insert(relation_id: int, new: Sequence[TupleValue]) -> bytes:
    return b"I" + struct.pack("!I", relation_id) + b"N" + tuple_data(*new)


def update(
    relation_id: int,
    new: Sequence[TupleValue],
    *,
    old: Sequence[TupleValue] | None = None,
    old_is_key_only: bool = True,
) -> bytes:
    """Without `old`, as the server sends an update that kept the key under default identity."""
    out = b"U" + struct.pack("!I", relation_id)
    if old is not None:
        out += (b"K" if old_is_key_only else b"O") + tuple_data(*old)
    return out + b"N" + tuple_data(*new)


def delete(relation_id: int, old: Sequence[TupleValue], *, old_is_key_only: bool = True) -> bytes:
    return (
        b"D"
        + struct.pack("!I", relation_id)
        + (b"K" if old_is_key_only else b"O")
        + tuple_data(*old)
    )


def truncate(*relation_ids: int, options: int = 0) -> bytes:
    return (
        b"T"
        + struct.pack("!IB", len(relation_ids), options)
        + struct.pack(f"!{len(relation_ids)}I", *relation_ids)
    )


def origin(commit_lsn: int, name: str) -> bytes:
    return b"O" + struct.pack("!Q", commit_lsn) + cstr(name)


def type_message(type_oid: int, namespace: str, name: str) -> bytes:
    return b"Y" + struct.pack("!I", type_oid) + cstr(namespace) + cstr(name)
