"""The lake schema of a captured table: its columns in real Arrow types, mapped from the source
catalog's description (`core.schema.TableSchema`), plus the position columns every lake row
carries. `LakeSchema.to_arrow` turns rows of JSON values (as the converters make them, for the
log and the dump alike) into an Arrow table of that schema.

Types, from the catalog's spelling (PostgreSQL `format_type`, MySQL `COLUMN_TYPE`), each
source's dialect mapping its own (`Dialect.lake_type`: `sources/postgres/lake_types.py`,
`sources/mysql/lake_types.py`). Delta Lake has no unsigned, time-of-day or interval types, so
those widen or become text:

| source | Arrow (Delta) |
|---|---|
| PG smallint / integer / bigint / oid | int16 / int32 / int64 / int64 |
| MySQL tinyint / smallint / mediumint / int / bigint | int8 / int16 / int32 / int32 / int64 |
| the same, unsigned | int16 / int32 / int32 / int64 / decimal(20,0) |
| boolean | bool |
| real, MySQL float / double precision, double | float32 / float64 ('NaN', 'Infinity' as floats) |
| numeric(p,s), decimal(p,s) with p <= 38 | decimal128(p,s); NaN and infinities become null |
| numeric without precision, or p > 38 | string (the digits as the source prints them) |
| bytea, binary, varbinary, blob | binary (from the converters' base64) |
| json, jsonb (MariaDB's JSON is a longtext: string too) | string (compact JSON text) |
| uuid, text, char, varchar, enum, set, interval, time, timetz, money, other types | string |
| date | date32 (PG's infinity and BC dates: null) |
| PG timestamp, MySQL datetime | timestamp[us] (no zone) |
| PG timestamptz, MySQL timestamp | timestamp[us, UTC] |
| MySQL year | int16; bit(n) int64 (bit(64): decimal(20,0)) |
| PG arrays (`integer[]`, ...) | list of the element's type (one dimension) |

Every source column is nullable in the lake (a tombstone keeps only its key; a column added by
an ALTER is null in older rows unless its default is a constant) except the key columns.

Position columns: `_dblog_commit` (int64: the commit as the positions spell it; a PostgreSQL
LSN or a MySQL `file << 32 | offset` reaches 2^63 only after 8 EiB of log, and a larger value
is refused rather than wrapped, so int64 orders exactly as the positions do), `_dblog_seq`
(int64), `_dblog_deleted` (a tombstone: the key was deleted at this position), `_dblog_op`
(`c`, `u`, `r`, `d` of the event that wrote the row), `_dblog_ts_ms` (the source's commit time
of that event, null for dump rows). A consumer reads incrementally by position: every change
of a key raises its position, deletes included (as tombstones), so "rows with a position after
the last one I read" are the changes since.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import json
import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_dblog.core.event import JsonValue, TableRef
from airflow_provider_dblog.core.schema import TableSchema
from airflow_provider_dblog.sources.base import SourceError
from airflow_provider_dblog.sources.factory import dialect
from airflow_provider_dblog.sources.text_chunks import TextColumn, TextKind

COMMIT = "_dblog_commit"
SEQ = "_dblog_seq"
DELETED = "_dblog_deleted"
OP = "_dblog_op"
TS_MS = "_dblog_ts_ms"
POSITION_FIELDS = (
    pa.field(COMMIT, pa.int64(), nullable=False),
    pa.field(SEQ, pa.int64(), nullable=False),
    pa.field(DELETED, pa.bool_(), nullable=False),
    pa.field(OP, pa.string(), nullable=False),
    pa.field(TS_MS, pa.int64(), nullable=True),
)
POSITION_COLUMNS = tuple(f.name for f in POSITION_FIELDS)
KEEP_PREFIX = "_dblog_keep:"
"""`_dblog_keep:<column>` (bool) in a batch given to `LakeTable.merge`: true where the event did
not carry the column (PostgreSQL leaves out an unchanged TOASTed value), so the stored value
stays."""

TYPE_METADATA = "dblog.type"
_I63 = 1 << 63


class LakeSchemaError(ValueError):
    """A value or a schema change the lake table cannot take; the message says what to do."""


@dataclass(frozen=True, slots=True)
class LakeColumn:
    """One source column in the lake: its name, its type as the source spells it, its Arrow
    type, and `kind`, the name of the function that turns its JSON values into Arrow's."""

    name: str
    source_type: str
    arrow: pa.DataType
    kind: str
    nullable: bool = True

    @property
    def field(self) -> pa.Field:
        """The Delta field; its metadata keeps the source's type, from which the column's
        mapping is found again when the table is opened."""
        metadata = {TYPE_METADATA: self.source_type}
        return pa.field(self.name, self.arrow, nullable=self.nullable, metadata=metadata)


