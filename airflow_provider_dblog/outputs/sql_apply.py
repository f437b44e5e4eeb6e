"""Apply the change stream to tables in a PostgreSQL target: upsert c/u/r, delete d, by key;
truncate at `t`, alter the table at `s`.

Each batch is one transaction, sent in one pipeline. The target tables must exist with the
source's columns and primary key: creating them from events would guess types, so a missing or
different table is an error naming it. Column types are read from the target once per table and
values adapted to them: dicts and lists for json/jsonb, base64 text for bytea, lists for arrays;
every parameter is cast to its column's type, so numeric, uuid, timestamptz and the like travel as
the strings the source made of them. A column absent from `after` (an unchanged TOAST value the
source could not send) is left as it is in the target.

A replay (the tailer re-sends everything after its last acknowledged position) ends in the same
state, since it repeats the same images in the same order; but while it catches up, a key can go
back to an older image for a moment. Monotonic mode rules that out, and any other older image (a
dump row older than what the target holds): it keeps the last applied position of every key in
`dblog_positions`, updated in the same statement as the row, and skips an event whose position is
not newer. Deleted keys keep their row there (marked `deleted`: a tombstone), so an old image
cannot bring a deleted row back. Tombstones older than a horizon no older image can still come
from are pruned (`prune_tombstones`, run by direct dumps: see `core/direct.py`), so the table
holds the live keys and the recent deletes. (Rows written before the `deleted` column existed
count as live and are never pruned.)

Direct dumps (`SqlDirectTarget`) write their rows here too, from wherever they were read (Spark
executors), each part in a transaction of its own with the same monotonic statements: a row
positioned at its window's hw loses to any event of its key at a higher position, whichever
commits first. Those transactions take no fence: they do not come from a tailer, and the row
locks of `dblog_positions` order them against the tailer's batches.

A JSON null and an SQL NULL arrive alike (None) and are written as SQL NULL.

Truncate (`t`): the target table is truncated in the batch's transaction. In monotonic mode the
truncate's position becomes the table's floor (a row of `dblog_positions` with the JSON key
`null`), its per-key rows are deleted, and every later statement also refuses an event at or
before the floor: no row positioned before the truncate comes back, whatever is replayed.

Schema change (`s`), applied in the batch's transaction, so the target table follows its source
table's columns (`dblog_schemas` keeps, per source table, the version and schema last applied; a
replayed older version is skipped):
- a column the target lacks is added with the source's type, default and NOT NULL, so the
  target's existing rows get the default as the source's did (a volatile default such as now()
  or a sequence gives them other values than the source's, or fails: dump the table after such
  an ALTER);
- a column the last applied schema had and the new one lacks is dropped (columns of the
  target's own, never in the source, are left alone);
- a type that changed since the last applied schema is applied if PostgreSQL converts the column
  without a USING clause (int to bigint, a longer varchar, to text); otherwise the output stops
  (`OutputError`) saying what to alter in the target before the tailer is started again;
- the defaults and NOT NULL of existing columns and the primary key are left as they are: they
  change no row. The first schema event of a table only adds missing columns.
A replay that crosses a dropped column carries rows with it: that column is left out of the
rows older than the schema applied (they are older images the replay goes past anyway).
Types and defaults are the source's SQL text, run in the target: a target trusts its source's
catalog, and must be PostgreSQL when the source is.

Fencing: `dblog_fence` holds, per source, the largest lease token that wrote. Each batch's
transaction first raises it to the writer's token, or finds it larger and rolls back
(`OutputFenced`): the row lock taken there also orders two leaders' batches, so a stale leader's
transaction commits nothing once the new leader's first batch has. The output creates
`dblog_fence` (and `dblog_positions`) if missing, so its user needs CREATE on the schema.

A connection lost anywhere in a batch (while connecting, inside the transaction or its pipeline,
a fast shutdown's AdminShutdown) is `OutputUnavailable`; the transaction did not commit. The next
write connects again and reads the target tables' columns again.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import random
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import Json, Jsonb

from airflow_provider_dblog.core.direct import DirectRecord
from airflow_provider_dblog.core.dump_plan import Chunk
from airflow_provider_dblog.core.event import (
    Event,
    JsonValue,
    Op,
    Origin,
    PlainEvent,
    Row,
    SourceInfo,
    TableRef,
    key_of,
)
from airflow_provider_dblog.core.position import Position
from airflow_provider_dblog.core.schema import Column, TableSchema
from airflow_provider_dblog.dump.staging import StagedRead, stage_rows_read
from airflow_provider_dblog.outputs.base import (
    Output,
    OutputError,
    OutputFenced,
    OutputUnavailable,
    TargetTableMissing,
)
from airflow_provider_dblog.sources.base import ChunkSource

POSITIONS_TABLE = "dblog_positions"
FENCE_TABLE = "dblog_fence"
_CONFLICT_ATTEMPTS = 10
"""Tries of a transaction (the tailer's batch, a direct part) that deadlocks with another on
the same keys: the tailer's batches and a direct dump's parts lock keys in different orders."""
SCHEMAS_TABLE = "dblog_schemas"

_SETUP_LOCK = sql.SQL("SELECT pg_advisory_xact_lock(431148003175)")
"""Held while an output creates its bookkeeping tables (the number spells "dblog" in ASCII)."""

_CREATE_FENCE = sql.SQL(
    "CREATE TABLE IF NOT EXISTS {table} (source text PRIMARY KEY, token bigint NOT NULL)"
).format(table=sql.Identifier(FENCE_TABLE))

# Returns a row unless the stored token is larger. The conflicting row is locked either way,
# until the batch's transaction ends.
_RAISE_FENCE = sql.SQL(
    """INSERT INTO {table} AS f (source, token) VALUES (%s, %s)
ON CONFLICT (source) DO UPDATE SET token = EXCLUDED.token WHERE f.token <= EXCLUDED.token
RETURNING token"""
).format(table=sql.Identifier(FENCE_TABLE))

_FENCE = sql.SQL("SELECT token FROM {table} WHERE source = %s").format(
    table=sql.Identifier(FENCE_TABLE)
)

_CREATE_POSITIONS = sql.SQL(
    """CREATE TABLE IF NOT EXISTS {table} (
    source text NOT NULL,
    schema text NOT NULL,
    tbl text NOT NULL,
    key jsonb NOT NULL,
    commit numeric(20, 0) NOT NULL,
    seq int NOT NULL,
    deleted boolean NOT NULL DEFAULT false,
    PRIMARY KEY (source, schema, tbl, key)
)"""
).format(table=sql.Identifier(POSITIONS_TABLE))

# A positions table made before tombstones were marked: its rows count as live keys.
_ADD_DELETED = sql.SQL(
    "ALTER TABLE {table} ADD COLUMN IF NOT EXISTS deleted boolean NOT NULL DEFAULT false"
).format(table=sql.Identifier(POSITIONS_TABLE))
# The ALTER takes an exclusive lock even when the column exists: behind a stopped leader's
# open batch it would hang the new leader. So it runs only on a table made before the column.
_HAS_DELETED = sql.SQL(
    "SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass(%s) AND attname = 'deleted' "
    "AND NOT attisdropped"
)

_PRUNE_TOMBSTONES = sql.SQL(
    """DELETE FROM {table} WHERE source = %s AND schema = %s AND tbl = %s AND deleted
AND key <> 'null'::jsonb AND (commit, seq) < (%s::numeric, %s::int)"""
).format(table=sql.Identifier(POSITIONS_TABLE))

# The (only) CTE of a monotonic statement: records the event's position for its key if it is
# newer than the stored one and after the table's floor (its last truncate), and returns a row
# only then. A delete leaves its key's row marked `deleted`.
_NEWER = sql.SQL(
    """WITH newer AS (
    INSERT INTO {table} AS p (source, schema, tbl, key, commit, seq, deleted)
    SELECT e.* FROM (VALUES (%s, %s, %s, %s::jsonb, %s::numeric, %s::int, %s::boolean))
        AS e (source, schema, tbl, key, commit, seq, deleted)
    WHERE NOT EXISTS (
        SELECT FROM {table} f
        WHERE f.source = e.source AND f.schema = e.schema AND f.tbl = e.tbl
        AND f.key = 'null'::jsonb AND (f.commit, f.seq) >= (e.commit, e.seq)
    )
    ON CONFLICT (source, schema, tbl, key)
    DO UPDATE SET commit = EXCLUDED.commit, seq = EXCLUDED.seq, deleted = EXCLUDED.deleted
    WHERE (p.commit, p.seq) < (EXCLUDED.commit, EXCLUDED.seq)
    RETURNING 1
) """
).format(table=sql.Identifier(POSITIONS_TABLE))

# Raises a table's floor to a truncate's position; a row only if the truncate is newer.
_RAISE_FLOOR = sql.SQL(
    """INSERT INTO {table} AS p (source, schema, tbl, key, commit, seq)
VALUES (%s, %s, %s, 'null'::jsonb, %s::numeric, %s::int)
ON CONFLICT (source, schema, tbl, key)
DO UPDATE SET commit = EXCLUDED.commit, seq = EXCLUDED.seq
WHERE (p.commit, p.seq) < (EXCLUDED.commit, EXCLUDED.seq)
RETURNING 1"""
).format(table=sql.Identifier(POSITIONS_TABLE))

_DROP_KEY_POSITIONS = sql.SQL(
    "DELETE FROM {table} WHERE source = %s AND schema = %s AND tbl = %s AND key <> 'null'::jsonb"
).format(table=sql.Identifier(POSITIONS_TABLE))

_CREATE_SCHEMAS = sql.SQL(
    """CREATE TABLE IF NOT EXISTS {table} (
    source text NOT NULL,
    schema text NOT NULL,
    tbl text NOT NULL,
    version bigint NOT NULL,
    table_schema jsonb NOT NULL,
    PRIMARY KEY (source, schema, tbl)
)"""
).format(table=sql.Identifier(SCHEMAS_TABLE))

_APPLIED_SCHEMA = sql.SQL(
    "SELECT version, table_schema FROM {table} WHERE source = %s AND schema = %s AND tbl = %s"
).format(table=sql.Identifier(SCHEMAS_TABLE))

_SAVE_SCHEMA = sql.SQL(
    """INSERT INTO {table} (source, schema, tbl, version, table_schema)
VALUES (%s, %s, %s, %s, %s)
ON CONFLICT (source, schema, tbl) DO UPDATE SET version = EXCLUDED.version,
table_schema = EXCLUDED.table_schema"""
).format(table=sql.Identifier(SCHEMAS_TABLE))

# A target table's columns and their full types, to compare with a schema event's.
_COLUMN_TYPES = """
SELECT a.attname, format_type(a.atttypid, a.atttypmod)
FROM pg_attribute a
WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum
"""

_RELATION = """
SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %s AND c.relname = %s AND c.relkind IN ('r', 'p')
"""

# Domains are looked through to their base type, arrays to their element type. Parameters are
# cast to the type without its modifier: an explicit cast to varchar(n) truncates silently, while
# the assignment to the column errors. bpchar and bit keep theirs: alone they mean length 1.
_COLUMNS = """
SELECT a.attname, b.typname, e.typname, format_type(
    a.atttypid,
    CASE WHEN coalesce(e.typname, b.typname) IN ('bpchar', 'bit') THEN a.atttypmod END
)
FROM pg_attribute a
JOIN pg_type t ON t.oid = a.atttypid
JOIN pg_type b ON b.oid = CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE t.oid END
LEFT JOIN pg_type e ON e.oid = b.typelem AND b.typcategory = 'A'
WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum
"""

_PRIMARY_KEY = """
SELECT a.attname
FROM pg_index i
CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, n)
JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
WHERE i.indrelid = %s AND i.indisprimary
ORDER BY k.n
"""


def _runs(events: Sequence[Event]) -> Iterator[Event | Sequence[Event]]:
    """The batch in order: runs of row events, and each table-level event on its own."""
    start = 0
    for index, event in enumerate(events):
        if event.op.is_table_level:
            if start < index:
                yield events[start:index]
            yield event
            start = index + 1
    if start < len(events):
        yield events[start:]


def _dump_event(
    source_name: str, table: TableRef, target: _Target, row: Row, position: Position
) -> Event:
    """A direct dump's row as the `r` event the tailer would have emitted for it."""
    try:
        key_row = {c: row[c] for c in target.key}
    except KeyError as missing:
        raise TargetTableMissing(
            f"target table {target.ref} is keyed by ({', '.join(target.key)}) but a dumped row "
            f"of {table} has no column {missing}"
        ) from None
    source = SourceInfo(source_name, "", table.schema, table.name, position, Origin.DUMP)
    return PlainEvent(Op.READ, key_row, None, row, source, 0)


