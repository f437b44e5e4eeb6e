"""What binlog events mean for DBLog: binlog records in, log items out.

No socket and no SQL: `binlog.py` (the transport) turns binlog events into records
(`records.py`: a rows event stays its bytes, read by the row decoder compiled for its table
map, `rows.py`; a statement's text is read by `statements.py`), and the one catalog question,
a captured table's columns and key, is asked through an injected `ColumnsLookup`; so the
mapping is tested on records and event bytes built by hand.

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
it repeats. Row events carry their table's version as the tailer numbers it
(`schema_versions`); their lines are spelled by `core.envelope`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field
from itertools import repeat
from typing import cast

from airflow_provider_dblog.core.envelope import TableLines, TransactionLines
from airflow_provider_dblog.core.event import LogOrigin, Op, Row, TableRef
from airflow_provider_dblog.core.event_codec import plain_row_encoder, row_json_encoder
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
from airflow_provider_dblog.sources.mysql import statements
from airflow_provider_dblog.sources.mysql.catalog import ColumnInfo
from airflow_provider_dblog.sources.mysql.events import TableMap
from airflow_provider_dblog.sources.mysql.records import (
    Begin,
    BinlogRecord,
    Query,
    RowKind,
    Rows,
    Xid,
)
from airflow_provider_dblog.sources.mysql.rows import (
    FloatSeen,
    ImageReader,
    compile_image,
    plain_values,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TableColumns:
    """A captured table as the catalog describes it now: its description for schema events
    (columns, and primary-key columns in key order), and each column's `ColumnInfo` in table
    order (what the row decoder needs beyond the binlog's own types)."""

    schema: TableSchema
    columns: tuple[ColumnInfo, ...]


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
        position = Position.trusted(self.begin.commit, self.seq)
        self.seq += 1
        return position


_CREATE, _UPDATE, _DELETE = Op.CREATE, Op.UPDATE, Op.DELETE
"""`Op`'s members as globals: read off the enum class, each costs about a thousand machine
instructions, a fiftieth of a row's whole decoding."""


@dataclass(slots=True)
class _Table:
    """A captured table as its last table map logged it, and its image readers."""

    ref: TableRef
    shape: tuple[object, ...]
    columns: TableColumns | None
    """None once a statement may have changed the table: asked of the catalog again."""
    table_map: TableMap
    lines: TableLines
    """How its events are spelled."""
    key: tuple[str, ...] = ()
    plain: bool = False
    """Every value its images hold is a str, an int, None or a JSON document of those unless
    `floats` says otherwise (`rows.plain_values`)."""
    floats: FloatSeen = field(default_factory=FloatSeen)
    spell: Callable[[Row], bytes] = field(default=lambda row: b"")
    """How its rows are spelled but those `floats` reports, and `spell_key` its keys
    (`BinlogMapper._spellers`): set with its columns, before any row of it is read."""
    spell_key: Callable[[Row], bytes] = field(default=lambda row: b"")
    is_watermark: bool = False
    readers: dict[bytes, ImageReader] = field(default_factory=dict)
    """The compiled reader of each bitmap of present columns met (one, with FULL images)."""
    shared: tuple[_Transaction, TransactionLines] | None = None
    """The transaction that last changed it, with its lines there (a schema version changes
    only at DDL, a transaction of its own on MySQL)."""


_WATERMARK_COLUMNS = TableColumns(
    TableSchema((), ()),
    (
        ColumnInfo("id", "int", "int"),
        ColumnInfo("value", "varchar", "varchar(255)", "utf8mb4", "utf8mb4_bin", 255),
    ),
)
"""The watermark table as `setup.ensure_setup` creates it: read without asking the catalog."""


_WATERMARK_VALUE = "value"
_FLOATING = frozenset(("float", "double", "json"))
"""Catalog types whose values may hold floats, which msgspec spells otherwise than `json`."""


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
        self._maps: dict[int, _Table | None] = {}
        """Each table id met in a table map: its table if captured (or the watermark table),
        as that map logged it."""
        self._transaction: _Transaction | None = None
        self._spell = row_json_encoder()
        self._plain = plain_row_encoder()
        """Spells the rows of a table whose values are all str, int or None (`_Table.plain`)."""
        self._mapped: dict[int, TableMap] = {}
        self._warned: set[tuple[TableRef, str]] = set()
        self.schema_versions: Mapping[TableRef, int] = {}
        """The tailer's current version of each table (`StampsSchemaVersions`), which row
        events carry; 0 for a table not in it."""

    @property
    def open_commit(self) -> int | None:
        """The commit of the transaction being read; None between transactions."""
        return None if self._transaction is None else self._transaction.begin.commit

    def drop_transaction(self) -> None:
        self._transaction = None

    def map(self, record: BinlogRecord) -> Iterator[LogItem]:
        if isinstance(record, Rows):
            yield from self.rows(record)
        elif isinstance(record, TableMap):
            self.table_map(record)
        elif isinstance(record, Begin):
            if self._transaction is not None:
                raise SourceError(
                    f"binlog transaction at {self._transaction.begin.commit} did not end "
                    f"before the next one at {record.commit}"
                )
            self._transaction = _Transaction(record)
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
        if statements.is_begin(query.sql):
            if transaction is None:
                transaction = self._transaction = _Transaction(Begin(query.commit, query.ts_ms))
            transaction.began = True
            return
        if statements.is_end(query.sql):
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
        truncated = statements.truncated(query.sql, query.schema)
        if truncated is not None:
            if truncated in self._captured:
                position = transaction.next_position()
                yield Truncate(truncated, position, begin.txid, begin.ts_ms)
            return
        if not statements.is_ddl(query.sql):
            return
        for table in sorted(self._captured):
            if not statements.names(query.sql, table):
                continue
            known = self._tables.get(table)
            if known is not None:
                known.columns = None
                known.readers.clear()
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

    def table_map(self, table_map: TableMap) -> None:
        """Table ids stand for a table until mapped again (a server restart reuses them)."""
        if self._mapped.get(table_map.table_id) is table_map:
            return  # the same map again: the reader hands over one object per distinct map
        self._mapped[table_map.table_id] = table_map
        ref = TableRef(table_map.schema, table_map.table)
        if ref not in self._captured and ref != self._watermark:
            self._maps[table_map.table_id] = None
            return
        known = self._tables.get(ref)
        if known is None or known.shape != table_map.shape:
            lines = TableLines(self._source, self._db, ref)
            known = self._tables[ref] = _Table(
                ref, table_map.shape, None, table_map, lines, is_watermark=ref == self._watermark
            )
        self._maps[table_map.table_id] = known

    def _described(self, table: _Table) -> None:
        """Asks the catalog for `table`'s columns: for a new shape, or after a statement that
        named it. The watermark table is known without asking."""
        if table.ref == self._watermark:
            table.columns = _WATERMARK_COLUMNS
        else:
            columns = self._columns(table.ref)
            if not columns.schema.key:
                raise NoPrimaryKey(f"captured table {table.ref} has no primary key")
            table.columns, table.key = columns, columns.schema.key
        table.readers.clear()
        table.plain = plain_values(table.table_map)
        table.spell, table.spell_key = self._spellers(table)

    def _reader(self, table: _Table, present: bytes) -> ImageReader:
        reader = table.readers.get(present)
        if reader is None:
            if table.columns is None:
                self._described(table)
            columns = table.columns
            assert columns is not None
            names, infos = self._column_infos(table.ref, table.table_map, columns)
            reader = compile_image(
                table.ref, table.table_map, names, infos, table.key, present, table.floats
            )
            table.readers[present] = reader
        return reader

    def _column_infos(
        self, ref: TableRef, table_map: TableMap, columns: TableColumns
    ) -> tuple[tuple[str, ...], tuple[ColumnInfo | None, ...]]:
        """The map's columns' names and catalog descriptions: by name where the binlog names
        them (binlog_row_metadata = FULL), else by position."""
        count = len(table_map.types)
        if table_map.names is None:
            if count > len(columns.columns):
                raise SourceError(
                    f"binlog rows of {ref} have {count} columns, the catalog has "
                    f"{len(columns.columns)}: without column names in the binlog the reader "
                    "cannot tell which is which; SET GLOBAL binlog_row_metadata = 'FULL'"
                )
            infos = columns.columns[:count]
            return tuple(c.name for c in infos), infos
        by_name = {c.name: c for c in columns.columns}
        for name in table_map.names:
            if name not in by_name and (ref, name) not in self._warned:
                self._warned.add((ref, name))
                log.warning(
                    "source %s: %s.%s is in the binlog but no longer in the catalog (dropped or "
                    "renamed since); its values are read by their binlog type",
                    self._source,
                    ref,
                    name,
                )
        return table_map.names, tuple(by_name.get(name) for name in table_map.names)

    def rows(self, record: Rows) -> list[LogItem]:
        """The changes of one rows event (nearly every event): each row image read by the
        reader compiled for its table map, then the rows' lines built in one pass, handed
        over as one `LogLines` (an update of a key: a `Change` a row instead)."""
        transaction = self._transaction
        head = record.head
        if transaction is None:
            raise SourceError(f"binlog rows of table id {head.table_id} outside a transaction")
        transaction.began = True
        table = self._maps.get(head.table_id)
        if table is None:
            if head.table_id not in self._maps:
                raise SourceError(f"binlog rows of table id {head.table_id} before its table map")
            return []
        read = table.readers.get(head.present) or self._reader(table, head.present)
        if table.is_watermark:
            return self._watermarks(transaction, table, record)
        ref, data, end, pos = table.ref, record.data, record.end, head.start
        shared = table.shared
        if shared is None or shared[0] is not transaction:
            begin, version = transaction.begin, self.schema_versions.get(ref, 0)
            origin = LogOrigin(self._source, self._db, ref, begin.txid, begin.ts_ms)
            shared = table.shared = (
                transaction,
                table.lines.in_transaction(begin.commit, origin, version),
            )
        lines = shared[1]
        # The one loop a row: each image read, its row and key kept; the rest a C-level pass.
        floats = table.floats
        floats.seen = False
        rows: list[Row] = []
        keys: list[Row | None] = []
        add_row, add_key = rows.append, keys.append
        if record.kind is RowKind.UPDATE:
            read_after = table.readers.get(head.present_after) or self._reader(
                table, head.present_after
            )
            afters: list[Row] = []
            old_keys: list[Row | None] = []
            add_after, add_old_key = afters.append, old_keys.append
            while pos < end:
                before, old_key, pos = read(data, pos)
                after, key, pos = read_after(data, pos)
                add_row(before)
                add_old_key(old_key)
                add_after(after)
                add_key(key)
            if None in keys or None in old_keys:
                raise _keyless(ref, table.key)
        elif pos < end:
            row, key, pos = read(data, pos)
            if pos == end:  # one row (most OLTP statements): a `Change`, costs least
                return [self._one_row(transaction, table, lines, record.kind, row, key)]
            add_row(row)
            add_key(key)
            while pos < end:
                row, key, pos = read(data, pos)
                add_row(row)
                add_key(key)
            if None in keys:
                raise _keyless(ref, table.key)
        if pos != end:  # the images overran the event: its table map does not describe them
            raise SourceError(f"binlog: a rows event of {ref} does not end where its rows do")
        if not rows:
            return []
        spell_row = self._spell if floats.seen else table.spell
        keyed = cast(list[Row], keys)
        if record.kind is RowKind.UPDATE:
            if len(rows) == 1 or old_keys != keys:
                return self._updates(
                    transaction, lines, spell_row, table.spell_key, old_keys, rows, keyed, afters
                )
            op, befores, after_rows = _UPDATE, rows, afters
        elif record.kind is RowKind.INSERT:
            op, befores, after_rows = _CREATE, None, rows
        else:
            op, befores, after_rows = _DELETE, rows, None
        first = transaction.seq
        transaction.seq += len(rows)
        return [
            lines.run(
                op,
                first,
                keyed,
                befores,
                after_rows,
                map(table.spell_key, keyed),
                repeat(b"null") if befores is None else map(spell_row, befores),
                repeat(b"null") if after_rows is None else map(spell_row, after_rows),
            )
        ]

    def _one_row(
        self,
        transaction: _Transaction,
        table: _Table,
        lines: TransactionLines,
        kind: RowKind,
        row: Row,
        key: Row | None,
    ) -> Change:
        """The change of an insert or delete rows event of one row."""
        if key is None:
            raise _keyless(table.ref, table.key)
        spell = self._spell if table.floats.seen else table.spell
        key_json, row_json, at = table.spell_key(key), spell(row), transaction.next_position()
        if kind is RowKind.INSERT:
            return lines.change(_CREATE, key, None, row, key_json, b"null", row_json, at)
        return lines.change(_DELETE, key, row, None, key_json, row_json, b"null", at)

    @staticmethod
    def _updates(
        transaction: _Transaction,
        lines: TransactionLines,
        spell: Callable[[Row], bytes],
        spell_key: Callable[[Row], bytes],
        old_keys: list[Row | None],
        befores: list[Row],
        keys: list[Row],
        afters: list[Row],
    ) -> list[LogItem]:
        """An update rows event of one row, or one that changes a key, as a `Change` a row: a
        row that changes its key as a delete of the old key, then a create of the new one (a
        `Change` costs less than a run of one)."""
        items: list[LogItem] = []
        change, at = lines.change, transaction.next_position
        for old_key, before, key, after in zip(old_keys, befores, keys, afters, strict=True):
            assert old_key is not None
            before_json, after_json = spell(before), spell(after)
            if old_key == key:
                items.append(
                    change(
                        _UPDATE, key, before, after, spell_key(key), before_json, after_json, at()
                    )
                )
                continue
            items.append(
                change(
                    _DELETE, old_key, before, None, spell_key(old_key), before_json, b"null", at()
                )
            )
            items.append(
                change(_CREATE, key, None, after, spell_key(key), b"null", after_json, at())
            )
        return items

    def _spellers(self, table: _Table) -> tuple[Callable[[Row], bytes], Callable[[Row], bytes]]:
        """How `table`'s rows and keys are spelled: msgspec for str, int and None values (and
        JSON documents of those: a row whose documents held a float takes the standard
        encoder, as `rows` asks `table.floats`), the standard encoder for FLOAT and DOUBLE.
        A key is spelled by msgspec unless a key column may hold a float."""
        plain, standard, columns = self._plain, self._spell, table.columns
        assert columns is not None
        if plain is None:
            return standard, standard
        floating = {c.name for c in columns.columns if c.data_type in _FLOATING}
        key = standard if floating.intersection(table.key) else plain
        return (plain if table.plain else standard), key

    def _watermarks(self, transaction: _Transaction, table: _Table, record: Rows) -> list[LogItem]:
        """The watermark values written (inserted or updated) by a rows event."""
        head, data, end, pos = record.head, record.data, record.end, record.head.start
        read = self._reader(table, head.present)
        read_after = self._reader(table, head.present_after)
        items: list[LogItem] = []
        while pos < end:
            if record.kind is RowKind.UPDATE:
                _, _, pos = read(data, pos)
                image, _, pos = read_after(data, pos)
            else:
                image, _, pos = read(data, pos)
            value = image.get(_WATERMARK_VALUE)
            if record.kind is not RowKind.DELETE and isinstance(value, str):
                items.append(WatermarkWrite(value, transaction.next_position()))
        if pos != end:
            raise SourceError(f"binlog: a rows event of {table.ref} does not end where its rows do")
        return items


def _keyless(ref: TableRef, key: tuple[str, ...]) -> SourceError:
    return SourceError(f"{ref}: a binlog row image without its primary-key columns {key}")
