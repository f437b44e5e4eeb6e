"""What pgoutput messages mean for DBLog: decoded messages in, log items out.

No socket and no SQL: the one catalog question, what a Relation message's columns are (with
the nullability, defaults and primary key pgoutput does not send), is asked through an injected
`RelationLookup`, so the mapping is tested on bytes without a server (`replication.py` is the
transport that feeds it). `add_change` reads an insert, update or delete of a captured table
straight from a message's bytes (with the table's `tuples.TupleReader`) into a run of one
transaction's changes, each with its line (`core.envelope`); the run goes out as one
`LogLines`, so the tailer's thread does nothing a change. The runs of transactions read one
after another go out together, as one `LogRuns` followed by the last one's end, so it does
little a transaction either (`take_all`). Any other message, or a row
change that reading declines (an unchanged TOAST value, a changed key), is decoded with
`pgoutput.decode` for `map`; the two give the same events (tests/unit/sources/postgres).

Positions are `[commit LSN of the transaction, seq]`; the commit LSN comes in Begin (final_lsn)
before the first change. The n-th change, watermark write or truncated table of a transaction
takes seq 2n+1; a Relation message of a captured table becomes a `SchemaDescription` at the even
seq just before the change it precedes. pgoutput sends a Relation message before a table's first
change on every new stream and after each ALTER, so where descriptions fall depends on where the
stream started; the changes' own positions do not, and a replay gives them the same ones. Items
come message by message (`map` returns one message's), or at most `RUN_CHANGES` changes at a
time (`take_all`), never a large transaction at once, so memory stays bounded whatever its
size.

Schema descriptions: pgoutput sends the columns' names and types only, and only before the next
change of the table after an ALTER (an ALTER with no later write reaches the log reader only at
that write; the tailer also checks the catalog when a dump chunk shows other columns). The
nullability and defaults come from the catalog when the message is read, so they are the
catalog's at that time, which may be later than the message's position.

Unchanged TOAST values: pgoutput does not resend a large value an UPDATE left alone. Such a
column takes its value from the old row when the server sent one (REPLICA IDENTITY FULL);
otherwise it is left out of `after` (never set to null), and consumers keep the value they
stored. A primary-key-changing UPDATE becomes a delete of the old key and a create of the new
one; without FULL identity that create can lack such columns too.

TRUNCATE is published (`setup.py`): each captured table of a Truncate message becomes a
`Truncate` item at its own position; uncaptured ones are skipped.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

from airflow_provider_dblog.core.envelope import TableLines
from airflow_provider_dblog.core.event import (
    JsonValue,
    LogOrigin,
    Op,
    Origin,
    PlainEvent,
    Row,
    SourceInfo,
    TableRef,
)
from airflow_provider_dblog.core.event_codec import plain_row_encoder, row_json_encoder
from airflow_provider_dblog.core.lines import LogLines, LogRuns
from airflow_provider_dblog.core.log import (
    Change,
    LogItem,
    SchemaDescription,
    TransactionEnd,
    Truncate,
    WatermarkWrite,
)
from airflow_provider_dblog.core.position import Position
from airflow_provider_dblog.core.schema import TableSchema
from airflow_provider_dblog.sources.base import NoPrimaryKey, SourceError
from airflow_provider_dblog.sources.postgres import pgoutput
from airflow_provider_dblog.sources.postgres.converters import column_converter, keeps_text
from airflow_provider_dblog.sources.postgres.tuples import TupleReader

log = logging.getLogger(__name__)

RelationLookup = Callable[[pgoutput.Relation], TableSchema]
"""A captured relation's schema: the message's columns and types, with the catalog's
nullability, defaults and primary key (empty when it has none)."""


@dataclass(frozen=True, slots=True)
class _Table:
    """A relation as the stream last described it, how DBLog treats it, and how its tuples
    become rows: one converter per column, chosen once per Relation message (pgoutput sends one
    after every ALTER, so once per schema) rather than once per value."""

    relation: pgoutput.Relation
    ref: TableRef
    captured: bool
    is_watermark: bool
    key_columns: tuple[str, ...]
    names: tuple[str, ...]
    parsers: tuple[Callable[[str], JsonValue] | None, ...]
    """Each column's converter; None where the JSON value is the text itself."""
    identity: tuple[int, ...]
    """The indexes of the replica identity columns: what a key-only ('K') tuple carries."""
    tuples: TupleReader
    """Reads its tuples as rows (and keys: the primary key's columns)."""
    reads_bytes: bool
    """Whether its row changes are read straight from the bytes (`read_change`): a captured
    table whose key is among its columns."""
    identity_names: tuple[str, ...] | None
    """The replica identity's columns, what a key-only ('K') old tuple is read as; None when
    they do not hold the whole key (that tuple is then read the general way)."""
    lines: TableLines
    plain_json: Callable[[Row], bytes] | None
    """Spells its rows and keys when every column is text or an integer (`plain_row_encoder`:
    they hold str, int and None only); None otherwise, or without msgspec."""

    @classmethod
    def of(
        cls,
        relation: pgoutput.Relation,
        ref: TableRef,
        *,
        captured: bool,
        is_watermark: bool,
        key_columns: tuple[str, ...],
        source: str,
        db: str,
    ) -> _Table:
        columns = relation.columns
        names = tuple(c.name for c in columns)
        parsers = tuple(
            None if keeps_text(c.type_oid) else column_converter(c.type_oid) for c in columns
        )
        reads_bytes = captured and not is_watermark and set(key_columns) <= set(names)
        key_indexes = tuple(names.index(name) for name in key_columns) if reads_bytes else ()
        identity = tuple(i for i, c in enumerate(columns) if c.is_key)
        identity_names = tuple(names[i] for i in identity)
        return cls(
            relation,
            ref,
            captured,
            is_watermark,
            key_columns,
            names,
            parsers,
            identity,
            TupleReader(names, parsers, key_indexes),
            reads_bytes,
            identity_names if set(key_columns) <= set(identity_names) else None,
            TableLines(source, db, ref),
            plain_row_encoder() if all(p is None or p is int for p in parsers) else None,
        )

    def row(
        self,
        values: pgoutput.TupleData,
        *,
        key_only: bool = False,
        unchanged_from: Row | None = None,
    ) -> Row:
        """A tuple as a row of JSON values. Unchanged TOAST values come from `unchanged_from`
        or are left out; a key-only tuple keeps only the replica identity columns."""
        names, parsers = self.names, self.parsers
        if len(values) != len(names):
            raise SourceError(f"{self.ref}: tuple of {len(values)} values for {len(names)} columns")
        if not key_only and pgoutput.UNCHANGED_TOAST not in values:
            return self.tuples.row(values)  # nearly every tuple
        if key_only:
            indexes = self.identity
            names = tuple(names[i] for i in indexes)
            parsers = tuple(parsers[i] for i in indexes)
            values = tuple(values[i] for i in indexes)
        row: Row = {}
        toast = pgoutput.UNCHANGED_TOAST
        for name, parse, value in zip(names, parsers, values, strict=True):
            if value is None:
                row[name] = None
            elif value is toast:
                if unchanged_from is not None and name in unchanged_from:
                    row[name] = unchanged_from[name]
            elif parse is None:
                row[name] = value
            else:
                row[name] = parse(value)
        return row

    def key(self, row: Row, fallback: Row | None = None) -> Row:
        try:
            return {name: row[name] for name in self.key_columns}
        except KeyError:
            pass
        key: Row = {}
        for name in self.key_columns:
            if name in row:
                key[name] = row[name]
            elif fallback is not None and name in fallback:
                key[name] = fallback[name]
            else:
                raise SourceError(f"{self.ref}: a change without primary-key column {name!r}")
        return key


