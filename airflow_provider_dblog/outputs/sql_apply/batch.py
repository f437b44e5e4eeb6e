"""One batch of the change stream, one transaction on the target: the connection and what it
knows of the target, the fence, and the retry of a transaction a deadlock rolled back.

Each batch is one transaction, sent in one pipeline. The target tables must exist with the
source's columns and primary key: creating them from events would guess types, so a missing or
different table is an error naming it (`target.py`).

Fencing: `dblog_fence` holds, per source, the largest lease token that wrote. Each batch's
transaction first raises it to the writer's token, or finds it larger and rolls back
(`OutputFenced`): the row lock taken there also orders two leaders' batches, so a stale leader's
transaction commits nothing once the new leader's first batch has. The output creates
`dblog_fence` (and `dblog_schemas`, and `dblog_positions` in monotonic mode) if missing, so its
user needs CREATE on the schema.

A connection lost anywhere in a batch (while connecting, inside the transaction or its pipeline,
a fast shutdown's AdminShutdown) is `OutputUnavailable`; the transaction did not commit. The next
write connects again and reads the target tables' columns again. A transaction rolled back by a
deadlock or a serialization failure (the tailer's batches and a direct dump's parts lock keys in
different orders) is tried again at once (`retry_on_conflict`), not left to the caller's backoff,
which would stall the tailer.
"""

from __future__ import annotations

import contextlib
import itertools
import random
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import psycopg
from psycopg import sql

from airflow_provider_dblog.core.event import Event, Op, TableRef
from airflow_provider_dblog.libpq_tls import tls_refusal
from airflow_provider_dblog.outputs.base import (
    Output,
    OutputError,
    OutputFenced,
    OutputUnavailable,
    TargetTableMissing,
)
from airflow_provider_dblog.outputs.sql_apply import schema_change
from airflow_provider_dblog.outputs.sql_apply.statements import (
    Action,
    Statements,
    changed_key,
    create_positions,
)
from airflow_provider_dblog.outputs.sql_apply.target import TableMap, Target, describe

T = TypeVar("T")

FENCE_TABLE = "dblog_fence"
_CONFLICT_ATTEMPTS = 10
"""Tries of a transaction (the tailer's batch, a direct part) that deadlocks with another on
the same keys: the tailer's batches and a direct dump's parts lock keys in different orders."""

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


def retry_on_conflict(attempt: Callable[[], T]) -> T:
    """`attempt()`, run again after a short random pause while a deadlock or a serialization
    failure with another transaction rolls it back, up to `_CONFLICT_ATTEMPTS` tries."""
    tries = 1
    while True:
        try:
            return attempt()
        except OutputUnavailable as exc:
            if not _rolled_back_by_conflict(exc) or tries >= _CONFLICT_ATTEMPTS:
                raise
        time.sleep(random.uniform(0.01, 0.05) * tries)
        tries += 1


def _rolled_back_by_conflict(exc: OutputUnavailable) -> bool:
    """SQLSTATE class 40: a deadlock or a serialization failure; the transaction was rolled
    back and may be tried again as it was."""
    sqlstate = getattr(exc.__cause__, "sqlstate", None) or ""
    return bool(sqlstate.startswith("40"))


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


