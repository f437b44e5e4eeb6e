"""A pure decoder of pgoutput (protocol version 1) messages, the payload of XLogData.

No I/O and no state: `decode(bytes)` returns one message. What the messages mean for DBLog
(positions, keys, TOAST) is decided in `changes.py`.
See https://www.postgresql.org/docs/current/protocol-logicalrep-message-formats.html
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import Enum
from typing import Final, Literal

PG_EPOCH_MICROS = 946_684_800_000_000
"""2000-01-01 (PostgreSQL's epoch) in microseconds since the Unix epoch."""


class DecodeError(ValueError):
    """Bytes that are not a pgoutput protocol version 1 message."""


class UnchangedToast(Enum):
    """The kind of a tuple value pgoutput did not send: a large value an UPDATE left alone."""

    VALUE = "u"

    def __repr__(self) -> str:
        return "UNCHANGED_TOAST"


UNCHANGED_TOAST: Final = UnchangedToast.VALUE

TupleValue = str | None | Literal[UnchangedToast.VALUE]
"""One value of a tuple: the text PostgreSQL printed, None for NULL, or `UNCHANGED_TOAST`."""

TupleData = tuple[TupleValue, ...]


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    type_oid: int
    type_modifier: int
    is_key: bool
    """Part of the replica identity (the primary key by default, every column with FULL)."""


@dataclass(frozen=True, slots=True)
class Begin:
    final_lsn: int
    """The LSN of the transaction's commit record: its `commit` position."""
    commit_ts_us: int
    """Commit time in microseconds since the Unix epoch."""
    xid: int


@dataclass(frozen=True, slots=True)
class Commit:
    flags: int
    commit_lsn: int
    end_lsn: int
    commit_ts_us: int


@dataclass(frozen=True, slots=True)
class OriginMessage:
    """The replication origin a transaction came from (not an event's `core.event.Origin`)."""

    commit_lsn: int
    name: str


@dataclass(frozen=True, slots=True)
class Relation:
    relation_id: int
    namespace: str
    """Empty for pg_catalog, as pgoutput sends it."""
    name: str
    replica_identity: str
    """'d' default (primary key), 'n' nothing, 'f' full, 'i' index."""
    columns: tuple[Column, ...]


@dataclass(frozen=True, slots=True)
class Type:
    type_oid: int
    namespace: str
    name: str


@dataclass(frozen=True, slots=True)
class Insert:
    relation_id: int
    new: TupleData


@dataclass(frozen=True, slots=True)
class Update:
    relation_id: int
    old: TupleData | None
    """The old replica identity ('K', key columns only) or old row ('O', FULL identity); None when
    the key did not change under the default identity."""
    old_is_key_only: bool
    new: TupleData


@dataclass(frozen=True, slots=True)
class Delete:
    relation_id: int
    old: TupleData
    old_is_key_only: bool


@dataclass(frozen=True, slots=True)
class Truncate:
    options: int
    relation_ids: tuple[int, ...]


Message = Begin | Commit | OriginMessage | Relation | Type | Insert | Update | Delete | Truncate


_U8 = struct.Struct("!B")
_U16 = struct.Struct("!H")
_U32 = struct.Struct("!I")
_I32 = struct.Struct("!i")
_U64 = struct.Struct("!Q")
_I64 = struct.Struct("!q")
_BEGIN = struct.Struct("!QqI")  # after 'B': final LSN, commit time, xid
_COMMIT = struct.Struct("!BQQq")  # after 'C': flags, commit LSN, end LSN, commit time
_TEXT, _NULL, _UNCHANGED = b"tnu"

U32_AT: Final = _U32.unpack_from
"""`U32_AT(data, offset)`: the 1-tuple of the unsigned 32-bit big-endian integer there."""
BEGIN_AT: Final = _BEGIN.unpack_from
"""`BEGIN_AT(data, offset)`: a Begin's final LSN, commit time (PostgreSQL's epoch) and xid."""
BEGIN_SIZE: Final = _BEGIN.size
COMMIT_AT: Final = _COMMIT.unpack_from
"""`COMMIT_AT(data, offset)`: a Commit's flags, commit LSN, end LSN and commit time."""
COMMIT_SIZE: Final = _COMMIT.size


class _Reader:
    """A cursor over one message; reads past its end raise DecodeError (see `decode`)."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, fmt: struct.Struct) -> int:
        (value,) = fmt.unpack_from(self.data, self.pos)
        self.pos += fmt.size
        return int(value)

    def byte(self) -> str:
        pos = self.pos
        if pos >= len(self.data):
            raise DecodeError(f"message ends early at byte {pos}")
        self.pos = pos + 1
        return chr(self.data[pos])

    def string(self) -> str:
        end = self.data.find(b"\0", self.pos)
        if end < 0:
            raise DecodeError(f"unterminated string at byte {self.pos}")
        text = self.data[self.pos : end].decode("utf-8")
        self.pos = end + 1
        return text

    def tuple_data(self) -> TupleData:
        values, self.pos = _tuple_data(self.data, self.pos)
        return values

    def end(self) -> None:
        if self.pos != len(self.data):
            raise DecodeError(f"{len(self.data) - self.pos} bytes left after the message")


def _tuple_data(data: bytes, pos: int) -> tuple[TupleData, int]:
    """The values of the tuple at `pos`, and where it ends: a row message's whole cost, so it
    keeps to locals."""
    size = len(data)
    (count,) = _U16.unpack_from(data, pos)
    pos += 2
    values: list[TupleValue] = []
    append = values.append
    for _ in range(count):
        if pos >= size:
            raise DecodeError(f"message ends early at byte {pos}")
        kind = data[pos]
        if kind == _TEXT:
            (length,) = _U32.unpack_from(data, pos + 1)
            start = pos + 5
            pos = start + length
            if pos > size:
                raise DecodeError(f"value of {length} bytes runs past the message end")
            append(data[start:pos].decode("utf-8"))
        elif kind == _NULL:
            append(None)
            pos += 1
        elif kind == _UNCHANGED:
            append(UNCHANGED_TOAST)
            pos += 1
        else:
            raise DecodeError(f"unknown tuple value kind {chr(kind)!r} (protocol version 1)")
    return tuple(values), pos


def _insert(data: bytes) -> Insert:
    """An Insert without a `_Reader`: nearly every message is one."""
    (relation_id,) = _U32.unpack_from(data, 1)
    if data[5:6] != b"N":
        raise DecodeError("insert without a new tuple")
    values, end = _tuple_data(data, 6)
    if end != len(data):
        raise DecodeError(f"{len(data) - end} bytes left after the message")
    return Insert(relation_id, values)


def _timestamp(pg_micros: int) -> int:
    return pg_micros + PG_EPOCH_MICROS


def decode(data: bytes) -> Message:
    """Decode one pgoutput message; raises DecodeError on anything else."""
    data = bytes(data)
    try:
        tag = data[:1]
        if tag == b"I":
            return _insert(data)
        # A transaction's frame, read without a `_Reader`: a small transaction's cost.
        if tag == b"B" and len(data) == 1 + _BEGIN.size:
            final_lsn, pg_micros, xid = _BEGIN.unpack_from(data, 1)
            return Begin(final_lsn, _timestamp(pg_micros), xid)
        if tag == b"C" and len(data) == 1 + _COMMIT.size:
            flags, commit_lsn, end_lsn, pg_micros = _COMMIT.unpack_from(data, 1)
            return Commit(flags, commit_lsn, end_lsn, _timestamp(pg_micros))
        return _decode(_Reader(data))
    except struct.error as exc:  # a fixed-size field runs past the end
        raise DecodeError(f"message ends early: {exc}") from None


def _decode(r: _Reader) -> Message:
    """Any message but an Insert (`_insert` reads those, without a reader); a Begin or Commit
    of the wrong length too, for its error."""
    tag = r.byte()
    message: Message
    if tag == "B":
        message = Begin(r.take(_U64), _timestamp(r.take(_I64)), r.take(_U32))
    elif tag == "C":
        message = Commit(r.take(_U8), r.take(_U64), r.take(_U64), _timestamp(r.take(_I64)))
    elif tag == "O":
        message = OriginMessage(r.take(_U64), r.string())
    elif tag == "R":
        relation_id, namespace, name = r.take(_U32), r.string(), r.string()
        identity = r.byte()
        columns = []
        for _ in range(r.take(_U16)):
            flags = r.take(_U8)
            column_name = r.string()
            columns.append(Column(column_name, r.take(_U32), r.take(_I32), bool(flags & 1)))
        message = Relation(relation_id, namespace, name, identity, tuple(columns))
    elif tag == "Y":
        message = Type(r.take(_U32), r.string(), r.string())
    elif tag == "U":
        relation_id = r.take(_U32)
        old: TupleData | None = None
        marker = r.byte()
        key_only = marker == "K"
        if marker in "KO":
            old = r.tuple_data()
            marker = r.byte()
        if marker != "N":
            raise DecodeError(f"update: expected a new tuple, got {marker!r}")
        message = Update(relation_id, old, key_only, r.tuple_data())
    elif tag == "D":
        relation_id = r.take(_U32)
        marker = r.byte()
        if marker not in "KO":
            raise DecodeError(f"delete: expected an old tuple, got {marker!r}")
        message = Delete(relation_id, r.tuple_data(), marker == "K")
    elif tag == "T":
        count, options = r.take(_U32), r.take(_U8)
        message = Truncate(options, tuple(r.take(_U32) for _ in range(count)))
    else:
        raise DecodeError(f"unknown pgoutput message {tag!r}")
    r.end()
    return message
