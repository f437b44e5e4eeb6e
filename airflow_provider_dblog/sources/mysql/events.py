"""Binlog events as bytes: the event header, the bodies of the events the reader needs, and the
table map a rows event is decoded by.

Pure functions of bytes, no socket (`wire.py` brings the events, `rows.py` decodes row images):
each reads at an offset of the event's own bytes with `struct`'s `unpack_from`, never copying
the rest of the event. Layouts are MySQL's replication protocol ("Binlog Event" in the MySQL
source documentation), which MariaDB shares but for its own GTID events.

An event is `header (19 bytes) + body (+ a CRC32 of 4 bytes when binlog_checksum is on)`.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import NamedTuple

from airflow_provider_dblog.sources.base import SourceError

HEADER = struct.Struct("<IBIIIH")
"""timestamp, type, server_id, event_size, log_pos (the next event's offset), flags."""
HEADER_SIZE = HEADER.size

# Event types (MySQL's Log_event_type; MariaDB's own from 160).
QUERY = 2
ROTATE = 4
FORMAT_DESCRIPTION = 15
XID = 16
TABLE_MAP = 19
WRITE_ROWS_V1 = 23
UPDATE_ROWS_V1 = 24
DELETE_ROWS_V1 = 25
HEARTBEAT = 27
WRITE_ROWS = 30
UPDATE_ROWS = 31
DELETE_ROWS = 32
GTID = 33
XA_PREPARE = 38
PARTIAL_UPDATE_ROWS = 39
HEARTBEAT_V2 = 41
MARIADB_GTID = 162
MARIADB_COMPRESSED_ROWS = frozenset((166, 167, 168, 169, 170, 171))

ROWS_V2 = frozenset((WRITE_ROWS, UPDATE_ROWS, DELETE_ROWS))
WRITES = frozenset((WRITE_ROWS_V1, WRITE_ROWS))
UPDATES = frozenset((UPDATE_ROWS_V1, UPDATE_ROWS))

_U16 = struct.Struct("<H").unpack_from
_U32 = struct.Struct("<I").unpack_from
_U64 = struct.Struct("<Q").unpack_from
_QUERY_HEAD = struct.Struct("<IIBHH")
_MARIADB_GTID = struct.Struct("<QIB")
_MYSQL_GTID = struct.Struct("<B16sQ")


def read_lenenc(data: bytes, pos: int) -> tuple[int, int]:
    """A length-encoded integer at `pos`: its value and the offset after it."""
    first = data[pos]
    if first < 0xFB:
        return first, pos + 1
    if first == 0xFC:
        return _U16(data, pos + 1)[0], pos + 3
    if first == 0xFD:
        return int.from_bytes(data[pos + 1 : pos + 4], "little"), pos + 4
    if first == 0xFE:
        return _U64(data, pos + 1)[0], pos + 9
    raise SourceError(f"binlog: malformed length-encoded integer 0x{first:02x} at {pos}")


def post_header_lengths(format_description: bytes) -> bytes:
    """The post-header length of each event type (type n at index n - 1), from a format
    description event: binlog version (2), server version (50), creation time (4), header
    length (1), then one byte per type (trailing bytes, the checksum's, are never indexed)."""
    return format_description[HEADER_SIZE + 57 :]


@dataclass(frozen=True, slots=True)
class Query:
    schema: str
    sql: str


def query(event: bytes, end: int) -> Query:
    """A QUERY event's default schema and statement text (`end`: before the checksum)."""
    _, _, schema_length, _, status_length = _QUERY_HEAD.unpack_from(event, HEADER_SIZE)
    pos = HEADER_SIZE + _QUERY_HEAD.size + status_length
    schema = event[pos : pos + schema_length].decode("utf-8", "replace")
    pos += schema_length + 1
    return Query(schema, event[pos:end].decode("utf-8", "replace"))


def rotate(event: bytes, end: int) -> str:
    """The binlog file a ROTATE event names (the stream goes on there)."""
    return event[HEADER_SIZE + 8 : end].decode("ascii")


def heartbeat_file(event: bytes, end: int) -> str:
    """The binlog file of a HEARTBEAT event (its header's log_pos is the offset sent up to)."""
    return event[HEADER_SIZE:end].rstrip(b"\0").decode("ascii")


def heartbeat_v2(event: bytes, end: int) -> tuple[str, int]:
    """MySQL 8's HEARTBEAT_V2: the file and offset, as type-length-value fields."""
    pos, file, offset = HEADER_SIZE, "", 0
    while pos < end:
        kind = event[pos]
        length, pos = read_lenenc(event, pos + 1)
        value = event[pos : pos + length]
        if kind == 0:
            file = value.decode("ascii")
        elif kind == 1:
            offset = read_lenenc(value, 0)[0]
        pos += length
    return file, offset


@dataclass(frozen=True, slots=True)
class Gtid:
    gtid: str
    txid: int | None
    standalone: bool | None
    """MariaDB's FL_STANDALONE: a group of one statement without BEGIN/COMMIT (DDL); None
    where the server does not say (MySQL)."""


_MARIADB_STANDALONE = 0x01


def mariadb_gtid(event: bytes, server_id: int) -> Gtid:
    seq_no, domain, flags = _MARIADB_GTID.unpack_from(event, HEADER_SIZE)
    return Gtid(f"{domain}-{server_id}-{seq_no}", seq_no, bool(flags & _MARIADB_STANDALONE))


def mysql_gtid(event: bytes) -> Gtid:
    _, sid, gno = _MYSQL_GTID.unpack_from(event, HEADER_SIZE)
    h = sid.hex()
    return Gtid(f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}:{gno}", None, None)


@dataclass(frozen=True, slots=True)
class TableMap:
    """A TABLE_MAP event: the table a table id stands for until the next map of that id, and
    its columns as the binlog logs them (type, metadata, nullability; names only when the
    server logs optional metadata, binlog_row_metadata = FULL)."""

    table_id: int
    schema: str
    table: str
    types: bytes
    metadata: tuple[int, ...]
    """Each column's type metadata as one integer (0 for types without)."""
    names: tuple[str, ...] | None

    @property
    def shape(self) -> tuple[bytes, tuple[int, ...], tuple[str, ...] | None]:
        """What decides how rows of this map decode: equal shapes share a decoder."""
        return self.types, self.metadata, self.names


# Column types (MySQL's enum_field_types) and the bytes of metadata each carries.
TYPE_TINY = 1
TYPE_SHORT = 2
TYPE_LONG = 3
TYPE_FLOAT = 4
TYPE_DOUBLE = 5
TYPE_NULL = 6
TYPE_TIMESTAMP = 7
TYPE_LONGLONG = 8
TYPE_INT24 = 9
TYPE_DATE = 10
TYPE_TIME = 11
TYPE_DATETIME = 12
TYPE_YEAR = 13
TYPE_VARCHAR = 15
TYPE_BIT = 16
TYPE_TIMESTAMP2 = 17
TYPE_DATETIME2 = 18
TYPE_TIME2 = 19
TYPE_JSON = 245
TYPE_NEWDECIMAL = 246
TYPE_ENUM = 247
TYPE_SET = 248
TYPE_TINY_BLOB = 249
TYPE_MEDIUM_BLOB = 250
TYPE_LONG_BLOB = 251
TYPE_BLOB = 252
TYPE_VAR_STRING = 253
TYPE_STRING = 254
TYPE_GEOMETRY = 255

_METADATA_BYTES = {
    TYPE_FLOAT: 1,
    TYPE_DOUBLE: 1,
    TYPE_TIMESTAMP2: 1,
    TYPE_DATETIME2: 1,
    TYPE_TIME2: 1,
    TYPE_JSON: 1,
    TYPE_BLOB: 1,
    TYPE_TINY_BLOB: 1,
    TYPE_MEDIUM_BLOB: 1,
    TYPE_LONG_BLOB: 1,
    TYPE_GEOMETRY: 1,
    TYPE_VARCHAR: 2,
    TYPE_VAR_STRING: 2,
    TYPE_BIT: 2,
    TYPE_NEWDECIMAL: 2,
    TYPE_STRING: 2,
    TYPE_ENUM: 2,
    TYPE_SET: 2,
}
_BIG_ENDIAN_METADATA = frozenset((TYPE_STRING, TYPE_NEWDECIMAL, TYPE_ENUM, TYPE_SET))
"""Two metadata bytes read as (first << 8) | second: real type and length, precision and
scale; the others' two bytes are little-endian."""
_COLUMN_NAME = 4


def table_map(event: bytes, end: int, post_header: int) -> TableMap:
    """A TABLE_MAP event's table and columns (`post_header`: 6 on old servers, else 8)."""
    pos = HEADER_SIZE
    if post_header == 6:
        table_id, pos = _U32(event, pos)[0], pos + 4
    else:
        table_id, pos = int.from_bytes(event[pos : pos + 6], "little"), pos + 6
    pos += 2  # flags
    length = event[pos]
    schema = event[pos + 1 : pos + 1 + length].decode("utf-8")
    pos += length + 2
    length = event[pos]
    table = event[pos + 1 : pos + 1 + length].decode("utf-8")
    pos += length + 2
    count, pos = read_lenenc(event, pos)
    types = bytes(event[pos : pos + count])
    pos += count
    metadata_length, pos = read_lenenc(event, pos)
    metadata_end = pos + metadata_length
    metadata = []
    for kind in types:
        size = _METADATA_BYTES.get(kind, 0)
        if size == 1:
            metadata.append(event[pos])
        elif size == 2 and kind in _BIG_ENDIAN_METADATA:
            metadata.append(event[pos] << 8 | event[pos + 1])
        elif size == 2:
            metadata.append(_U16(event, pos)[0])
        else:
            metadata.append(0)
        pos += size
    if pos != metadata_end:
        raise SourceError(f"binlog: table map of {schema}.{table} has malformed column metadata")
    pos = metadata_end + (count + 7) // 8  # the nullability bitmap
    return TableMap(table_id, schema, table, types, tuple(metadata), _names(event, pos, end))


def _names(event: bytes, pos: int, end: int) -> tuple[str, ...] | None:
    """The column names among the optional metadata fields (type, length, value), if any."""
    while pos < end:
        kind = event[pos]
        length, pos = read_lenenc(event, pos + 1)
        if kind == _COLUMN_NAME:
            names, at, stop = [], pos, pos + length
            while at < stop:
                size, at = read_lenenc(event, at)
                names.append(event[at : at + size].decode("utf-8"))
                at += size
            return tuple(names)
        pos += length
    return None


class RowsHead(NamedTuple):
    """What a rows event says before its row images: the table id, the
    bitmaps of columns present (the after image's too for an update), and where images start.
    A named tuple: one is made per rows event, and a frozen dataclass's fields cost a call
    each to set."""

    table_id: int
    present: bytes
    present_after: bytes
    start: int


def rows_head(event: bytes, kind: int, post_header: int) -> RowsHead:
    pos = HEADER_SIZE
    if post_header == 6:
        table_id, pos = _U32(event, pos)[0], pos + 4
    else:
        table_id, pos = int.from_bytes(event[pos : pos + 6], "little"), pos + 6
    pos += 2  # flags
    if kind in ROWS_V2:
        (extra,) = _U16(event, pos)
        pos += extra  # the extra data's length counts its own two bytes
    count, pos = read_lenenc(event, pos)
    size = (count + 7) // 8
    present = bytes(event[pos : pos + size])
    pos += size
    present_after = present
    if kind in UPDATES:
        present_after = bytes(event[pos : pos + size])
        pos += size
    return RowsHead(table_id, present, present_after, pos)
