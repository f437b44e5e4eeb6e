"""The dump's queries on PostgreSQL: keyset chunks, split keys and the watermark write.

The keyset queries are `sources/keyset.py`'s, spelled for PostgreSQL by `keyset.py` (key values
travel as text cast to the column's type). Rows are read as the text the server prints and
converted like the log's values, column by column by psycopg's loaders (`loaders.py`), or handed
as text columns to a target that takes columns (`text_chunks.py`).

A server that goes away (a restart, a failover, a session ended: `errors.session_lost`)
surfaces as `SourceUnavailable` from whichever call met it, and the next call connects again: the
dump retries the chunk with new watermarks.
"""

from __future__ import annotations

import base64
import re
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql
from psycopg.rows import TupleRow

from airflow_provider_dblog.core.dump_plan import Chunk
from airflow_provider_dblog.core.errors import InvalidRequest
from airflow_provider_dblog.core.event import JsonValue, Key, TableRef, freeze
from airflow_provider_dblog.sources.base import (
    ChunkRead,
    ChunkSumRead,
    InvalidKey,
    NotSetUp,
    ReadSnapshot,
    ReplicaBehind,
    SourceError,
    SourceUnavailable,
    WatermarkRefused,
)
from airflow_provider_dblog.sources.filter_text import POSTGRES, scan_filter
from airflow_provider_dblog.sources.keyset import TableShape, split_keys
from airflow_provider_dblog.sources.postgres.catalog import ColumnInfo, table_shape
from airflow_provider_dblog.sources.postgres.config import PostgresSourceConfig
from airflow_provider_dblog.sources.postgres.converters import BYTEA, convert, to_text
from airflow_provider_dblog.sources.postgres.errors import session_lost
from airflow_provider_dblog.sources.postgres.keyset import KEYSET
from airflow_provider_dblog.sources.postgres.loaders import load_rows
from airflow_provider_dblog.sources.postgres.lsn import parse_pg_lsn
from airflow_provider_dblog.sources.postgres.row_sums import sum_chunk

if TYPE_CHECKING:
    from airflow_provider_dblog.sources.text_chunks import ChunkText

_Shape = TableShape[ColumnInfo]

# Every transaction the snapshot does not see, running or not: a commit waiting for a synchronous
# standby is in the log but still "in progress" to pg_xact_status (which checks the ProcArray
# first), so filtering on 'committed' would miss exactly the stale case. The reconciler fails a
# window only for the ones it met in the log before lw, so the others cost nothing.
_INVISIBLE = "SELECT x::text FROM pg_snapshot_xip(%s::pg_snapshot) AS x"
_RUNNING = (
    "SELECT transactionid::text FROM pg_locks WHERE locktype = 'transactionid' "
    "AND mode = 'ExclusiveLock' AND (%s::text[] IS NULL OR transactionid::text = ANY(%s))"
)
"""The transactions not yet ended (or those of them named): each holds the lock on its own id
until it has left the ProcArray, so once the lock is gone new snapshots see it. Unlike a
snapshot's xip list, this names those above its xmax too (begun after the last one ended)."""
COMMITS_WAIT_S = 1.0
"""How long a chunk read waits for the transactions running when it starts to end (a commit
already in the log is out of the ProcArray in milliseconds, unless it waits for a synchronous
standby); one still running after it is taken for a long one, not waited for again."""
_COMMITS_POLL_S = 0.005
_SNAPSHOT = "SELECT pg_current_snapshot()::text, pg_current_wal_insert_lsn()::text"
_REPLICA_SNAPSHOT = "SELECT pg_current_snapshot()::text, pg_last_wal_replay_lsn()::text"
"""On a standby: every transaction the snapshot sees was replayed, its commit record below the
replay position read after it."""
_REPLAYED = "SELECT pg_last_wal_replay_lsn()::text, pg_is_wal_replay_paused()"
_REPLICA_POLL_S = 0.02
_SLOT = "SELECT 1 FROM pg_replication_slots WHERE slot_name = %s"

_XID_MASK = 0xFFFF_FFFF

_FILTER_VIEW = "'pg_temp.dblog_filter'::regclass"
_FILTER_TREE = f"SELECT ev_action::text FROM pg_rewrite WHERE ev_class = {_FILTER_VIEW}"
_FILTER_NODES = re.compile(r":(relid|funcid|opfuncid) (\d+)")
"""The tables (`relid`), functions and operators' functions a view's stored query tree calls.
Its dependencies in `pg_depend` would not do: they leave out built-in objects (pinned)."""
_VOLATILE = (
    "SELECT oid::regprocedure::text FROM pg_proc WHERE oid = ANY(%s::oid[]) AND provolatile = 'v'"
)
_OTHER_TABLES = (
    "SELECT oid::regclass::text FROM pg_class WHERE oid = ANY(%s::oid[]) "
    f"AND oid <> %s::regclass AND oid <> {_FILTER_VIEW}"
)
"""The view's tree names the view itself too (its OLD and NEW entries)."""

