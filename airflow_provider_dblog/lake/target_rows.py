"""The lake as a verified target (`verify.reader.TargetReader`): a lake table's rows of a chunk's
key range or key list, and whether the lake has folded the log through a chunk's hw.

A chunk reads the table's current version (a position at or after the chunk's hw, once
`applied_through`), but only the data files that may hold one of its keys: those whose range
of the first key column in the Delta log's statistics (the add actions' min and max) meets the
chunk's range of that column, and every file without statistics. Its rows are then cut from
theirs in Arrow, less the rows their deletion vectors delete and the tombstones. A data file
never changes once written (a commit adds and removes files, and marks rows deleted in
vectors apart), so the last files read are kept decoded: the next chunks, further on in the
same file, do not decode it again, under writes too unless a commit rewrote it.

Both sides are hashed as the lake holds rows. The source's rows (the converters' JSON) are
turned into the table's Arrow types by the lake's own conversion (`LakeSchema.values_to_arrow`,
what the compaction and a direct dump write with); the lake's rows are read as stored. So a
key hashes alike on both sides exactly when the lake holds what folding the source's row
gives. Keys are spelled back as the converters spell them: integer, text (a uuid too) and
binary (base64) key columns; a table keyed otherwise is refused. Keys sort as Python sorts
their values (text by code point), which must be how the source sorts them. A chunk's filter
runs on the table in delta-rs's SQL engine (DataFusion), which reads a plain condition (`amount
> 10 AND region = 'eu'`) as the source does; one it cannot plan is refused before the run
is stored (`check_filter`).

Folded through hw: the compaction folds the tailer's NDJSON files and keeps in the lake where
it stopped reading them (`compaction/segments.CompactState`, `lake.CURSOR_FILE`: the bytes
consumed of each file), written after every table's commit of a run. Once the tailer's
checkpoint has reached hw, the files hold every event up to hw; once that cursor covers the
bytes they held then, the lake has folded all of them (`applied_through`).
"""

from __future__ import annotations

import base64
import datetime
import decimal
import hashlib
import json
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import QueryBuilder

from airflow_provider_dblog.core.dump_plan import Chunk
from airflow_provider_dblog.core.errors import InvalidRequest
from airflow_provider_dblog.core.event import JsonValue, Key, Row, TableRef, key_of
from airflow_provider_dblog.core.position import Position
from airflow_provider_dblog.core.verify import applied_through
from airflow_provider_dblog.lake import CURSOR_FILE
from airflow_provider_dblog.lake.clustered import DataFile, literal, quote
from airflow_provider_dblog.lake.schema import DELETED, LakeSchema
from airflow_provider_dblog.lake.table import LakeTable
from airflow_provider_dblog.sources.base import SourceError

KEY_KINDS: Mapping[str, Callable[[Any], JsonValue]] = {
    "int": int,
    "string": str,
    "binary": lambda value: base64.b64encode(value).decode("ascii"),
}
"""The lake kinds a key column may have, and how its stored value is spelled as a key."""

RANGED_KINDS = ("int", "string")
"""The kinds of a first key column whose files' statistics bound a chunk's read (a binary
column's are not kept comparable): a table keyed otherwise reads every file."""

DECODED_FILES = 4
"""The data files a reader keeps decoded: a chunk lies in one or two, and the next ones read
on from where it ends."""


