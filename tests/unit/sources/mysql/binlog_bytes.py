"""Binlog table maps and rows events built as the server logs them, for tests of the mapping
and the row decoder without a server: an int32 column (`LONG`) or a utf8mb4 `VARCHAR(n)` each,
laid out as MySQL's replication protocol describes."""

from __future__ import annotations

import struct
from collections.abc import Sequence

from airflow_provider_dblog.sources.mysql import events as ev
from airflow_provider_dblog.sources.mysql.records import RowKind, Rows

INT = ev.TYPE_LONG
VARCHAR = ev.TYPE_VARCHAR
_KIND_CODES = {
    RowKind.INSERT: ev.WRITE_ROWS_V1,
    RowKind.UPDATE: ev.UPDATE_ROWS_V1,
    RowKind.DELETE: ev.DELETE_ROWS_V1,
}
Image = dict[str, object]


def table_map(
    table_id: int,
    schema: str,
    table: str,
    columns: Sequence[tuple[str, int]],
    *,
    names: bool = True,
) -> ev.TableMap:
    """The map as `events.table_map` reads it from the bytes `table_map_event` builds."""
    data = table_map_event(table_id, schema, table, columns, names=names)
    return ev.table_map(data, len(data), 8)


def table_map_event(
    table_id: int,
    schema: str,
    table: str,
    columns: Sequence[tuple[str, int]],
    *,
    names: bool = True,
) -> bytes:
    body = table_id.to_bytes(6, "little") + b"\0\0"
    body += bytes([len(schema)]) + schema.encode() + b"\0"
    body += bytes([len(table)]) + table.encode() + b"\0"
    body += bytes([len(columns)]) + bytes(kind for _, kind in columns)
    metadata = b"".join(struct.pack("<H", 255 * 4) if k == VARCHAR else b"" for _, k in columns)
    body += bytes([len(metadata)]) + metadata + b"\xff" * ((len(columns) + 7) // 8)
    if names:
        listed = b"".join(bytes([len(n)]) + n.encode() for n, _ in columns)
        body += bytes([4, len(listed)]) + listed
    return _header(ev.TABLE_MAP, len(body)) + body


def rows(
    kind: RowKind,
    table_id: int,
    columns: Sequence[tuple[str, int]],
    images: Sequence[Image | tuple[Image, Image]],
) -> Rows:
    """A rows event of `images` (pairs of before and after images for an update), every
    column present; a missing or None value is NULL."""
    count = len(columns)
    present = b"\xff" * ((count + 7) // 8)
    body = table_id.to_bytes(6, "little") + b"\0\0" + bytes([count]) + present
    if kind is RowKind.UPDATE:
        body += present
    for image in images:
        for one in image if isinstance(image, tuple) else (image,):
            body += _image(columns, one)
    data = _header(_KIND_CODES[kind], len(body)) + body
    return Rows(kind, ev.rows_head(data, _KIND_CODES[kind], 8), data, len(data))


def _image(columns: Sequence[tuple[str, int]], values: Image) -> bytes:
    nulls = sum(1 << i for i, (name, _) in enumerate(columns) if values.get(name) is None)
    data = nulls.to_bytes((len(columns) + 7) // 8, "little")
    for name, kind in columns:
        value = values.get(name)
        if value is None:
            continue
        if kind == INT:
            data += struct.pack("<i", value)
        else:
            text = str(value).encode()
            data += struct.pack("<H", len(text)) + text
    return data


def _header(kind: int, body_size: int) -> bytes:
    return ev.HEADER.pack(1_700_000_000, kind, 1, ev.HEADER_SIZE + body_size, 0, 0)