_Conn = psycopg.Connection[TupleRow]


class PostgresChunkSource:
    """`ChunkSource` on one autocommit connection, opened on first use, and one to the
    `read_replica` if there is one, which reads the chunks."""

    def __init__(self, config: PostgresSourceConfig, *, read_only: bool = False) -> None:
        self._config = config
        self._read_only = read_only or config.read_only
        self._conn: psycopg.Connection[TupleRow] | None = None
        self._replica: psycopg.Connection[TupleRow] | None = None
        self._shapes: dict[TableRef, _Shape] = {}
        self._long_running: frozenset[str] = frozenset()
        self.commits_wait_s = COMMITS_WAIT_S

    def key_columns(self, table: TableRef) -> tuple[str, ...]:
        return self._shape(table).key_columns

    def check_keys(self, table: TableRef, keys: Sequence[Key]) -> tuple[Key, ...]:
        """Cast each column's values in one query, read back as the server prints them (its
        output function, as pgoutput sends values); only when PostgreSQL refuses one (a data
        exception, SQLSTATE class 22) cast them one by one to name it."""
        shape = self._shape(table)
        columns: list[list[JsonValue]] = [[] for _ in shape.key]
        for key in keys:
            if len(key) != len(shape.key):
                raise InvalidKey(
                    f"key {list(key)!r} of {table} has {len(key)} value(s), its primary key "
                    f"({', '.join(shape.key_columns)}) {len(shape.key)}"
                )
            for values, value in zip(columns, key, strict=True):
                values.append(value)
        if not keys:
            return ()
        normalised = [
            self._cast(table, column, values)
            for column, values in zip(shape.key, columns, strict=True)
        ]
        return tuple(dict.fromkeys(zip(*normalised, strict=True)))

    def check_filter(self, table: TableRef, where: str) -> str:
        """The filter is planned as a temporary view of `table` (`WHERE (<filter>)`, rolled
        back), whose query tree the server stores: the tables and functions it names are read
        from it. A volatile function (`random()`, `nextval()`, `pg_sleep()`) is refused, as is
        any table but `table`; stable ones such as `now()` are fine. Needs the TEMPORARY
        privilege on the database, which PUBLIC has unless revoked."""
        scan_filter(where, POSTGRES)
        where = where.strip()
        view = sql.SQL("CREATE TEMPORARY VIEW dblog_filter AS SELECT * FROM {} WHERE ({})")
        name = KEYSET.table(table)
        self._shape(table)  # UnknownTable, NoPrimaryKey
        with self._session() as conn:
            try:
                with conn.transaction(force_rollback=True):
                    conn.execute(view.format(name, sql.SQL(where)))
                    (tree,) = conn.execute(_FILTER_TREE).fetchone() or ("",)
                    named: dict[str, list[int]] = {"relid": [], "funcid": [], "opfuncid": []}
                    for kind, oid in _FILTER_NODES.findall(tree):
                        named[kind].append(int(oid))
                    functions = named["funcid"] + named["opfuncid"]
                    volatile = [f for (f,) in conn.execute(_VOLATILE, (functions,))]
                    others = conn.execute(_OTHER_TABLES, (named["relid"], name.as_string(conn)))
                    tables = [t for (t,) in others]
            except psycopg.errors.InsufficientPrivilege as exc:
                raise SourceError(
                    f"checking a filter on {table} needs the TEMPORARY privilege on the "
                    f"database of source {self._config.name}: {exc}"
                ) from None
            except psycopg.Error as exc:
                if session_lost(exc, conn):
                    raise
                raise InvalidRequest(f"the filter on {table} is not valid: {exc}") from None
        if tables:
            raise InvalidRequest(
                f"the filter on {table} reads table {', '.join(tables)}: a filter is a "
                f"condition on {table}'s own columns"
            )
        if volatile:
            raise InvalidRequest(
                f"the filter on {table} calls {', '.join(volatile)}, which is volatile (it has "
                "side effects or its value changes within a query): a filter may call only "
                "immutable or stable functions"
            )
        return where

    @property
    def read_only(self) -> bool:
        return self._read_only

    def check_ready(self) -> None:
        if self._read_only:
            with self._session() as conn:
                slot = conn.execute(_SLOT, (self._config.slot,)).fetchone()
            if slot is None:
                raise NotSetUp(
                    f"source {self._config.name} is not set up for dumps: its slot "
                    f"{self._config.slot} does not exist. Start the tailer first (dblog tail "
                    "creates it), then dump"
                )
            return
        query = sql.SQL("SELECT count(*) FROM {}").format(KEYSET.table(self._config.watermark))
        with self._session() as conn:
            try:
                row = conn.execute(query).fetchone()
            except psycopg.errors.UndefinedTable:
                row = None
            except psycopg.errors.InsufficientPrivilege as exc:
                raise SourceError(
                    f"the role of source {self._config.name} cannot read the watermark table "
                    f"{self._config.watermark}: grant it SELECT and UPDATE ({exc})"
                ) from None
        if row is None:
            raise NotSetUp(
                f"source {self._config.name} is not set up for dumps: its watermark table "
                f"{self._config.watermark} does not exist. Start the tailer first (dblog tail "
                "creates the watermark table, the publication and the slot), then dump"
            )
        if row[0] != 1:
            raise NotSetUp(
                f"the watermark table {self._config.watermark} holds {row[0]} rows, not one: "
                "restart dblog tail, which puts its row back"
            )

    def _cast(self, table: TableRef, column: ColumnInfo, values: list[JsonValue]) -> list[Any]:
        """`values` cast by PostgreSQL to `column`'s type and converted as the log converts
        them; `InvalidKey` naming the first one refused."""
        texts = [_key_text(table, column, v) for v in values]
        query = sql.SQL(
            "SELECT CAST(v AS {}) FROM unnest(CAST(%s AS text[])) WITH ORDINALITY AS u(v, n) "
            "ORDER BY n"
        ).format(sql.SQL(column.sql_type))
        single = sql.SQL("SELECT CAST(CAST(%s AS text) AS {})").format(sql.SQL(column.sql_type))
        with self._session() as conn:
            try:
                raw = _raw_rows(conn.execute(query, (texts,)))
            except psycopg.DataError:
                for value, text in zip(values, texts, strict=True):
                    try:
                        conn.execute(single, (text,))
                    except psycopg.DataError as exc:
                        raise InvalidKey(_refused(table, column, value, exc)) from None
                raise
        return [freeze(convert(column.type_oid, text)) for (text,) in raw]

    def max_key(self, table: TableRef) -> Key | None:
        shape = self._shape(table)
        with self._session() as conn:
            rows = _raw_rows(conn.execute(KEYSET.max_key(shape)))
        return _key(shape.key, rows[0]) if rows else None

    def split_keys(
        self, table: TableRef, after: Key | None, upto: Key, chunk_size: int, count: int
    ) -> list[Key]:
        """On the read replica if there is one, the primary confirming the range's end
        (`keyset.split_keys`)."""
        shape = self._shape(table)

        def probe_on(replica: bool) -> Callable[[sql.Composed, list[Any]], Key | None]:
            def probe(query: sql.Composed, params: list[Any]) -> Key | None:
                with self._session(replica=replica) as conn:
                    rows = _raw_rows(conn.execute(query, params))
                return _key(shape.key, rows[0]) if rows else None

            return probe

        replica = probe_on(True) if self._config.read_replica is not None else None
        return split_keys(KEYSET, shape, after, upto, chunk_size, count, probe_on(False), replica)

    def read_chunk(self, chunk: Chunk) -> ChunkRead:
        """Read the chunk in a REPEATABLE READ transaction and name the transactions its
        snapshot did not see (its xip list).

        The table is locked (ACCESS SHARE, as the read itself would) before its columns are
        read, and the snapshot is taken after both: no ALTER can come between the columns and
        the rows, so each chunk is read whole with the table's columns of that moment, and a
        chunk read again after an ALTER reads the new ones."""

        def rows(conn: _Conn, query: sql.Composed, params: Any, shape: _Shape) -> Any:
            return load_rows(conn.execute(query, params).pgresult, shape.columns)

        _, read, invisible, snapshot = self._read(chunk, rows)
        return ChunkRead(read, invisible, snapshot)

    def sum_chunk(self, chunk: Chunk) -> ChunkSumRead:
        """`read_chunk`'s read, its rows summed by the server (`row_sums.py`)."""

        def summed(conn: _Conn, query: sql.Composed, params: Any, shape: _Shape) -> Any:
            return sum_chunk(conn, shape, chunk)

        _, read, invisible, snapshot = self._read(chunk, summed)
        return ChunkSumRead(read, invisible, snapshot)

    def read_chunk_text(self, chunk: Chunk) -> ChunkText:
        """`read_chunk`, the rows as text columns in Arrow (`text_chunks.py`): for a target
        that takes columns."""
        from airflow_provider_dblog.sources.postgres.text_chunks import text_columns
        from airflow_provider_dblog.sources.text_chunks import ChunkText, last_key

        def columns(conn: _Conn, query: sql.Composed, params: Any, shape: _Shape) -> Any:
            return text_columns(conn.execute(query, params).pgresult, shape.columns)

        shape, read, invisible, snapshot = self._read(chunk, columns)
        rows = len(read[0].text) if read else 0
        return ChunkText(read, rows, last_key(read, shape.key_columns), invisible, snapshot)

    def _read(
        self,
        chunk: Chunk,
        fetch: Callable[[_Conn, sql.Composed, Any, _Shape], Any],
    ) -> tuple[_Shape, Any, frozenset[int], ReadSnapshot]:
        """The chunk's query run by `fetch` in the read's transaction (see `read_chunk`), and
        where its snapshot lies: every transaction it sees wrote its commit record before the
        snapshot was taken, so below the WAL insert position read after it."""
        replica = self._config.read_replica is not None
        running: frozenset[int] = frozenset()
        if replica:
            self._replica_caught_up()
        else:
            running = self._commits_ended()
        with self._session(replica=replica) as conn, conn.transaction():
            lock = sql.SQL("LOCK TABLE {} IN ACCESS SHARE MODE")
            conn.execute(lock.format(KEYSET.table(chunk.table)))
            shape = self._shapes[chunk.table] = table_shape(conn, chunk.table)
            query, params = KEYSET.chunk(shape, chunk, KEYSET.names(shape.columns))
            snapshot_row = conn.execute(_REPLICA_SNAPSHOT if replica else _SNAPSHOT).fetchone()
            assert snapshot_row is not None
            read = fetch(conn, query, params, shape)
            invisible = conn.execute(_INVISIBLE, (snapshot_row[0],)).fetchall()
        snapshot = ReadSnapshot(parse_pg_lsn(snapshot_row[1]), exact=False)
        unseen = {int(x) & _XID_MASK for (x,) in invisible}
        return shape, read, frozenset(unseen | _above_xmax(running, snapshot_row[0])), snapshot

    def _commits_ended(self) -> frozenset[int]:
        """Wait until the transactions running now have ended, for up to `commits_wait_s`,
        but for the long ones (still running at the end of the wait before); the ones running
        now.

        PostgreSQL writes a commit record before the transaction leaves the ProcArray, and
        only then do new snapshots see it: lw, committed, can be visible while a transaction
        whose commit the log holds before lw is not yet (its backend still flushing the WAL,
        waiting for a synchronous standby, or not scheduled on a busy machine). A read then
        would be stale, and its window fail (`invisible_txids`), again and again while
        commits keep coming. After the wait the read's snapshot sees each of them. A standby
        makes commits visible as it replays them, in the log's order: no wait there."""
        with self._session() as conn:
            running = {x for (x,) in conn.execute(_RUNNING, (None, None)).fetchall()}
            waiting = sorted(running - self._long_running)
            deadline = time.monotonic() + self.commits_wait_s
            while waiting and time.monotonic() < deadline:
                time.sleep(_COMMITS_POLL_S)
                waiting = [x for (x,) in conn.execute(_RUNNING, (waiting, waiting)).fetchall()]
        self._long_running = frozenset(running & self._long_running | set(waiting))
        return frozenset(int(x) for x in running)

    def write_watermark(self, value: str) -> None:
        if self._read_only:
            raise SourceError(f"a read-only dump of source {self._config.name} writes no watermark")
        query = sql.SQL("UPDATE {} SET value = %s").format(KEYSET.table(self._config.watermark))
        with self._session() as conn:
            try:
                rowcount = conn.execute(query, (value,)).rowcount
            except psycopg.errors.InsufficientPrivilege as exc:
                reason = str(exc).strip()
                raise WatermarkRefused(self._config.name, self._config.watermark, reason) from None
        if rowcount != 1:
            raise SourceError(
                f"the watermark table {self._config.watermark} has {rowcount} rows, "
                "not one: run ensure_setup"
            )

    def close(self) -> None:
        for conn in (self._conn, self._replica):
            if conn is not None:
                conn.close()
        self._conn = self._replica = None

    @contextmanager
    def _session(self, *, replica: bool = False) -> Iterator[psycopg.Connection[TupleRow]]:
        """The connection to the source, or to its `read_replica` (opened if there is none:
        `SourceUnavailable` if it cannot be); a server lost while it is used raises
        `SourceUnavailable` and drops both, so the next call connects again."""
        replica = replica and self._config.read_replica is not None
        conn = self._replica if replica else self._conn
        if conn is None or conn.closed:
            conn = self._config.connect(replica=replica)
            conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            if replica:
                self._replica = conn
            else:
                self._conn = conn
        try:
            yield conn
        except psycopg.Error as exc:
            if not session_lost(exc, conn):
                raise
            self.close()
            which = "read replica of the PostgreSQL source" if replica else "PostgreSQL source"
            raise SourceUnavailable(f"lost the {which} {self._config.name}: {exc}") from exc

    def _replica_caught_up(self) -> None:
        """Wait until the read replica has replayed the WAL the primary has flushed now: every
        commit the tailer had read when it armed the window, or the written lw. Raises
        `ReplicaBehind`, naming the lag, after `replica_wait_s`."""
        with self._session() as conn:
            row = conn.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()
        assert row is not None
        wanted = parse_pg_lsn(row[0])
        deadline = time.monotonic() + self._config.replica_wait_s
        with self._session(replica=True) as replica:
            while True:
                found = replica.execute(_REPLAYED).fetchone()
                assert found is not None
                replayed = parse_pg_lsn(found[0]) if found[0] else 0
                if replayed >= wanted:
                    return
                if time.monotonic() >= deadline:
                    paused = " (its replay is paused)" if found[1] else ""
                    raise ReplicaBehind(
                        f"the read replica of {self._config.name} has replayed the WAL up to "
                        f"{found[0]}, {wanted - replayed} bytes short of {row[0]}, which a "
                        f"chunk needs, after {self._config.replica_wait_s}s{paused}"
                    )
                time.sleep(_REPLICA_POLL_S)

    def _shape(self, table: TableRef) -> _Shape:
        shape = self._shapes.get(table)
        if shape is None:
            with self._session() as conn:
                shape = self._shapes[table] = table_shape(conn, table)
        return shape