def _column_definition(column: Column) -> sql.Composed:
    """`name type [DEFAULT ...] [NOT NULL]` as the source spells them."""
    parts = [sql.Identifier(column.name), sql.SQL(column.type)]
    if column.default is not None:
        parts += [sql.SQL("DEFAULT"), sql.SQL(column.default)]
    if not column.nullable:
        parts.append(sql.SQL("NOT NULL"))
    return sql.SQL(" ").join(parts)


def _adapter(type_name: str) -> Callable[[JsonValue], Any]:
    """How a JSON value becomes a parameter for a column of base type `type_name`."""
    if type_name == "jsonb":
        return Jsonb
    if type_name == "json":
        return Json
    if type_name == "bytea":
        return lambda v: base64.b64decode(v) if isinstance(v, str) else v
    return lambda v: v


def _array_adapter(element: Callable[[JsonValue], Any]) -> Callable[[JsonValue], Any]:
    def adapt(value: JsonValue) -> Any:
        if isinstance(value, list):
            return [None if v is None else adapt(v) for v in value]  # nested: multi-dim arrays
        return element(value)

    return adapt


@dataclass(frozen=True)
class _Column:
    type_sql: str
    """`format_type` of the column: what every parameter is cast to."""
    adapt: Callable[[JsonValue], Any]