@dataclass(frozen=True, slots=True)
class LakeSchema:
    """A captured table's lake schema. Picklable, so a Spark task can be handed one."""

    table: TableRef
    columns: tuple[LakeColumn, ...]
    key: tuple[str, ...]
    source: str
    """The source type whose type names the columns' `source_type` are (`[source] type`)."""

    @classmethod
    def from_arrow(
        cls, table: TableRef, schema: pa.Schema, key: Sequence[str], source: str
    ) -> LakeSchema:
        """The lake schema of an existing lake table, from its Arrow schema (whose field
        metadata names each column's source type)."""
        columns = []
        for field in schema:
            if field.name in POSITION_COLUMNS:
                continue
            sql_type = (field.metadata or {}).get(TYPE_METADATA.encode())
            if sql_type is None:
                raise LakeSchemaError(f"lake column {table}.{field.name} has no {TYPE_METADATA}")
            mapped = lake_column(source, field.name, sql_type.decode())
            columns.append(
                LakeColumn(field.name, mapped.source_type, field.type, mapped.kind, field.nullable)
            )
        return cls(table, tuple(columns), tuple(key), source)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    def column(self, name: str) -> LakeColumn | None:
        return next((c for c in self.columns if c.name == name), None)

    def restricted(self, names: Iterable[str]) -> LakeSchema:
        """This schema's columns among `names` alone."""
        kept = set(names)
        return replace(self, columns=tuple(c for c in self.columns if c.name in kept))

    def extended(self, columns: Iterable[LakeColumn]) -> LakeSchema:
        """This schema and, after its columns, those of `columns` it lacks."""
        added = tuple(c for c in columns if self.column(c.name) is None)
        return replace(self, columns=self.columns + added)

    def arrow_schema(self) -> pa.Schema:
        return pa.schema([c.field for c in self.columns] + list(POSITION_FIELDS))

    def values_schema(self) -> pa.Schema:
        """The source columns alone, as a direct dump stages them."""
        return pa.schema([c.field for c in self.columns])

    def values_to_arrow(self, rows: Sequence[Mapping[str, JsonValue]]) -> pa.Table:
        """Rows of JSON values as an Arrow table of the source columns alone, no position:
        a direct dump's rows as read, staged before the window says where they go."""
        arrays = [column_array(c, _values(rows, c.name), self.table) for c in self.columns]
        return pa.Table.from_arrays(arrays, schema=self.values_schema())

    def values_from_text(self, columns: Sequence[TextColumn]) -> pa.Table:
        """`values_to_arrow` of a chunk read as text columns (`text_chunks.py`): each column
        the same array its converters' values would give, cast by Arrow at once where the
        values are the text itself, integers or booleans; the others value by value."""
        by_name = {c.name: c for c in columns}
        rows = len(columns[0].text) if columns else 0
        arrays = []
        for column in self.columns:
            text = by_name.get(column.name)
            if text is None:
                arrays.append(pa.nulls(rows, column.arrow))
            else:
                arrays.append(_from_text(column, text, self.table))
        return pa.Table.from_arrays(arrays, schema=self.values_schema())

    def keys_to_arrow(self, keys: Iterable[Sequence[JsonValue]], names: Sequence[str]) -> pa.Table:
        """Key values (JSON, in the order of `names`) as an Arrow table of those columns, typed
        as the rows' are, so rows can be joined against them."""
        keys = list(keys)
        arrays = []
        for index, name in enumerate(names):
            column = self.column(name)
            if column is None:
                raise LakeSchemaError(f"{self.table} has no key column {name!r} in the lake")
            arrays.append(column_array(column, [k[index] for k in keys], self.table))
        return pa.Table.from_arrays(arrays, names=list(names))

    def positioned(
        self,
        values: pa.Table,
        commit: int,
        seq: int,
        op: str,
        defaults: Mapping[str, JsonValue] | None = None,
    ) -> pa.Table:
        """`values` (`values_to_arrow`'s) all at one position, as rows the lake merges; a
        column `values` lacks (read before the source had it, or after it dropped it) holds
        its value in `defaults`, else null."""
        count = values.num_rows
        have = set(values.column_names)
        constants = (
            pa.repeat(pa.scalar(_commit(commit), pa.int64()), count),
            pa.repeat(pa.scalar(seq, pa.int64()), count),
            pa.repeat(pa.scalar(False), count),
            pa.repeat(pa.scalar(op), count),
            pa.nulls(count, pa.int64()),
        )
        defaults = defaults or {}
        arrays = [
            *(
                values[c.name]
                if c.name in have
                else column_array(c, [defaults[c.name]] * count, self.table)
                if c.name in defaults
                else pa.nulls(count, c.arrow)
                for c in self.columns
            ),
            *constants,
        ]
        return pa.Table.from_arrays(arrays, schema=self.arrow_schema())

    def to_arrow(self, rows: Sequence[LakeRow]) -> pa.Table:
        """The rows as an Arrow table of this schema. A column a row lacks is null, unless
        the row lists it in `keep` (then a `_dblog_keep:<column>` flag says so)."""
        kept = sorted({name for r in rows for name in r.keep})
        arrays: list[pa.Array] = []
        for column in self.columns:
            values = [r.values.get(column.name) for r in rows]
            arrays.append(column_array(column, values, self.table))
        arrays.append(pa.array([_commit(r.commit) for r in rows], pa.int64()))
        arrays.append(pa.array([r.seq for r in rows], pa.int64()))
        arrays.append(pa.array([r.deleted for r in rows], pa.bool_()))
        arrays.append(pa.array([r.op for r in rows], pa.string()))
        arrays.append(pa.array([r.ts_ms for r in rows], pa.int64()))
        fields = list(self.arrow_schema())
        for name in kept:
            arrays.append(pa.array([name in r.keep for r in rows], pa.bool_()))
            fields.append(pa.field(KEEP_PREFIX + name, pa.bool_(), nullable=False))
        return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