class LakeRows:
    """`TargetReader` of the lake at `root`; `event_sizes` gives the size of each of the
    tailer's NDJSON files (the compaction's input) by name."""

    def __init__(self, root: str | Path, event_sizes: Callable[[], Mapping[str, int]]) -> None:
        self._root = Path(root)
        self._event_sizes = event_sizes
        self._schemas: dict[TableRef, LakeSchema] = {}
        self._awaited: tuple[Position, Mapping[str, int]] | None = None
        self._decoded: OrderedDict[tuple[str, str, tuple[str, ...]], pa.Table] = OrderedDict()
        """The data files last read, by table directory, path and columns, every row of each
        (those its deletion vector deletes too), the least recently used first."""

    @property
    def name(self) -> str:
        return "the lake"

    def check_table(self, table: TableRef, key_columns: tuple[str, ...]) -> None:
        if not LakeTable.exists(self._root, table):
            raise InvalidRequest(f"the lake holds no table of {table} under {self._root}")
        schema = self._schema(table)
        if schema.key != key_columns:
            raise InvalidRequest(
                f"the lake table of {table} is keyed by ({', '.join(schema.key)}), the source "
                f"by ({', '.join(key_columns)}): rebuild it to verify it"
            )
        for name in schema.key:
            column = schema.column(name)
            if column is None or column.kind not in KEY_KINDS:
                kind = "no" if column is None else column.kind
                raise InvalidRequest(
                    f"the lake table of {table} has a {kind} key column {name}: verify reads "
                    "lake tables keyed by integer, text or binary columns"
                )

    def check_filter(self, table: TableRef, where: str) -> None:
        """The filter's query planned by DataFusion (`LIMIT 0`: no file is read): a column or
        function it does not know, or a type it cannot compare, fails the planning."""
        lake = LakeTable.open(self._root, table)
        names = ", ".join(quote(name) for name in lake.key)
        try:
            QueryBuilder().register("t", lake.delta).execute(
                f"SELECT {names} FROM t WHERE {where} LIMIT 0"
            )
        except Exception as exc:  # delta-rs raises its DeltaError, which it does not export
            raise InvalidRequest(
                f"the lake cannot run the filter on {table}: {_line(exc)}"
            ) from None

    def hash_rows(
        self, table: TableRef, key_columns: tuple[str, ...], rows: Sequence[Row]
    ) -> dict[Key, str]:
        values = self._schema(table).values_to_arrow(rows).to_pylist()
        return {key_of(row, key_columns): _hash(v) for row, v in zip(rows, values, strict=True)}

    def read_hashes(self, chunk: Chunk) -> dict[Key, str]:
        lake = LakeTable.open(self._root, chunk.table)
        schema = self._schemas[chunk.table] = lake.schema
        key = schema.key
        bounds = _first_bounds(schema, chunk)
        matching = None if chunk.where is None else _matching(lake, chunk.where, bounds)
        wanted = _in_chunk(schema, chunk, matching)
        spell = [KEY_KINDS[c.kind] for c in (schema.column(n) for n in key) if c is not None]
        found = {}
        near = self._rows(lake, schema, bounds).filter(_near(schema, chunk))
        for row in near.to_pylist():
            stored = tuple(row[name] for name in key)
            if wanted(stored):
                found[tuple(s(v) for s, v in zip(spell, stored, strict=True))] = _hash(row)
        return found

    def applied_through(self, hw: Position, checkpoint: int | None) -> bool:
        """Whether the compaction folded every byte the event files held once the tailer's
        checkpoint had reached hw (their sizes are taken the first time it has)."""
        if not applied_through(checkpoint, hw):
            return False
        if self._awaited is None or self._awaited[0] != hw:
            self._awaited = (hw, dict(self._event_sizes()))
        consumed = self._consumed()
        return all(consumed.get(name, 0) >= size for name, size in self._awaited[1].items())

    def close(self) -> None:
        self._decoded.clear()

    def _rows(self, lake: LakeTable, schema: LakeSchema, bounds: Bounds | None) -> pa.Table:
        """The current rows (no tombstone) of the table's data files that may hold a key
        whose first column lies within `bounds` (None: every file), in `schema`'s columns."""
        names = (*schema.names, DELETED)
        columns = pa.schema([lake.arrow_schema.field(name) for name in names])
        files = [f for f in lake._data_files() if bounds is None or _may_hold(f, bounds)]
        deleted = lake._deleted_rows([f.path for f in files])
        parts = []
        for file in files:
            part = self._decoded_file(lake, file.path, columns)
            if file.path in deleted:
                alive = numpy.ones(part.num_rows, dtype=bool)
                alive[deleted[file.path]] = False
                part = part.filter(pa.array(alive))
            parts.append(part)
        rows = pa.concat_tables(parts) if parts else columns.empty_table()
        return rows.filter(pc.invert(rows[DELETED])).select(list(schema.names))

    def _decoded_file(self, lake: LakeTable, path: str, columns: pa.Schema) -> pa.Table:
        """Every row of the data file `path` in `columns`, decoded once while it stays among
        the last `DECODED_FILES` read."""
        at = (lake.directory, path, tuple(columns.names))
        part = self._decoded.get(at)
        if part is None:
            part = self._decoded[at] = lake._read_file(path, columns)
            while len(self._decoded) > DECODED_FILES:
                self._decoded.popitem(last=False)
        else:
            self._decoded.move_to_end(at)
        return part

    def _schema(self, table: TableRef) -> LakeSchema:
        schema = self._schemas.get(table)
        if schema is None:
            schema = self._schemas[table] = LakeTable.open(self._root, table).schema
        return schema

    def _consumed(self) -> dict[str, int]:
        """The bytes of each event file the compaction has read and folded."""
        try:
            text = (self._root / CURSOR_FILE).read_text()
        except FileNotFoundError:
            return {}
        files: dict[str, int] = json.loads(text)["files"]
        return files