@dataclass(frozen=True)
class _Target:
    """A target table as the catalog describes it."""

    ref: TableRef
    columns: Mapping[str, _Column]
    key: tuple[str, ...]

    def placeholder(self, column: str) -> sql.Composable:
        return sql.SQL("%s::{}").format(sql.SQL(self.columns[column].type_sql))

    def check(self, source: TableRef, key: Row, columns: Sequence[str]) -> None:
        if set(key) != set(self.key):
            raise TargetTableMissing(
                f"target table {self.ref} has primary key ({', '.join(self.key)}) but events "
                f"of {source} are keyed by ({', '.join(key)}): give it the source's primary key"
            )
        missing = [c for c in columns if c not in self.columns]
        if missing:
            raise TargetTableMissing(
                f"target table {self.ref} has no column {', '.join(missing)} that events of "
                f"{source} carry: add the column"
            )


@dataclass(frozen=True)
class _Action:
    """One statement's worth of an event: upsert `values`, or delete `key` when values is None."""

    event: Event
    target: _Target
    key: Row
    values: Row | None

    def shape(self) -> tuple[TableRef, tuple[str, ...] | None]:
        return self.target.ref, None if self.values is None else tuple(self.values)


class SqlApplyOutput(Output):
    """Upserts and deletes into a PostgreSQL target over one connection (`dsn`).

    `table_map` maps a source table ("schema.table") to its target table ("schema.table", or a
    bare name in the source's schema); unmapped tables go to the same schema and name.
    `monotonic` turns on the per-key position check described in the module docstring.
    """

    def __init__(
        self,
        dsn: str,
        *,
        monotonic: bool = False,
        table_map: Mapping[str, str] | None = None,
        connect_timeout: int = 10,
    ) -> None:
        self._dsn = dsn
        self.monotonic = monotonic
        self._connect_timeout = connect_timeout
        self._table_map = {
            TableRef.parse(src): TableRef.parse(dst, default_schema=TableRef.parse(src).schema)
            for src, dst in (table_map or {}).items()
        }
        self._targets: dict[TableRef, _Target] = {}
        self._statements: dict[tuple[TableRef, tuple[str, ...] | None], sql.Composed] = {}
        self._conn: psycopg.Connection[Any] | None = None
        self._closed = False
        self._connection()

    def target_of(self, source: TableRef) -> TableRef:
        return self._table_map.get(source, source)

    def _connection(self) -> psycopg.Connection[Any]:
        """The open connection, or a new one if the last one broke (a batch is retried whole).
        A new connection reads the target tables again: the target may have changed while it
        was away."""
        if self._closed:
            raise OutputError("sql_apply output is closed")
        if self._conn is None or self._conn.closed or self._conn.broken:
            self._targets.clear()
            self._statements.clear()
            try:
                self._conn = psycopg.connect(
                    self._dsn, autocommit=True, connect_timeout=self._connect_timeout
                )
            except psycopg.OperationalError as exc:
                raise OutputUnavailable(f"cannot connect to the SQL target: {exc}") from exc
            # Many writers may connect at once (the tailer, a direct dump's Spark tasks):
            # concurrent CREATE TABLE IF NOT EXISTS of one table can fail on PostgreSQL's
            # catalog (a unique violation), so the bookkeeping tables are made one at a time.
            with self._errors(), self._conn.transaction():
                self._conn.execute(_SETUP_LOCK)
                self._conn.execute(_CREATE_FENCE)
                self._conn.execute(_CREATE_SCHEMAS)
                if self.monotonic:
                    self._conn.execute(_CREATE_POSITIONS)
                    if self._conn.execute(_HAS_DELETED, (POSITIONS_TABLE,)).fetchone() is None:
                        self._conn.execute(_ADD_DELETED)
        return self._conn

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        """psycopg errors as the output's error types, with messages that say what to do."""
        try:
            yield
        except (psycopg.errors.UndefinedTable, psycopg.errors.UndefinedColumn) as exc:
            self._targets.clear()  # described again at the next write
            raise TargetTableMissing(f"a target table went away or changed: {exc}") from exc
        except psycopg.Error as exc:
            # Operational errors (a lost connection, a shutdown, a timeout) and rolled-back
            # transactions (deadlock, serialization) may pass when retried; PipelineAborted
            # only follows an error of an earlier statement.
            conn = self._conn
            lost = conn is None or conn.closed or conn.broken
            transient = isinstance(
                exc, psycopg.OperationalError | psycopg.errors.TransactionRollback
            ) and not isinstance(exc, psycopg.errors.PipelineAborted)
            if lost or transient:
                if conn is not None:
                    conn.close()  # the next write connects again
                raise OutputUnavailable(f"the SQL target went away: {exc}") from exc
            raise OutputError(f"the SQL target refused a batch: {exc}") from exc

    def write(self, events: Sequence[Event], token: int) -> None:
        """Apply one batch in one transaction; a batch rolled back by a deadlock with a direct
        dump's part on the same keys is tried again at once (not left to the caller's backoff,
        which would stall the tailer)."""
        if not events:
            return
        for attempt in itertools.count(1):
            try:
                self._write_once(events, token)
                return
            except OutputUnavailable as exc:
                if not _rolled_back_by_conflict(exc) or attempt >= _CONFLICT_ATTEMPTS:
                    raise
                time.sleep(random.uniform(0.01, 0.05) * attempt)

    def _write_once(self, events: Sequence[Event], token: int) -> None:
        conn = self._connection()
        try:
            with self._errors(), conn.transaction():
                for source in sorted({e.source.name for e in events}):
                    self._raise_fence(conn, source, token)
                for run in _runs(events):
                    if isinstance(run, Event):
                        self._table_level(conn, run)
                    else:
                        self._apply_rows(conn, run)
        except BaseException:
            # Rolled back: tables described inside the transaction may show its DDL.
            self._targets.clear()
            self._statements.clear()
            raise

    def _apply_rows(self, conn: psycopg.Connection[Any], events: Sequence[Event]) -> None:
        actions = list(self._actions(conn, events))
        with conn.pipeline(), conn.cursor() as cur:
            start = 0
            while start < len(actions):
                end = start + 1
                while end < len(actions) and actions[end].shape() == actions[start].shape():
                    end += 1
                group = actions[start:end]
                statement = self._statement(group[0])
                cur.executemany(statement, [self._params(a) for a in group])
                start = end

    # -- direct dumps ---------------------------------------------------------------------------

    def write_direct(
        self, source_name: str, table: TableRef, rows: Sequence[Row], position: Position
    ) -> int:
        """Upsert a direct dump's rows of `source_name`'s table `table`, all at `position`, in one
        transaction of their own (no fence: see the module docstring); returns the rows
        applied (a key an event at a higher position reached is left alone). Monotonic mode
        only. A deadlock with the tailer's batch on the same keys is retried."""
        if not self.monotonic:
            raise OutputError("direct dumps into SQL apply need monotonic = true")
        if not rows:
            return 0
        for attempt in itertools.count(1):
            conn = self._connection()
            try:
                with self._errors(), conn.transaction():
                    target = self._describe(conn, table)
                    self._targets[table] = target
                    events = [
                        _dump_event(source_name, table, target, row, position) for row in rows
                    ]
                    return self._apply_counted(conn, events)
            except OutputUnavailable as exc:
                if not _rolled_back_by_conflict(exc) or attempt >= _CONFLICT_ATTEMPTS:
                    raise
                time.sleep(random.uniform(0.01, 0.05) * attempt)
            finally:
                self._targets.pop(table, None)
                self._statements.clear()
        raise AssertionError("unreachable")

    def _apply_counted(self, conn: psycopg.Connection[Any], events: Sequence[Event]) -> int:
        applied = 0
        actions = list(self._actions(conn, events))
        with conn.cursor() as cur:
            for _, group in itertools.groupby(actions, key=_Action.shape):
                batch = list(group)
                cur.executemany(self._statement(batch[0]), [self._params(a) for a in batch])
                applied += max(cur.rowcount, 0)
        return applied

    def prune_tombstones(self, source_name: str, table: TableRef, before: Position) -> int:
        """Forget the deleted keys of `table` positioned before `before` (monotonic mode): no
        older image of them can come any more (see `core.direct.tombstone_horizon`)."""
        if not self.monotonic:
            return 0
        conn = self._connection()
        with self._errors():
            cur = conn.execute(
                _PRUNE_TOMBSTONES,
                (source_name, table.schema, table.name, before.commit, before.seq),
            )
            return max(cur.rowcount, 0)

    # -- table-level events ---------------------------------------------------------------------

    def _table_level(self, conn: psycopg.Connection[Any], event: Event) -> None:
        target = self._describe(conn, event.table)
        self._targets.pop(event.table, None)  # described again at its next row
        self._statements.clear()
        if event.op is Op.TRUNCATE:
            self._truncate(conn, event, target)
        else:
            self._alter(conn, event, target)

    def _truncate(self, conn: psycopg.Connection[Any], event: Event, target: _Target) -> None:
        table = sql.Identifier(target.ref.schema, target.ref.name)
        if self.monotonic:
            where = (event.source.name, event.table.schema, event.table.name)
            position = (event.position.commit, event.position.seq)
            if conn.execute(_RAISE_FLOOR, (*where, *position)).fetchone() is None:
                return  # a replay: the floor is at or past it
            conn.execute(_DROP_KEY_POSITIONS, where)
        conn.execute(sql.SQL("TRUNCATE {}").format(table))

    def _alter(self, conn: psycopg.Connection[Any], event: Event, target: _Target) -> None:
        """Give the target the event's columns (see the module docstring for what is done)."""
        schema = event.table_schema
        assert schema is not None  # an `s` event carries one
        where = (event.source.name, event.table.schema, event.table.name)
        applied = conn.execute(_APPLIED_SCHEMA, where).fetchone()
        if applied is not None and applied[0] >= event.schema_version:
            return  # a replay of a schema already applied
        previous = None if applied is None else TableSchema.from_json(applied[1])
        oid = conn.execute(_RELATION, (target.ref.schema, target.ref.name)).fetchone()
        assert oid is not None  # described just before, in this transaction
        types: dict[str, str] = dict(conn.execute(_COLUMN_TYPES, (oid[0],)).fetchall())
        table = sql.Identifier(target.ref.schema, target.ref.name)
        for column in schema.columns:
            old = None if previous is None else previous.column(column.name)
            if column.name not in types:
                add = sql.SQL("ALTER TABLE {} ADD COLUMN {}")
                self._ddl(conn, event, add.format(table, _column_definition(column)))
            elif old is not None and old.type != column.type != types[column.name]:
                self._ddl(
                    conn,
                    event,
                    sql.SQL("ALTER TABLE {} ALTER COLUMN {} TYPE {}").format(
                        table, sql.Identifier(column.name), sql.SQL(column.type)
                    ),
                    f"column {column.name} changed type from {old.type} to {column.type} in "
                    "the source, and the target cannot convert it without a USING clause: "
                    f"ALTER TABLE {target.ref} ALTER COLUMN {column.name} TYPE {column.type} "
                    "USING ... as the source did, then start the tailer again",
                )
        for old in () if previous is None else previous.columns:
            if old.name in types and schema.column(old.name) is None:
                drop = sql.SQL("ALTER TABLE {} DROP COLUMN {}")
                self._ddl(conn, event, drop.format(table, sql.Identifier(old.name)))
        conn.execute(_SAVE_SCHEMA, (*where, event.schema_version, Jsonb(schema.to_json())))

    @staticmethod
    def _ddl(
        conn: psycopg.Connection[Any],
        event: Event,
        statement: sql.Composed,
        what_to_do: str | None = None,
    ) -> None:
        try:
            conn.execute(statement)
        except psycopg.Error as exc:
            if isinstance(exc, psycopg.OperationalError) or (conn.closed or conn.broken):
                raise
            detail = what_to_do or (
                "apply the change to the target table by hand, then start the tailer again"
            )
            raise OutputError(
                f"cannot apply the schema change of {event.table} at {event.position} "
                f"(schema_version {event.schema_version}) to the SQL target: "
                f"{str(exc).strip().splitlines()[0]}; {detail}"
            ) from exc

    # -- row events -----------------------------------------------------------------------------

    @staticmethod
    def _raise_fence(conn: psycopg.Connection[Any], source: str, token: int) -> None:
        """Inside the batch's transaction: record `token` as `source`'s fence, or refuse."""
        if conn.execute(_RAISE_FENCE, (source, token)).fetchone() is None:
            row = conn.execute(_FENCE, (source,)).fetchone()
            assert row is not None  # the refusing row is locked by this transaction
            raise OutputFenced(f"SQL target (source {source})", token, int(row[0]))

    def _actions(self, conn: psycopg.Connection[Any], events: Sequence[Event]) -> Iterator[_Action]:
        for event in events:
            target, dropped = self._target(conn, event)
            if event.op is Op.DELETE:
                yield _Action(event, target, event.key, None)
                continue
            if event.after is None:
                raise OutputError(f"{event.op.value} event of {event.table} has no 'after' row")
            old_key = self._changed_key(event, target)
            if old_key is not None:
                yield _Action(event, target, old_key, None)
            values = {**event.after, **event.key}
            if dropped:
                values = {c: v for c, v in values.items() if c not in dropped}
            yield _Action(event, target, event.key, values)

    @staticmethod
    def _changed_key(event: Event, target: _Target) -> Row | None:
        """The old key of an update that changed the primary key: that row must go."""
        if event.op is not Op.UPDATE or not event.before:
            return None
        if not all(c in event.before for c in target.key):
            return None
        if key_of(event.before, target.key) == key_of(event.key, target.key):
            return None
        return {c: event.before[c] for c in target.key}

    def _target(
        self, conn: psycopg.Connection[Any], event: Event
    ) -> tuple[_Target, frozenset[str]]:
        """The event's target table, and the columns of the event to leave out (`_dropped`)."""
        columns = list(event.key) + list(event.after or ())
        target = self._targets.get(event.table)
        dropped: frozenset[str] = frozenset()
        if target is None or any(c not in target.columns for c in columns):
            # New table, or the target may have been altered since it was read.
            target = self._targets[event.table] = self._describe(conn, event.table)
            self._statements.clear()
            dropped = self._dropped(conn, event, target, columns)
        target.check(event.table, event.key, [c for c in columns if c not in dropped])
        return target, dropped

    @staticmethod
    def _dropped(
        conn: psycopg.Connection[Any], event: Event, target: _Target, columns: Sequence[str]
    ) -> frozenset[str]:
        """The event's columns the target lacks because a later schema event, already applied,
        dropped them: a replay (a restarted tailer re-sends what came after its last
        acknowledged position) carries the rows of before the DROP COLUMN. Any other missing
        column is the target's fault, and `check` names it."""
        missing = frozenset(c for c in columns if c not in target.columns) - set(event.key)
        if not missing:
            return missing
        where = (event.source.name, event.table.schema, event.table.name)
        applied = conn.execute(_APPLIED_SCHEMA, where).fetchone()
        if applied is None or applied[0] <= event.schema_version:
            return frozenset()
        later = TableSchema.from_json(applied[1])
        return frozenset(c for c in missing if later.column(c) is None)

    def _describe(self, conn: psycopg.Connection[Any], source: TableRef) -> _Target:
        ref = self.target_of(source)
        row = conn.execute(_RELATION, (ref.schema, ref.name)).fetchone()
        if row is None:
            raise TargetTableMissing(
                f"target table {ref} (for {source}) does not exist: create it with the "
                "source's columns and primary key"
            )
        oid = row[0]
        columns = {}
        for name, base, element, type_sql in conn.execute(_COLUMNS, (oid,)):
            adapt = _array_adapter(_adapter(element)) if element else _adapter(base)
            columns[name] = _Column(type_sql, adapt)
        key = tuple(r[0] for r in conn.execute(_PRIMARY_KEY, (oid,)))
        if not key:
            raise TargetTableMissing(f"target table {ref} has no primary key: give it the source's")
        return _Target(ref, columns, key)

    def _statement(self, action: _Action) -> sql.Composed:
        shape = action.shape()
        statement = self._statements.get(shape)
        if statement is None:
            statement = self._statements[shape] = self._build(action.target, shape[1])
        return statement

    def _build(self, target: _Target, columns: tuple[str, ...] | None) -> sql.Composed:
        table = sql.Identifier(target.ref.schema, target.ref.name)
        newer = sql.SQL(" AND EXISTS (SELECT FROM newer)") if self.monotonic else sql.SQL("")
        prefix = _NEWER if self.monotonic else sql.SQL("")
        if columns is None:
            match = sql.SQL(" AND ").join(
                sql.SQL("{} = {}").format(sql.Identifier(c), target.placeholder(c))
                for c in target.key
            )
            return sql.SQL("{}DELETE FROM {} WHERE {}{}").format(prefix, table, match, newer)
        names = sql.SQL(", ").join(map(sql.Identifier, columns))
        values = sql.SQL(", ").join(target.placeholder(c) for c in columns)
        updates = [c for c in columns if c not in target.key]
        on_conflict: sql.Composable
        if updates:
            on_conflict = sql.SQL("DO UPDATE SET {}").format(
                sql.SQL(", ").join(
                    sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(c)) for c in updates
                )
            )
        else:
            on_conflict = sql.SQL("DO NOTHING")
        source = (
            sql.SQL("SELECT {} WHERE EXISTS (SELECT FROM newer)").format(values)
            if self.monotonic
            else sql.SQL("VALUES ({})").format(values)
        )
        return sql.SQL("{}INSERT INTO {} ({}) {} ON CONFLICT ({}) {}").format(
            prefix,
            table,
            names,
            source,
            sql.SQL(", ").join(map(sql.Identifier, target.key)),
            on_conflict,
        )

    def _params(self, action: _Action) -> list[Any]:
        params: list[Any] = []
        if self.monotonic:
            event = action.event
            params += [event.source.name, event.table.schema, event.table.name]
            params += [Jsonb(action.key), event.position.commit, event.position.seq]
            params.append(action.values is None)
        columns = action.target.columns
        if action.values is None:
            return params + [columns[c].adapt(action.key[c]) for c in action.target.key]
        return params + [
            None if v is None else columns[c].adapt(v) for c, v in action.values.items()
        ]

    def close(self) -> None:
        self._closed = True
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _rolled_back_by_conflict(exc: OutputUnavailable) -> bool:
    """SQLSTATE class 40: a deadlock or a serialization failure; the transaction was rolled
    back and may be tried again as it was."""
    sqlstate = getattr(exc.__cause__, "sqlstate", None) or ""
    return bool(sqlstate.startswith("40"))