class _Transaction:
    """The transaction being read: its commit LSN, xid and commit time, and its changes so far."""

    def __init__(self, commit: int, xid: int, ts_ms: int) -> None:
        self.commit = commit
        self.xid = xid
        self.ts_ms = ts_ms
        """The commit time in milliseconds, as events carry it."""
        self.txid_json = b"%d" % xid
        """The xid as lines spell it (`LogOrigin.txid_json`)."""
        self.changes = 0
        self.last_origin: LogOrigin | None = None
        """The origin of the last row event built (`origin`)."""

    def next_position(self) -> Position:
        """The next change's position: seq 2n+1 for the n-th."""
        self.changes = changes = self.changes + 1
        return Position.trusted(self.commit, 2 * changes - 1)

    def origin(self, table: _Table, source: str, db: str) -> LogOrigin:
        """The `LogOrigin` of `table`'s row events in this transaction, made once a run of its
        events (`last_origin`)."""
        last = self.last_origin
        if last is not None and last.table is table.ref:
            return last
        self.last_origin = last = LogOrigin(source, db, table.ref, self.xid, self.ts_ms)
        return last

    def description_position(self) -> Position:
        """Just before the next change: its (even) seq minus one."""
        return Position(self.commit, 2 * self.changes)


class _RunTable:
    """What a run's changes of one table share: their transaction, schema version and line
    formats."""

    def __init__(self, table: _Table, transaction: _Transaction, version: int) -> None:
        self.table = table
        self.transaction = transaction
        self.version = version
        self.counts: dict[Op, int] = {}
        """How many changes of each operation the run has of the table."""
        self.formats: dict[Op, bytes] = {}
        """By operation: its transaction format (`TableLines.transaction_format`) once a
        second change of it came, empty bytes after the first."""

    def line(self, op: Op, json: tuple[bytes, bytes, bytes], seq: int) -> bytes:
        """The line of a change of `op` at `seq` whose key, before and after spell as `json`.
        A transaction of an OLTP load changes a row or two of each of its tables: its first
        change of an operation fills the table's format whole, and only a second makes the
        transaction's format, which each later one fills."""
        line_format = self.formats.get(op)
        if line_format:
            return line_format % (json[0], json[1], json[2], seq)
        transaction, lines = self.transaction, self.table.lines
        if line_format is None:
            self.formats[op] = b""
            return lines.formats[op] % (
                json[0],
                json[1],
                json[2],
                transaction.commit,
                seq,
                transaction.txid_json,
                transaction.ts_ms,
                self.version,
            )
        line_format = self.formats[op] = lines.transaction_format(
            op, transaction.commit, transaction.txid_json, transaction.ts_ms, self.version
        )
        return line_format % (json[0], json[1], json[2], seq)


