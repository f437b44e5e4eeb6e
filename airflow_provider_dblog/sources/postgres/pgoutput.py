"""A pure decoder of pgoutput (protocol version 1) messages, the payload of XLogData.

No I/O and no state: `decode(bytes)` returns one message. What the messages mean for DBLog
(positions, keys, TOAST) is decided in `changes.py`.
See https://www.postgresql.org/docs/current/protocol-logicalrep-message-formats.html
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import StrEnum

PG_EPOCH_MICROS = 946_684_800_000_000
"""2000-01-01 (PostgreSQL's epoch) in microseconds since the Unix epoch."""


class DecodeError(ValueError):
    """Bytes that are not a pgoutput protocol version 1 message."""


class Kind(StrEnum):
    """The kind of one value in a tuple."""

    NULL = "n"
    UNCHANGED_TOAST = "u"
    TEXT = "t"


@dataclass(frozen=True, slots=True)
class Value:
    kind: Kind
    text: str | None = None


TupleData = tuple[Value, ...]


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


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, fmt: str) -> int:
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.data):
            raise DecodeError(f"message ends early at byte {self.pos}")
        (value,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += size
        return int(value)

    def byte(self) -> str:
        return chr(self.take("!B"))

    def string(self) -> str:
        end = self.data.find(b"\0", self.pos)
        if end < 0:
            raise DecodeError(f"unterminated string at byte {self.pos}")
        text = self.data[self.pos : end].decode("utf-8")
        self.pos = end + 1
        return text

    def tuple_data(self) -> TupleData:
        values = []
        for _ in range(self.take("!H")):
            kind = self.byte()
            if kind == "n":
                values.append(Value(Kind.NULL))
            elif kind == "u":
                values.append(Value(Kind.UNCHANGED_TOAST))
            elif kind == "t":
                length = self.take("!I")
                if self.pos + length > len(self.data):
                    raise DecodeError(f"value of {length} bytes runs past the message end")
                text = self.data[self.pos : self.pos + length].decode("utf-8")
                self.pos += length
                values.append(Value(Kind.TEXT, text))
            else:
                raise DecodeError(f"unknown tuple value kind {kind!r} (protocol version 1)")
        return tuple(values)

    def end(self) -> None:
        if self.pos != len(self.data):
            raise DecodeError(f"{len(self.data) - self.pos} bytes left after the message")


def _timestamp(pg_micros: int) -> int:
    return pg_micros + PG_EPOCH_MICROS


def decode(data: bytes) -> Message:
    """Decode one pgoutput message; raises DecodeError on anything else."""
    r = _Reader(bytes(data))
    tag = r.byte()
    message: Message
    if tag == "B":
        message = Begin(r.take("!Q"), _timestamp(r.take("!q")), r.take("!I"))
    elif tag == "C":
        message = Commit(r.take("!B"), r.take("!Q"), r.take("!Q"), _timestamp(r.take("!q")))
    elif tag == "O":
        message = OriginMessage(r.take("!Q"), r.string())
    elif tag == "R":
        relation_id, namespace, name = r.take("!I"), r.string(), r.string()
        identity = r.byte()
        columns = []
        for _ in range(r.take("!H")):
            flags = r.take("!B")
            column_name = r.string()
            columns.append(Column(column_name, r.take("!I"), r.take("!i"), bool(flags & 1)))
        message = Relation(relation_id, namespace, name, identity, tuple(columns))
    elif tag == "Y":
        message = Type(r.take("!I"), r.string(), r.string())
    elif tag == "I":
        relation_id = r.take("!I")
        if r.byte() != "N":
            raise DecodeError("insert without a new tuple")
        message = Insert(relation_id, r.tuple_data())
    elif tag == "U":
        relation_id = r.take("!I")
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
        relation_id = r.take("!I")
        marker = r.byte()
        if marker not in "KO":
            raise DecodeError(f"delete: expected an old tuple, got {marker!r}")
        message = Delete(relation_id, r.tuple_data(), marker == "K")
    elif tag == "T":
        count, options = r.take("!I"), r.take("!B")
        message = Truncate(options, tuple(r.take("!I") for _ in range(count)))
    else:
        raise DecodeError(f"unknown pgoutput message {tag!r}")
    r.end()
    return message