class SqlDirectTarget:
    """The `DirectTarget` (dump/direct_target.py) of SQL apply in monotonic mode: `stage` keeps
    its part as the handle itself (the rows as JSON), and `commit` upserts the chunk's survivors
    from the driver in one transaction, each refused where the target holds a higher position.
    The rows pass through the driver (one chunk at a time), not through the tailer; one
    database takes the writes however many tasks read."""

    def __init__(
        self,
        dsn: str,
        source_name: str,
        *,
        table_map: Mapping[str, str] | None = None,
        connect_timeout: int = 10,
    ) -> None:
        self._source_name = source_name
        self._options: dict[str, Any] = {
            "monotonic": True,
            "table_map": table_map,
            "connect_timeout": connect_timeout,
        }
        self._dsn = dsn
        self._local = threading.local()
        self._outputs: list[SqlApplyOutput] = []
        self._lock = threading.Lock()

    @property
    def _output(self) -> SqlApplyOutput:
        """This thread's output: a connection is used by one thread at a time, and a dump's
        chunks in flight run in threads of their own."""
        output: SqlApplyOutput | None = getattr(self._local, "output", None)
        if output is None:
            output = self._local.output = SqlApplyOutput(self._dsn, **self._options)
            with self._lock:
                self._outputs.append(output)
        return output

    @classmethod
    def from_output_config(cls, output: Mapping[str, Any], source_name: str) -> SqlDirectTarget:
        """From the deployment's `[output]` section (a monotonic sql_apply output)."""
        name = output.get("dsn_env")
        dsn = os.environ.get(name) if isinstance(name, str) else None
        if not dsn:
            raise OutputError(f"sql_apply output: environment variable {name} (dsn_env) is not set")
        return cls(
            dsn,
            source_name,
            table_map=output.get("table_map"),
            connect_timeout=output.get("connect_timeout", 10),
        )

    def stage(self, table: TableRef, rows: Sequence[Row]) -> str:
        """The handle of `rows`: the rows themselves, as JSON."""
        return json.dumps(rows, separators=(",", ":"))

    def stage_chunk(
        self, source: ChunkSource, chunk: Chunk, key_columns: Sequence[str]
    ) -> StagedRead:
        return stage_rows_read(self.stage, source, chunk, key_columns)

    def commit(
        self,
        table: TableRef,
        handles: Sequence[str],
        record: DirectRecord,
        key_columns: Sequence[str],
    ) -> int:
        rows = [row for handle in handles for row in json.loads(handle)]
        survivors = record.survivors(rows, key_columns)
        return self._output.write_direct(self._source_name, table, survivors, record.rows_position)

    def discard(self, table: TableRef, handles: Sequence[str]) -> None:
        """Nothing to forget: the rows were in the handles."""

    def prune_tombstones(self, table: TableRef, before: Position) -> int:
        return self._output.prune_tombstones(self._source_name, table, before)

    def close(self) -> None:
        with self._lock:
            outputs, self._outputs = self._outputs, []
        for output in outputs:
            output.close()