class _Run:
    """A run of changes in the transaction being read, each with its line, until it is taken
    as one `LogLines`."""

    def __init__(self, first: _RunTable) -> None:
        self.first_table = first
        self.by_relation: dict[int, _RunTable] = {first.table.relation.relation_id: first}
        """The run's tables, by relation id."""
        self.table = first
        """The table of the last change."""
        self.first = 0
        self.last = 0
        self.ops: list[Op] = []
        self.keys: list[Row] = []
        self.data: list[bytes] = []
        self.tables: list[TableRef] = []
        self.versions: list[int] = []
        self.mixed = False
        self.several_tables = False

    def add(self, op: Op, key: Row, json: tuple[bytes, bytes, bytes], seq: int) -> int:
        """Add a change of the current table (`table`) at `seq` whose key, before and after
        spell as `json`; the run's length. Its rows are not kept: they are in its line."""
        table = self.table
        self.data.append(table.line(op, json, seq))
        counts = table.counts
        counts[op] = counts.get(op, 0) + 1
        ops = self.ops
        if not ops:
            self.first = seq
        elif op is not ops[0]:
            self.mixed = True
        self.last = seq
        ops.append(op)
        self.keys.append(key)
        self.tables.append(table.table.ref)
        self.versions.append(table.version)
        return len(ops)

    def taken(self, source: str, db: str) -> LogLines:
        """The run as one `LogLines` of `source` and `db`."""
        ops, first = self.ops, self.first_table
        return LogLines(
            first.transaction.origin(first.table, source, db),
            first.version,
            ops[0],
            first.transaction.commit,
            self.first,
            self.last,
            self.keys,
            None,
            None,
            b"".join(self.data),
            ops if self.mixed else None,
            2,
            self.tables if self.several_tables else None,
            self.versions if self.several_tables else None,
            True,
        )


RUN_CHANGES = 512
"""The most changes the reader holds (`ChangeMapper.take_all`) before it hands them over."""
_ROW_CHANGES = (pgoutput.Insert, pgoutput.Update, pgoutput.Delete)
_INSERT, _UPDATE, _BEGIN, _COMMIT = b"IUBC"
_NEW_TUPLE, _OLD_KEY, _OLD_ROW = b"NKO"
ROW_CHANGE_TAGS = frozenset(b"IUD")
"""The first bytes of the messages `add_change` reads."""