def _above_xmax(running: frozenset[int], snapshot: str) -> set[int]:
    """The transactions of `running` at or above the snapshot's xmax (`xmin:xmax:xip`), which
    it does not see although its xip list omits them. xmax is one past the latest transaction
    to end, so one that began later and committed in the log before lw, still on its way out
    of the ProcArray, is among them; it was running when the read began (lw had committed), so
    `running` holds it. Compared as the log names them, 32 bits, modulo 2^32."""
    xmax = int(snapshot.split(":")[1]) & _XID_MASK
    return {x for x in running if (x - xmax) & _XID_MASK < 1 << 31}


def _key_text(table: TableRef, column: ColumnInfo, value: JsonValue) -> str:
    """The text PostgreSQL casts: text as given (the type's input function judges it), other
    JSON values as `to_text` spells them; bytea as base64 (its form in events) or `\\x` hex."""
    try:
        if column.type_oid == BYTEA and isinstance(value, str) and not value.startswith("\\x"):
            return "\\x" + base64.b64decode(value, validate=True).hex()
        if isinstance(value, str):
            return value
        return to_text(column.type_oid, value)
    except (ValueError, TypeError) as exc:
        raise InvalidKey(_refused(table, column, value, exc)) from None


def _refused(table: TableRef, column: ColumnInfo, value: JsonValue, reason: Exception) -> str:
    first = str(reason).strip().splitlines()[0] if str(reason).strip() else type(reason).__name__
    return (
        f"key value {value!r} is not a valid {column.sql_type} for column {column.name} "
        f"of {table}: {first}"
    )


def _raw_rows(cursor: psycopg.Cursor[TupleRow]) -> list[list[str | None]]:
    """The result as the text the server printed, bypassing psycopg's type loaders."""
    result = cursor.pgresult
    if result is None:
        return []
    rows = []
    for r in range(result.ntuples):
        values = (result.get_value(r, c) for c in range(result.nfields))
        rows.append([None if v is None else bytes(v).decode("utf-8") for v in values])
    return rows


def _key(columns: Sequence[ColumnInfo], raw: Sequence[str | None]) -> Key:
    return tuple(freeze(convert(c.type_oid, text)) for c, text in zip(columns, raw, strict=True))