class TargetConnection:
    """One connection to a PostgreSQL target (`dsn`) and what it knows of the target: its
    tables as described, the statements built for them. Both are forgotten when the
    connection is new or a transaction rolled back: the target may have changed meanwhile.
    Used by one thread at a time."""

    def __init__(
        self,
        dsn: str,
        *,
        monotonic: bool,
        table_map: Mapping[str, str] | None,
        connect_timeout: int,
    ) -> None:
        self._dsn = dsn
        self._connect_timeout = connect_timeout
        self.tables = TableMap(table_map)
        self.statements = Statements(monotonic=monotonic)
        self._targets: dict[TableRef, Target] = {}
        self._conn: psycopg.Connection[Any] | None = None
        self._closed = False

    def connection(self) -> psycopg.Connection[Any]:
        """The open connection, or a new one if the last one broke (a batch is retried whole).
        A new connection reads the target tables again: the target may have changed while it
        was away."""
        if self._closed:
            raise OutputError("sql_apply output is closed")
        if self._conn is None or self._conn.closed or self._conn.broken:
            self.forget()
            try:
                self._conn = psycopg.connect(
                    self._dsn, autocommit=True, connect_timeout=self._connect_timeout
                )
            except psycopg.OperationalError as exc:
                refused = tls_refusal(str(exc))
                if refused is not None:
                    raise OutputError(
                        f"cannot connect to the SQL target over TLS: {refused} (check sslmode, "
                        f"sslrootcert and the host in its DSN): {exc}"
                    ) from None
                raise OutputUnavailable(f"cannot connect to the SQL target: {exc}") from exc
            # Many writers may connect at once (the tailer, a direct dump's Spark tasks):
            # concurrent CREATE TABLE IF NOT EXISTS of one table can fail on PostgreSQL's
            # catalog (a unique violation), so the bookkeeping tables are made one at a time.
            with self._errors(), self._conn.transaction():
                self._conn.execute(_SETUP_LOCK)
                self._conn.execute(_CREATE_FENCE)
                self._conn.execute(schema_change.CREATE_SCHEMAS)
                if self.statements.monotonic:
                    create_positions(self._conn)
        return self._conn

    @contextlib.contextmanager
    def transaction(self) -> Iterator[psycopg.Connection[Any]]:
        """A transaction on the connection, its errors as the output's; one that did not
        commit forgets the tables described in it (they may show its DDL)."""
        conn = self.connection()
        try:
            with self._errors(), conn.transaction():
                yield conn
        except BaseException:
            self.forget()
            raise

    def forget(self) -> None:
        self._targets.clear()
        self.statements.clear()

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
                # SQLSTATE class 40: a deadlock or a serialization failure, not an outage.
                conflict = (exc.sqlstate or "").startswith("40")
                what = "rolled back a conflicting transaction" if conflict else "went away"
                raise OutputUnavailable(f"the SQL target {what}: {exc}") from exc
            raise OutputError(f"the SQL target refused a batch: {exc}") from exc

    def describe(self, conn: psycopg.Connection[Any], source: TableRef) -> Target:
        """`source`'s target table as the catalog describes it now, kept for its events."""
        target = self._targets[source] = describe(conn, source, self.tables.target_of(source))
        return target

    def table_level(self, conn: psycopg.Connection[Any], event: Event) -> None:
        """Apply a `t` or an `s` event; its table is described again at its next row."""
        target = describe(conn, event.table, self.tables.target_of(event.table))
        self._targets.pop(event.table, None)
        self.statements.clear()
        if event.op is Op.TRUNCATE:
            self.statements.truncate(conn, event, target)
        else:
            schema_change.alter(conn, event, target)

    def apply_pipelined(self, conn: psycopg.Connection[Any], events: Sequence[Event]) -> None:
        """Apply row events in one pipeline, one `executemany` per run of one shape."""
        actions = list(self._actions(conn, events))
        with conn.pipeline(), conn.cursor() as cur:
            start = 0
            while start < len(actions):
                end = start + 1
                while end < len(actions) and actions[end].shape() == actions[start].shape():
                    end += 1
                group = actions[start:end]
                statement = self.statements.of(group[0])
                cur.executemany(statement, [self.statements.params(a) for a in group])
                start = end

    def apply_counted(self, conn: psycopg.Connection[Any], events: Sequence[Event]) -> int:
        """Apply row events without a pipeline, so each statement's row count is known; the
        rows written (an event its key's newer position refused counts none)."""
        applied = 0
        actions = list(self._actions(conn, events))
        with conn.cursor() as cur:
            for _, group in itertools.groupby(actions, key=Action.shape):
                batch = list(group)
                cur.executemany(
                    self.statements.of(batch[0]), [self.statements.params(a) for a in batch]
                )
                applied += max(cur.rowcount, 0)
        return applied

    def _actions(self, conn: psycopg.Connection[Any], events: Sequence[Event]) -> Iterator[Action]:
        for event in events:
            target, dropped = self._target(conn, event)
            if event.op is Op.DELETE:
                yield Action(event, target, event.key, None)
                continue
            if event.after is None:
                raise OutputError(f"{event.op.value} event of {event.table} has no 'after' row")
            old_key = changed_key(event, target)
            if old_key is not None:
                yield Action(event, target, old_key, None)
            values = {**event.after, **event.key}
            if dropped:
                values = {c: v for c, v in values.items() if c not in dropped}
            yield Action(event, target, event.key, values)

    def _target(self, conn: psycopg.Connection[Any], event: Event) -> tuple[Target, frozenset[str]]:
        """The event's target table, and the columns of the event to leave out
        (`schema_change.dropped`)."""
        columns = list(event.key) + list(event.after or ())
        target = self._targets.get(event.table)
        dropped: frozenset[str] = frozenset()
        if target is None or any(c not in target.columns for c in columns):
            # New table, or the target may have been altered since it was read.
            target = self.describe(conn, event.table)
            self.statements.clear()
            dropped = schema_change.dropped(conn, event, target, columns)
        target.check(event.table, event.key, [c for c in columns if c not in dropped])
        return target, dropped

    def close(self) -> None:
        self._closed = True
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class SqlApplyOutput(Output):
    """Applies the change stream to tables in a PostgreSQL target over one connection (`dsn`):
    upserts c/u/r, deletes d, by key; truncates at `t`, alters the table at `s`.

    `table_map` maps a source table ("schema.table") to its target table ("schema.table", or a
    bare name in the source's schema); unmapped tables go to the same schema and name.
    `monotonic` turns on the per-key position check (`statements.py`).
    """

    def __init__(
        self,
        dsn: str,
        *,
        monotonic: bool = False,
        table_map: Mapping[str, str] | None = None,
        connect_timeout: int = 10,
    ) -> None:
        self._target = TargetConnection(
            dsn, monotonic=monotonic, table_map=table_map, connect_timeout=connect_timeout
        )
        self._target.connection()

    @property
    def monotonic(self) -> bool:
        return self._target.statements.monotonic

    def target_of(self, source: TableRef) -> TableRef:
        return self._target.tables.target_of(source)

    def write(self, events: Sequence[Event], token: int) -> None:
        """Apply one batch in one transaction; a batch rolled back by a deadlock with a direct
        dump's part on the same keys is tried again at once."""
        if not events:
            return
        retry_on_conflict(lambda: self._write_once(events, token))

    def fence(self, source: str) -> int | None:
        with self._target.transaction() as conn:
            row = conn.execute(_FENCE, (source,)).fetchone()
        return None if row is None else int(row[0])

    def _write_once(self, events: Sequence[Event], token: int) -> None:
        with self._target.transaction() as conn:
            for source in sorted({e.source.name for e in events}):
                self._raise_fence(conn, source, token)
            for run in _runs(events):
                if isinstance(run, Event):
                    self._target.table_level(conn, run)
                else:
                    self._target.apply_pipelined(conn, run)

    @staticmethod
    def _raise_fence(conn: psycopg.Connection[Any], source: str, token: int) -> None:
        """Inside the batch's transaction: record `token` as `source`'s fence, or refuse."""
        if conn.execute(_RAISE_FENCE, (source, token)).fetchone() is None:
            row = conn.execute(_FENCE, (source,)).fetchone()
            assert row is not None  # the refusing row is locked by this transaction
            raise OutputFenced(f"SQL target (source {source})", token, int(row[0]))

    def close(self) -> None:
        self._target.close()