class ChangeMapper:
    """Turns one stream of pgoutput messages into `LogItem`s.

    Keeps the relations the stream described and the transaction being read; `drop_transaction`
    forgets a transaction a lost stream cut short. A row event carries its table's version in
    `schema_versions` when it is built (the tailer's numbering, which it keeps current as it
    emits schema events: see `core.log.Change`); 0 for a table not in it.
    """

    def __init__(
        self,
        *,
        source: str,
        db: str,
        captured: Collection[TableRef],
        watermark: TableRef,
        describe: RelationLookup,
        schema_versions: Mapping[TableRef, int] | None = None,
    ) -> None:
        self._source = source
        self._db = db
        self._captured = frozenset(captured)
        self._watermark = watermark
        self._describe = describe
        self.schema_versions: Mapping[TableRef, int] = (
            {} if schema_versions is None else schema_versions
        )
        self._tables: dict[int, _Table] = {}
        self._transaction: _Transaction | None = None
        self._spell = row_json_encoder()
        """Spells the rows of the changes read from bytes (`_add`) into their lines."""
        self._run: _Run | None = None
        """The changes of the transaction being read, since it began or since they were last
        taken."""
        self._batch: list[LogLines] = []
        """The runs of the transactions read whole and not taken yet, in log order."""
        self._batch_changes = 0
        self._batch_counts: dict[tuple[str, str, Op], int] = {}
        """How many of the changes in `_batch` are of each (schema, table, operation)."""
        self._end = 0
        """The commit LSN of the last transaction read whole and not taken yet; 0 if none."""
        self.full = False
        """The changes held (`_batch` and `_run`) reached `RUN_CHANGES`: take them
        (`take_all`) before anything else."""

    @property
    def open_commit(self) -> int | None:
        """The commit LSN of the transaction being read; None between transactions."""
        return None if self._transaction is None else self._transaction.commit

    @property
    def holding(self) -> bool:
        """Whether changes or a transaction's end were read and not taken yet (`take_all`)."""
        return self._run is not None or self._end != 0

    def drop_transaction(self) -> None:
        """The stream was lost: the slot sends every unacknowledged transaction again, whole,
        including those read and not taken yet."""
        self._transaction = None
        self._run = None
        self._batch = []
        self._batch_changes = self._end = 0
        self._batch_counts = {}
        self.full = False

    def take_all(self) -> list[LogItem]:
        """What was read and not taken yet, in log order: the runs of the transactions read
        whole (one `LogLines`, or a `LogRuns` of several) and the last one's end, then the run
        of the transaction being read. Taken before any other message is mapped, before an
        `Idle`, before the reader waits, and once `full`."""
        items: list[LogItem] = []
        batch = self._batch
        if len(batch) == 1:
            items.append(batch[0])
        elif batch:
            data = b"".join([run.data for run in batch])
            items.append(LogRuns(batch, data, self._batch_changes, self._batch_counts))
        if batch:
            self._batch = []
            self._batch_changes = 0
            self._batch_counts = {}
        if self._end:
            items.append(TransactionEnd(self._end))
            self._end = 0
        run, self._run = self._run, None
        if run is not None:
            items.append(run.taken(self._source, self._db))
        self.full = False
        return items

    def map(self, message: pgoutput.Message) -> list[LogItem]:
        """The items of one message (most give one or none)."""
        if isinstance(message, _ROW_CHANGES):  # first: nearly every message is one
            return self._row_change(self._open("a row change"), message)
        if isinstance(message, pgoutput.Begin):
            self._transaction = _Transaction(
                message.final_lsn, message.xid, message.commit_ts_us // 1000
            )
        elif isinstance(message, pgoutput.Commit):
            self._transaction = None
            return [TransactionEnd(message.commit_lsn)]
        elif isinstance(message, pgoutput.Relation):
            return self._relation(message)
        elif isinstance(message, pgoutput.Truncate):
            return self._truncate(self._open("a truncate"), message)
        # OriginMessage and Type need nothing: values arrive as text either way.
        return []

    def map_bytes(self, data: bytes, start: int = 0) -> list[LogItem]:
        """`map(pgoutput.decode(data[start:]))`, but for a change read into a run of its own:
        the items of the message at `start`. A row change of a captured table, a Begin and a
        Commit are read straight from the bytes (`add_change`, `read_begin`, `read_commit`);
        any other message, or one those decline, is decoded the general way."""
        tag = data[start] if len(data) > start else 0
        if tag in ROW_CHANGE_TAGS:
            if self.add_change(data, start):
                return self.take_all()
        elif tag == _BEGIN:
            if self.read_begin(data, start):
                return []
        elif tag == _COMMIT and self.read_commit(data, start) is not None:
            return self.take_all()
        return self.map(pgoutput.decode(data[start:] if start else data))

    def read_begin(self, data: bytes, start: int) -> bool:
        """Open the transaction of the Begin message at `start`, read straight from the bytes;
        False when the message is not a whole Begin (the caller decodes it: `map_bytes`)."""
        if len(data) != start + 1 + pgoutput.BEGIN_SIZE or data[start] != _BEGIN:
            return False
        final_lsn, pg_micros, xid = pgoutput.BEGIN_AT(data, start + 1)
        self._transaction = _Transaction(
            final_lsn, xid, (pg_micros + pgoutput.PG_EPOCH_MICROS) // 1000
        )
        return True

    def read_commit(self, data: bytes, start: int) -> tuple[int, int] | None:
        """End the transaction with the Commit message at `start`, read straight from the
        bytes: its run joins the runs held and its end is held (`take_all`); without a run
        held, its end goes out at once (`full`). Its commit LSN and the end of its commit
        record; None when it is not a whole Commit."""
        if len(data) != start + 1 + pgoutput.COMMIT_SIZE or data[start] != _COMMIT:
            return None
        _, commit_lsn, end_lsn, _ = pgoutput.COMMIT_AT(data, start + 1)
        self._transaction = None
        run, self._run = self._run, None
        if run is not None:
            self._batch.append(run.taken(self._source, self._db))
            self._batch_changes += len(run.ops)
            counts = self._batch_counts
            for run_table in run.by_relation.values():
                ref = run_table.table.ref
                for op, count in run_table.counts.items():
                    counted = (ref.schema, ref.name, op)
                    counts[counted] = counts.get(counted, 0) + count
            if self._batch_changes >= RUN_CHANGES:
                self.full = True
        elif not self._batch:  # its items went out already, if any: so does its end
            self.full = True
        self._end = commit_lsn
        return commit_lsn, end_lsn

    def add_change(self, data: bytes, start: int) -> bool:
        """Read the change of the Insert, Update or Delete message at `start` straight from the
        bytes into the current run (`take_all`); False when the message must be decoded the
        general way (see `map_bytes`): an unchanged TOAST value, an update that changes the
        key (two events), a key-only old tuple without the whole key, or bytes that do not
        fit the relation. A change may make the changes held `full`."""
        transaction = self._transaction
        if transaction is None or len(data) < start + 8:
            return False
        (relation_id,) = pgoutput.U32_AT(data, start + 1)
        table = self._tables.get(relation_id)
        if table is None or not table.reads_bytes:
            return False
        read = table.tuples.read
        tag, marker, end = data[start], data[start + 5], len(data)
        if marker == _NEW_TUPLE:  # an insert, or an update under the default identity
            if tag == _INSERT:
                op = Op.CREATE
            elif tag == _UPDATE:
                op = Op.UPDATE
            else:
                return False
            new = read(data, start + 6)
            if new is None or new[2] != end:
                return False
            return self._add(table, transaction, op, new[1], None, new[0])
        identity = None
        if marker == _OLD_KEY:
            if (identity := table.identity_names) is None:
                return False
        elif marker != _OLD_ROW:
            return False
        old = read(data, start + 6)
        if old is None:
            return False
        before, key, at = old
        if identity is not None:  # a key-only old tuple: its other columns are nulls
            before = {name: before[name] for name in identity}
        if tag == _UPDATE:
            if at >= end or data[at] != _NEW_TUPLE:
                return False
            new = read(data, at + 1)
            if new is None or new[2] != end or new[1] != key:
                return False
            return self._add(table, transaction, Op.UPDATE, key, before, new[0])
        if tag != _INSERT and at == end:
            return self._add(table, transaction, Op.DELETE, key, before, None)
        return False

    def _add(
        self,
        table: _Table,
        transaction: _Transaction,
        op: Op,
        key: Row,
        before: Row | None,
        after: Row | None,
    ) -> bool:
        """Add the change read from bytes to the run; False when a value cannot be spelled (the
        general way raises it then)."""
        spell = table.plain_json
        if spell is None:
            spell = self._spell
        try:
            key_json = spell(key)
            before_json = b"null" if before is None else spell(before)
            after_json = b"null" if after is None else spell(after)
        except Exception:  # a value JSON cannot hold: the writer's encoding raises it
            self._spell = row_json_encoder()
            return False
        run = self._run
        if run is None:
            run = self._run = _Run(self._run_table(table, transaction))
        elif run.table.table is not table:
            known = run.by_relation.get(table.relation.relation_id)
            if known is None or known.table is not table:
                known = self._run_table(table, transaction)
                run.by_relation[table.relation.relation_id] = known
            run.table = known
            run.several_tables = True
        transaction.changes = changes = transaction.changes + 1
        json = (key_json, before_json, after_json)
        if run.add(op, key, json, 2 * changes - 1) + self._batch_changes >= (RUN_CHANGES):
            self.full = True
        return True

    def _run_table(self, table: _Table, transaction: _Transaction) -> _RunTable:
        """`table` in a run of `transaction`, at its schema version now, which holds for the
        whole run (any message but a change ends a run, so no schema item comes inside one)."""
        return _RunTable(table, transaction, self.schema_versions.get(table.ref, 0))

    def _open(self, what: str) -> _Transaction:
        if self._transaction is None:
            raise SourceError(f"pgoutput sent {what} outside a transaction")
        return self._transaction

    def _relation(self, relation: pgoutput.Relation) -> list[LogItem]:
        ref = TableRef(relation.namespace or "pg_catalog", relation.name)
        captured = ref in self._captured
        items: list[LogItem] = []
        schema: TableSchema | None = None
        if captured:
            transaction = self._open("a relation of a captured table")
            schema = self._describe(relation)
            if not schema.key:
                raise NoPrimaryKey(f"captured table {ref} has no primary key any more")
            items.append(
                SchemaDescription(
                    ref,
                    schema,
                    transaction.description_position(),
                    transaction.xid,
                    transaction.ts_ms,
                )
            )
        self._tables[relation.relation_id] = _Table.of(
            relation,
            ref,
            captured=captured,
            is_watermark=ref == self._watermark,
            key_columns=() if schema is None else schema.key,
            source=self._source,
            db=self._db,
        )
        return items

    def _truncate(self, transaction: _Transaction, message: pgoutput.Truncate) -> list[LogItem]:
        items: list[LogItem] = []
        for relation_id in message.relation_ids:
            table = self._tables.get(relation_id)
            if table is None:
                raise SourceError(f"pgoutput sent a truncate of relation {relation_id} first")
            if table.captured:
                position = transaction.next_position()
                items.append(Truncate(table.ref, position, transaction.xid, transaction.ts_ms))
        return items

    def _row_change(
        self,
        transaction: _Transaction,
        message: pgoutput.Insert | pgoutput.Update | pgoutput.Delete,
    ) -> list[LogItem]:
        table = self._tables.get(message.relation_id)
        if table is None:
            raise SourceError(f"pgoutput sent a change of relation {message.relation_id} first")
        if table.is_watermark:
            if isinstance(message, pgoutput.Update):
                value = table.row(message.new).get("value")
                if isinstance(value, str):
                    return [WatermarkWrite(value, transaction.next_position())]
            return []
        if not table.captured:
            return []

        if isinstance(message, pgoutput.Insert):
            after = table.row(message.new)
            return [self._event(table, transaction, Op.CREATE, table.key(after), None, after)]
        if isinstance(message, pgoutput.Delete):
            before = table.row(message.old, key_only=message.old_is_key_only)
            return [self._event(table, transaction, Op.DELETE, table.key(before), before, None)]
        old = (
            None
            if message.old is None
            else table.row(message.old, key_only=message.old_is_key_only)
        )
        new = table.row(message.new, unchanged_from=old)
        new_key = table.key(new, fallback=old)
        old_key = new_key if old is None else table.key(old)
        if old_key != new_key:
            return [
                self._event(table, transaction, Op.DELETE, old_key, old, None),
                self._event(table, transaction, Op.CREATE, new_key, None, new),
            ]
        return [self._event(table, transaction, Op.UPDATE, new_key, old, new)]

    def _event(
        self,
        table: _Table,
        transaction: _Transaction,
        op: Op,
        key: Row,
        before: Row | None,
        after: Row | None,
    ) -> Change:
        """Built when its message is mapped, after the session took every item of the messages
        before it: a schema event it emitted for a description is in `schema_versions` by
        then (one message never holds both a description and a change)."""
        ref = table.ref
        source = SourceInfo(
            self._source,
            self._db,
            ref.schema,
            ref.name,
            transaction.next_position(),
            Origin.LOG,
            None,
            None,
            transaction.xid,
            transaction.ts_ms,
        )
        return Change(PlainEvent(op, key, before, after, source, self.schema_versions.get(ref, 0)))
