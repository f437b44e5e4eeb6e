"""What binlog events mean for DBLog: binlog records in, log items out.

No socket and no SQL: `binlog.py` (the transport) turns mysql-replication's events into the
records below, and the one catalog question, a captured table's key columns and converters,
is asked through an injected `ColumnsLookup`; so the mapping is tested on hand-built records.

Positions are `[commit, seq]`. `commit` is the binlog file number << 32 | the offset of the
transaction's FIRST event (its GTID event, or its BEGIN without GTIDs). The binlog holds each
transaction whole and in commit order, so that offset grows in commit order as the end's offset
does, and it is known before the first row arrives: items are yielded event by event and a
transaction of a million rows is never held in memory (docs/architecture.md says why this is
not the end's offset, as DESIGN has it). `seq` is the event's index in its transaction.

A transaction ends at its Xid (transactional tables), at a COMMIT or ROLLBACK query (a
non-transactional table's changes, logged even when rolled back), or after the one statement of
a standalone group (DDL, which commits on its own). Only there is `TransactionEnd` yielded:
resuming inside a transaction would silently drop its first rows. `LogEnd` (a heartbeat)
becomes `Idle(end - 1)`: the next transaction may start exactly at the log's end, so the value
acknowledged while idle must stay below any commit still to come.

Table-level changes: a TRUNCATE of a captured table is a `Truncate`; any other DDL naming a
captured table (ALTER, CREATE, RENAME, ...) is a `SchemaDescription` of its columns as the
catalog has them then (a repeat is cheap: the tailer emits only real changes, and fails the
windows a change falls in, so a chunk never mixes old and new columns). Tables are described
only there, never at the first rows a reader happens to meet: an item's position must not
depend on where a reader started, or a replay after a restart would not repeat the positions
it repeats. Changes carry schema_version 0: the tailer stamps versions.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import Enum

from airflow_provider_dblog.core.event import (
    JsonValue,
    Op,
    Origin,
    PlainEvent,
    Row,
    SourceInfo,
    TableRef,
)
from airflow_provider_dblog.core.log import (
    Change,
    Idle,
    LogItem,
    SchemaDescription,
    TransactionEnd,
    Truncate,
    WatermarkWrite,
)
from airflow_provider_dblog.core.position import Position
from airflow_provider_dblog.core.schema import TableSchema
from airflow_provider_dblog.sources.base import NoPrimaryKey, SourceError, UnknownTable

log = logging.getLogger(__name__)

RawRow = Mapping[str, object]
"""A row image as mysql-replication decodes it: column name -> Python value."""


class RowKind(Enum):
    INSERT = "insert"
    UPDATE = "update"
    DELETE = "delete"


@dataclass(frozen=True, slots=True)
class Begin:
    """A transaction's first event. `commit` is its file number << 32 | its offset.

    `standalone` is MariaDB's GTID flag for a group of one statement without BEGIN/COMMIT
    (DDL); None where the server does not say (MySQL): then a first query that is not BEGIN
    makes the group standalone."""

    commit: int
    ts_ms: int
    gtid: str | None = None
    txid: int | None = None
    standalone: bool | None = None


@dataclass(frozen=True, slots=True)
class Rows:
    """One rows event: (before, after) images, before None for an insert, after None for a
    delete. `shape` is the table's columns and types as its table map event gave them: the
    catalog is asked again when it changes."""

    table: TableRef
    kind: RowKind
    images: Sequence[tuple[RawRow | None, RawRow | None]]
    shape: tuple[object, ...]


@dataclass(frozen=True, slots=True)
class Query:
    """A QUERY event. `commit` is computed as for `Begin`, for a statement that starts a group
    of its own (BEGIN without GTIDs, or DDL)."""

    commit: int
    ts_ms: int
    schema: str
    sql: str


@dataclass(frozen=True, slots=True)
class Xid:
    """A transactional group committed."""


@dataclass(frozen=True, slots=True)
class LogEnd:
    """A heartbeat: the server has sent everything up to `end` (file number << 32 | offset)."""

    end: int


BinlogRecord = Begin | Rows | Query | Xid | LogEnd


@dataclass(frozen=True, slots=True)
class TableColumns:
    """A captured table as the catalog describes it now: its description for schema events
    (columns, and primary-key columns in key order), and the converter of the column named
    (the same converters a chunk read uses)."""

    schema: TableSchema
    convert: Callable[[str, object], JsonValue]


ColumnsLookup = Callable[[TableRef], TableColumns]
"""A captured table's columns as the catalog has them now; raises UnknownTable if it is gone."""