def _in_chunk(
    schema: LakeSchema, chunk: Chunk, matching: set[tuple[Any, ...]] | None
) -> Callable[[tuple[Any, ...]], bool]:
    """Whether a stored key (its values as the lake holds them) is in the chunk's key list or
    range (the chunk's keys turned into the lake's types as the rows were), and among the
    keys `matching` its filter, if it has one."""
    key = schema.key

    def stored(keys: Sequence[Key]) -> list[tuple[Any, ...]]:
        table = schema.keys_to_arrow(keys, key).to_pylist()
        return [tuple(row[name] for name in key) for row in table]

    listed = None if chunk.keys is None else set(stored(chunk.keys))
    after = None if chunk.after is None else stored([chunk.after])[0]
    upto = None if chunk.upto is None else stored([chunk.upto])[0]

    def wanted(values: tuple[Any, ...]) -> bool:
        if listed is not None and values not in listed:
            return False
        if (after is not None and values <= after) or (upto is not None and values > upto):
            return False
        return matching is None or values in matching

    return wanted


Bounds = tuple[Any, Any]
"""The lowest and highest value (None: unbounded) a chunk's keys have in the first key column,
as the lake stores it."""


def _first_bounds(schema: LakeSchema, chunk: Chunk) -> Bounds | None:
    """The bounds of the chunk's keys in the first key column (None: its files' statistics
    cannot bound it): its range's bounds' first values, or its key list's least and greatest."""
    first = schema.column(schema.key[0])
    if first is None or first.kind not in RANGED_KINDS:
        return None

    def stored(keys: Sequence[Key]) -> list[Any]:
        found: list[Any] = schema.keys_to_arrow(keys, schema.key).column(first.name).to_pylist()
        return found

    if chunk.keys is not None:
        values = stored(chunk.keys)
        return (min(values), max(values)) if values else None
    low = None if chunk.after is None else stored([chunk.after])[0]
    high = None if chunk.upto is None else stored([chunk.upto])[0]
    return low, high


def _may_hold(file: DataFile, bounds: Bounds) -> bool:
    """Whether a data file's range of the first key column meets `bounds`: the statistics are
    bounds, not values (a long string's cut to a prefix, its maximum's last character raised),
    which is all this needs; a file without them may hold any key."""
    if file.low is None or file.high is None:
        return True
    low, high = bounds
    return (low is None or file.high >= low) and (high is None or file.low <= high)


def _near(schema: LakeSchema, chunk: Chunk) -> pc.Expression:
    """The rows whose first key column lies within the chunk's key range or among its keys':
    a superset of the chunk's rows that Arrow finds without a Python object a row (it orders
    strings by their UTF-8 bytes, which is code point order; `_in_chunk` then decides)."""
    first = schema.key[0]
    column = pc.field(first)

    def stored(keys: Sequence[Key]) -> pa.ChunkedArray:
        return schema.keys_to_arrow(keys, schema.key).column(first)

    if chunk.keys is not None:
        return column.isin(stored(chunk.keys).combine_chunks())
    near = pc.scalar(True)
    if chunk.after is not None:
        near = near & (column >= stored([chunk.after])[0])
    if chunk.upto is not None:
        near = near & (column <= stored([chunk.upto])[0])
    return near


def _matching(lake: LakeTable, where: str, bounds: Bounds | None) -> set[tuple[Any, ...]]:
    """The stored keys of the table's rows that match the filter `where`, of those whose
    first key column lies within `bounds` (when not None: DataFusion then reads only the files
    whose statistics meet them)."""
    names = ", ".join(quote(name) for name in lake.key)
    condition = f"({where})"
    if bounds is not None:
        first = quote(lake.key[0])
        for value, compared in zip(bounds, (">=", "<="), strict=True):
            if value is not None:
                condition += f" AND {first} {compared} {literal(value)}"
    query = f"SELECT {names} FROM t WHERE {condition}"
    try:
        found = pa.table(QueryBuilder().register("t", lake.delta).execute(query))
    except Exception as exc:  # delta-rs raises its DeltaError, which it does not export
        raise SourceError(f"the lake cannot run the filter {where!r}: {_line(exc)}") from None
    return {tuple(row[name] for name in lake.key) for row in found.to_pylist()}


def _line(exc: Exception) -> str:
    """DataFusion's error, its chain of causes on one line."""
    lines = [line.strip() for line in str(exc).splitlines()]
    return ": ".join(line for line in lines if line and line != "caused by") or repr(exc)


def _hash(row: Mapping[str, Any]) -> str:
    """A hash of a row of Arrow's Python values: equal values, equal hash."""
    text = json.dumps(row, sort_keys=True, separators=(",", ":"), default=_plain)
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def _plain(value: Any) -> JsonValue:
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, datetime.date | datetime.time | datetime.datetime):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return format(value, "f")
    return str(value)