def _values(rows: Sequence[Mapping[str, JsonValue]], name: str) -> list[JsonValue]:
    """Column `name` of `rows` (None where a row lacks it): one C-level pass when every row
    has it, as rows read whole do."""
    try:
        return list(map(operator.itemgetter(name), rows))
    except KeyError:
        return [r.get(name) for r in rows]


@dataclass(frozen=True, slots=True)
class LakeRow:
    """One row for the lake: JSON values by column, its position, whether it is a tombstone,
    the op that made it, and the columns the event did not carry (kept from the stored row)."""

    values: Mapping[str, JsonValue]
    commit: int
    seq: int
    op: str
    deleted: bool = False
    ts_ms: int | None = None
    keep: frozenset[str] = frozenset()


def _commit(commit: int) -> int:
    if not 0 <= commit < _I63:
        raise LakeSchemaError(f"commit {commit} does not fit the lake's int64 _dblog_commit")
    return commit


def lake_schema(source_type: str, table: TableRef, described: TableSchema) -> LakeSchema:
    """The lake schema of `table` described by its source (`source_type`: `[source] type`)."""
    key = set(described.key)
    columns = tuple(
        replace(lake_column(source_type, c.name, c.type), nullable=c.name not in key)
        for c in described.columns
    )
    return LakeSchema(table, columns, described.key, source_type)


def lake_column(source_type: str, name: str, sql_type: str) -> LakeColumn:
    """One nullable column, as an ALTER TABLE ... ADD COLUMN brings it."""
    try:
        found = dialect(source_type)
    except SourceError:
        raise LakeSchemaError(f"no lake type mapping for source type {source_type!r}") from None
    return LakeColumn(name, sql_type, *found.lake_type(sql_type))


# -- JSON values to Arrow -----------------------------------------------------------------------


def _float(value: JsonValue) -> Any:
    return float(value) if isinstance(value, str) else value


def _decimal_value(value: JsonValue) -> Any:
    number = decimal.Decimal(str(value))
    return number if number.is_finite() else None


def _string(value: JsonValue) -> Any:
    return value if isinstance(value, str) else _json(value)


def _json(value: JsonValue) -> Any:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _binary(value: JsonValue) -> Any:
    return base64.b64decode(value)


def _date(value: JsonValue) -> Any:
    try:
        return datetime.date.fromisoformat(value)
    except ValueError:
        return None  # infinity, BC dates