@dataclass(slots=True)
class _Transaction:
    begin: Begin
    seq: int = 0
    began: bool = False
    """A BEGIN query or a rows event was met: the group ends at Xid or COMMIT, not after a
    statement."""

    def next_position(self) -> Position:
        position = Position(self.begin.commit, self.seq)
        self.seq += 1
        return position


@dataclass(frozen=True, slots=True)
class _Table:
    shape: tuple[object, ...]
    columns: TableColumns | None
    """None once a statement may have changed the table: asked of the catalog again."""


_BEGIN = re.compile(r"\s*BEGIN\s*;?\s*$", re.IGNORECASE)
_END = re.compile(r"\s*(COMMIT|ROLLBACK)\s*;?\s*$", re.IGNORECASE)
_DDL = re.compile(r"\s*(ALTER|CREATE|DROP|RENAME)\b", re.IGNORECASE)
_NAME = r"(`(?:[^`]|``)+`|[A-Za-z0-9_$]+)"
_TRUNCATE = re.compile(
    rf"\s*TRUNCATE\s+(?:TABLE\s+)?{_NAME}(?:\s*\.\s*{_NAME})?\s*;?\s*$", re.IGNORECASE
)
_WATERMARK_VALUE = "value"


class BinlogMapper:
    """Turns one reader's binlog records into `LogItem`s.

    Keeps each captured table's shape and schema version (a new shape after an ALTER is a new
    version, its columns asked of the catalog again), and the transaction being read. One
    mapper serves every connection of a reader; `drop_transaction` forgets a transaction a lost
    connection cut short (a new connection starts at a transaction's beginning).
    """

    def __init__(
        self,
        *,
        source: str,
        db: str,
        captured: Collection[TableRef],
        watermark: TableRef,
        columns: ColumnsLookup,
    ) -> None:
        self._source = source
        self._db = db
        self._captured = frozenset(captured)
        self._watermark = watermark
        self._columns = columns
        self._tables: dict[TableRef, _Table] = {}
        self._transaction: _Transaction | None = None

    @property
    def open_commit(self) -> int | None:
        """The commit of the transaction being read; None between transactions."""
        return None if self._transaction is None else self._transaction.begin.commit

    def drop_transaction(self) -> None:
        self._transaction = None

    def map(self, record: BinlogRecord) -> Iterator[LogItem]:
        if isinstance(record, Begin):
            if self._transaction is not None:
                raise SourceError(
                    f"binlog transaction at {self._transaction.begin.commit} did not end "
                    f"before the next one at {record.commit}"
                )
            self._transaction = _Transaction(record)
        elif isinstance(record, Rows):
            transaction = self._transaction
            if transaction is None:
                raise SourceError(f"binlog rows of {record.table} outside a transaction")
            transaction.began = True
            yield from self._rows(transaction, record)
        elif isinstance(record, Query):
            yield from self._query(record)
        elif isinstance(record, Xid):
            yield from self._end()
        elif self._transaction is None:
            yield Idle(record.end - 1)

    def _end(self) -> Iterator[LogItem]:
        transaction, self._transaction = self._transaction, None
        if transaction is None:
            raise SourceError("binlog commit outside a transaction")
        yield TransactionEnd(transaction.begin.commit)

    def _query(self, query: Query) -> Iterator[LogItem]:
        transaction = self._transaction
        if _BEGIN.match(query.sql):
            if transaction is None:
                transaction = self._transaction = _Transaction(Begin(query.commit, query.ts_ms))
            transaction.began = True
            return
        if _END.match(query.sql):
            yield from self._end()
            return
        if transaction is None:  # a statement of its own, without GTIDs
            transaction = self._transaction = _Transaction(
                Begin(query.commit, query.ts_ms, standalone=True)
            )
        yield from self._statement(transaction, query)
        standalone = transaction.begin.standalone
        if standalone or (standalone is None and not transaction.began):
            yield from self._end()

    def _statement(self, transaction: _Transaction, query: Query) -> Iterator[LogItem]:
        """A statement logged as text (DDL, in ROW format)."""
        begin = transaction.begin
        truncated = _TRUNCATE.match(query.sql)
        if truncated:
            first, second = truncated.groups()
            if second:
                table = TableRef(_unquote(first), _unquote(second))
            else:
                table = TableRef(query.schema, _unquote(first))
            if table in self._captured:
                position = transaction.next_position()
                yield Truncate(table, position, begin.txid, begin.ts_ms)
            return
        if not _DDL.match(query.sql):
            return
        for table in sorted(self._captured):
            if not _names(query.sql, table):
                continue
            known = self._tables.get(table)
            if known is not None:
                self._tables[table] = replace(known, columns=None)
            try:
                schema = self._columns(table).schema
            except UnknownTable:
                log.warning(
                    "source %s: captured table %s is gone after %r; its changes are not "
                    "captured until it is back (then dump it again)",
                    self._source,
                    table,
                    query.sql,
                )
                continue
            position = transaction.next_position()
            yield SchemaDescription(
                table, schema, position, begin.txid, begin.ts_ms, after_ddl=True
            )

    def _columns_of(self, rows: Rows) -> TableColumns:
        """The table's columns for `rows`: asked of the catalog for a new shape or after a
        statement that named it."""
        known = self._tables.get(rows.table)
        if known is not None and known.shape == rows.shape and known.columns is not None:
            return known.columns
        columns = self._columns(rows.table)
        if not columns.schema.key:
            raise NoPrimaryKey(f"captured table {rows.table} has no primary key")
        self._tables[rows.table] = _Table(rows.shape, columns)
        return columns

    def _rows(self, transaction: _Transaction, rows: Rows) -> Iterator[LogItem]:
        if rows.table == self._watermark:
            for _, after in rows.images:
                value = None if after is None else after.get(_WATERMARK_VALUE)
                if isinstance(value, str):
                    yield WatermarkWrite(value, transaction.next_position())
            return
        if rows.table not in self._captured:
            return
        columns = self._columns_of(rows)
        begin = transaction.begin

        def event(op: Op, key: Row, before: Row | None, after: Row | None) -> Change:
            source = SourceInfo(
                name=self._source,
                db=self._db,
                schema=rows.table.schema,
                table=rows.table.name,
                position=transaction.next_position(),
                origin=Origin.LOG,
                txid=begin.txid,
                ts_ms=begin.ts_ms,
            )
            return Change(PlainEvent(op, key, before, after, source, 0))

        for raw_before, raw_after in rows.images:
            before = None if raw_before is None else _row(columns, raw_before)
            after = None if raw_after is None else _row(columns, raw_after)
            if before is None and after is not None:
                yield event(Op.CREATE, _key(rows.table, columns, after), None, after)
            elif after is None and before is not None:
                yield event(Op.DELETE, _key(rows.table, columns, before), before, None)
            elif before is not None and after is not None:
                old_key = _key(rows.table, columns, before)
                new_key = _key(rows.table, columns, after)
                if old_key != new_key:
                    yield event(Op.DELETE, old_key, before, None)
                    yield event(Op.CREATE, new_key, None, after)
                else:
                    yield event(Op.UPDATE, new_key, before, after)


def _row(columns: TableColumns, raw: RawRow) -> Row:
    convert = columns.convert
    return {name: convert(name, value) for name, value in raw.items()}


def _key(ref: TableRef, columns: TableColumns, row: Row) -> Row:
    try:
        return {name: row[name] for name in columns.schema.key}
    except KeyError as missing:
        raise SourceError(f"{ref}: a change without primary-key column {missing}") from None


def _unquote(name: str) -> str:
    return name[1:-1].replace("``", "`") if name.startswith("`") else name


def _names(sql: str, table: TableRef) -> bool:
    """Whether `sql` names `table` (quoted or not, qualified or not)."""
    name = re.escape(table.name)
    return re.search(rf"(?<![\w$]){name}(?![\w$])|`{name}`", sql, re.IGNORECASE) is not None