def _timestamp(value: JsonValue) -> Any:
    try:
        return datetime.datetime.fromisoformat(value)
    except ValueError:
        return None  # infinity, BC dates


def _timestamptz(value: JsonValue) -> Any:
    found = _timestamp(value)
    if found is not None and found.tzinfo is None:
        found = found.replace(tzinfo=datetime.UTC)
    return found


def _same(value: JsonValue) -> Any:
    return value


_CONVERTERS: dict[str, Callable[[JsonValue], Any]] = {
    "int": _same,
    "bool": _same,
    "float": _float,
    "decimal": _decimal_value,
    "string": _string,
    "json": _json,
    "binary": _binary,
    "date": _date,
    "timestamp": _timestamp,
    "timestamptz": _timestamptz,
}


def converter(kind: str) -> Callable[[JsonValue], Any]:
    """The function from a JSON value (never None) to what Arrow takes for a `kind` column."""
    if kind.startswith("list:"):
        element = converter(kind[5:])

        def convert_list(value: JsonValue) -> Any:
            return [None if v is None else element(v) for v in value]

        return convert_list
    return _CONVERTERS[kind]


def column_array(column: LakeColumn, values: Iterable[JsonValue], table: TableRef) -> pa.Array:
    """An Arrow array of `column`'s type from its JSON values; a value the type refuses raises
    `LakeSchemaError` naming the table, column and value."""
    values = values if isinstance(values, list) else list(values)
    whole = _whole_array(column, values)
    if whole is not None:
        return whole
    convert = converter(column.kind)
    converted = []
    for value in values:
        try:
            converted.append(None if value is None else convert(value))
        except (ValueError, TypeError, decimal.InvalidOperation, AttributeError) as exc:
            raise _refused(table, column, value, exc) from None
    try:
        return pa.array(converted, column.arrow)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:
        bad = next(
            (v for v in converted if not _fits(column.arrow, v)), converted[0] if converted else 0
        )
        raise _refused(table, column, bad, exc) from None


_TAKEN_AS_IS = frozenset({"int", "bool", "float", "string"})
_CAST_FROM_TEXT = frozenset({"decimal", "date", "timestamp", "timestamptz"})


def _whole_array(column: LakeColumn, values: list[JsonValue]) -> pa.Array | None:
    """The column's array made by Arrow at once, without a Python conversion per value, or
    None where Arrow refuses the values. It takes values as they are, and casts text to
    decimals, dates and timestamps only where its parser reads every value and needs no
    rounding; what it accepts it reads as the per-value conversions do. Anything else (a
    float spelled 'NaN', a non-text value of a text column, 'infinity', a timestamp without
    its zone in a timestamptz column) is left to them, which give the value or the error."""
    try:
        if column.kind in _TAKEN_AS_IS:
            return pa.array(values, column.arrow)
        if column.kind in _CAST_FROM_TEXT:
            return pa.array(values, pa.string()).cast(column.arrow)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError):
        return None
    return None


def _from_text(column: LakeColumn, text: TextColumn, table: TableRef) -> pa.Array:
    """`column_array` of the converters' values of `text`, without them where Arrow gives the
    same: a value that is its text goes through `_whole_array`'s cast as the converters' would,
    an integer's text is cast, a boolean is `t`. Anything Arrow refuses takes the converters."""
    try:
        if text.kind is TextKind.TEXT and column.kind in _CAST_FROM_TEXT | {"string"}:
            return text.text.cast(column.arrow)
        if text.kind is TextKind.INT and column.kind == "int":
            return text.text.cast(column.arrow)
        if text.kind is TextKind.BOOL and column.kind == "bool":
            return pc.equal(text.text, "t")
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError):
        pass
    convert = text.convert
    values = [None if v is None else convert(v) for v in text.text.to_pylist()]
    return column_array(column, values, table)


def _fits(arrow: pa.DataType, value: Any) -> bool:
    try:
        pa.array([value], arrow)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        return False
    return True


def _refused(table: TableRef, column: LakeColumn, value: Any, exc: Exception) -> LakeSchemaError:
    return LakeSchemaError(
        f"{table}.{column.name} ({column.source_type}, lake type {column.arrow}) cannot hold "
        f"{value!r}: {exc}. If the column's type changed, rebuild the lake table (remove it "
        "and dump the table again)"
    )
