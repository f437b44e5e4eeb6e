"""The dump's queries on MySQL/MariaDB: keyset chunks, split keys and the watermark write.

The keyset queries are `sources/keyset.py`'s, spelled for MySQL by `keyset.py`: keys are
compared by the server, as row values in the key columns' own collations (a case- and
accent-insensitive varchar key finds 'A' where 'a' was asked). A chunk's rows are read as the
server's text and converted a column at a time (`text_values.py`), or handed as text columns
to a target that takes columns (`text_chunks.py`).

Why a chunk read needs no `invisible_txids` (unlike PostgreSQL's): the read runs in a
consistent snapshot started after lw's commit returned, and a transaction written to the binlog
before lw is committed in the engine by then, because commits are ordered: the server commits
a binlog group in the engine in binlog order (MariaDB always; MySQL 8 when
binlog_order_commits = ON, which `setup.preflight` checks) and returns lw's commit only after
its own engine commit. So the snapshot sees every transaction the log shows before lw.

A schema change while a dump runs is never mixed into a chunk: the read selects `t.*` and
compares the columns it returned, and the primary key while its metadata lock is held, with the
shape it converts with; on a difference it reads the shape again and reads the chunk again, and
a changed primary key stops with `SourceError` naming the table to dump again.

A server that goes away surfaces as `SourceUnavailable` from whichever call met it, and the next
call connects again: the dump retries the chunk with new watermarks.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import pymysql
from pymysql.cursors import Cursor

from airflow_provider_dblog.core.dump_plan import Chunk
from airflow_provider_dblog.core.errors import InvalidRequest
from airflow_provider_dblog.core.event import JsonValue, Key, TableRef, freeze
from airflow_provider_dblog.sources.base import (
    ChunkRead,
    InvalidKey,
    NotSetUp,
    ReadSnapshot,
    ReplicaBehind,
    SourceError,
    SourceUnavailable,
    WatermarkRefused,
)
from airflow_provider_dblog.sources.filter_text import MYSQL, scan_filter
from airflow_provider_dblog.sources.keyset import TableShape, split_keys
from airflow_provider_dblog.sources.mysql.catalog import ColumnInfo, row_key, table_shape
from airflow_provider_dblog.sources.mysql.config import MysqlSourceConfig
from airflow_provider_dblog.sources.mysql.converters import (
    converter,
    quote_name,
    read_expression,
    to_param,
)
from airflow_provider_dblog.sources.mysql.coordinates import binlog_file_number, mysql_commit
from airflow_provider_dblog.sources.mysql.errors import LOST_SERVER_CODES, cause, session_lost
from airflow_provider_dblog.sources.mysql.keyset import KEYSET
from airflow_provider_dblog.sources.mysql.text_values import (
    TextReader,
    load_rows,
    text_reader,
    undecoded,
)

if TYPE_CHECKING:
    from airflow_provider_dblog.sources.text_chunks import ChunkText

_Shape = TableShape[ColumnInfo]
_Text = tuple[_Shape, tuple[tuple[Any, ...], ...], tuple[TextReader, ...], ReadSnapshot | None]
"""A chunk read: the shape it was read with, its undecoded rows, how to read each column, and
where its snapshot lies in the binlog (MariaDB; None on MySQL, which does not say)."""

_SNAPSHOT_STATUS = (
    "SHOW STATUS WHERE Variable_name IN ('binlog_snapshot_file', 'binlog_snapshot_position')"
)

_UNKNOWN_COLUMN = 1054
_TABLE_ACCESS_DENIED = 1142
_STRICT = "STRICT_ALL_TABLES,NO_ZERO_DATE,NO_ZERO_IN_DATE"
"""The sql_mode `check_keys` judges values in: refuse what would be truncated or zeroed."""
_SCHEMA_RETRIES = 3

SIDE_EFFECTS = frozenset(
    (
        "benchmark", "get_lock", "is_free_lock", "is_used_lock", "last_insert_id", "lastval",
        "load_file", "master_gtid_wait", "master_pos_wait", "nextval", "rand", "release_all_locks",
        "release_lock", "setval", "sleep", "source_pos_wait", "sys_guid", "uuid", "uuid_short",
        "wait_for_executed_gtid_set", "wait_until_sql_thread_after_gtids",
    )
)  # fmt: skip
"""Built-in functions a filter may not call: they block, draw random values or change state."""


def snapshot_position(status: dict[str, Any]) -> ReadSnapshot | None:
    """MariaDB's binlog position of the snapshot: the read sees exactly the transactions
    before it. A transaction's commit position is its first event's offset, 19 bytes or more
    below the end of its last event, so every transaction seen commits below the position less
    one, and every one below that was seen: a reader idle at the log's end says it has read
    every commit up to the end less one (`Idle`), which is then past hw."""
    file, offset = status.get("binlog_snapshot_file"), status.get("binlog_snapshot_position")
    if not file or offset in (None, ""):
        return None
    end = mysql_commit(binlog_file_number(str(file)), int(offset))
    return ReadSnapshot(end - 1, exact=True)


class MysqlChunkSource:
    """`ChunkSource` on one autocommit PyMySQL connection, opened on first use, and one to the
    `read_replica` if there is one, which reads the chunks."""

    def __init__(self, config: MysqlSourceConfig, *, read_only: bool = False) -> None:
        self._config = config
        self._read_only = read_only or config.read_only
        self._conn: pymysql.connections.Connection[Any] | None = None
        self._replica: pymysql.connections.Connection[Any] | None = None
        self._shapes: dict[TableRef, _Shape] = {}

    def key_columns(self, table: TableRef) -> tuple[str, ...]:
        return self._shape(table).key_columns

    def max_key(self, table: TableRef) -> Key | None:
        shape = self._shape(table)
        with self._session() as cursor:
            cursor.execute(KEYSET.max_key(shape))
            row = cursor.fetchone()
        return None if row is None else _key(shape.key, row)

    def split_keys(
        self, table: TableRef, after: Key | None, upto: Key, chunk_size: int, count: int
    ) -> list[Key]:
        """On the read replica if there is one, the primary confirming the range's end
        (`keyset.split_keys`)."""
        shape = self._shape(table)

        def probe_on(replica: bool) -> Callable[[str, list[Any]], Key | None]:
            def probe(query: str, params: list[Any]) -> Key | None:
                with self._session(replica=replica) as cursor:
                    cursor.execute(query, params)
                    row = cursor.fetchone()
                return None if row is None else _key(shape.key, row)

            return probe

        replica = probe_on(True) if self._config.read_replica is not None else None
        return split_keys(KEYSET, shape, after, upto, chunk_size, count, probe_on(False), replica)

    def read_chunk(self, chunk: Chunk) -> ChunkRead:
        """Read the chunk in a consistent snapshot (no invisible transactions: see the module
        docstring), with the table's current columns."""
        _, raw, readers, snapshot = self._read_text(chunk)
        return ChunkRead(load_rows(raw, readers), snapshot=snapshot)

    def read_chunk_text(self, chunk: Chunk) -> ChunkText:
        """`read_chunk`, the rows as text columns in Arrow (`text_chunks.py`): for a target
        that takes columns."""
        from airflow_provider_dblog.sources.mysql.text_chunks import text_columns
        from airflow_provider_dblog.sources.text_chunks import ChunkText, last_key

        shape, raw, readers, snapshot = self._read_text(chunk)
        columns = text_columns(raw, readers)
        return ChunkText(
            columns, len(raw), last_key(columns, shape.key_columns), frozenset(), snapshot
        )

    def _read_text(self, chunk: Chunk) -> _Text:
        """The chunk's undecoded rows, read with the table's current columns (read again with
        its new ones when they changed)."""
        for _ in range(_SCHEMA_RETRIES):
            shape = self._shape(chunk.table)
            read = self._read(shape, chunk)
            if read is not None:
                return read
            fresh = self._reshape(chunk.table)
            if fresh.key_columns != shape.key_columns:
                was, now = ", ".join(shape.key_columns), ", ".join(fresh.key_columns)
                raise SourceError(
                    f"the primary key of {chunk.table} changed from ({was}) to ({now}) during "
                    f"the dump: dump {chunk.table} again"
                )
        raise SourceError(
            f"the columns of {chunk.table} kept changing while a chunk was read: "
            f"dump {chunk.table} again once its schema change is done"
        )

    def write_watermark(self, value: str) -> None:
        """An UPDATE that sets the value the row holds logs nothing, so a repeated value is
        refused rather than silently lost (the dump writes a new UUID each time)."""
        if self._read_only:
            raise SourceError(f"a read-only dump of source {self._config.name} writes no watermark")
        table = KEYSET.table(self._config.watermark)
        with self._session() as cursor:
            try:
                changed = cursor.execute(f"UPDATE {table} SET value = %s WHERE id = 1", (value,))
            except pymysql.err.OperationalError as exc:
                if exc.args[0] != _TABLE_ACCESS_DENIED:
                    raise
                raise WatermarkRefused(self._config.name, table, exc.args[1]) from None
            if changed == 1:
                return
            cursor.execute(f"SELECT value FROM {table} WHERE id = 1")
            row = cursor.fetchone()
        if row is None:
            raise NotSetUp(
                f"the watermark table {self._config.watermark} has no row: run ensure_setup "
                "(dblog tail does)"
            )
        raise SourceError(
            f"the watermark table {self._config.watermark} already holds {value!r}: the binlog "
            "would not log it; every watermark value must be new"
        )

    @property
    def read_only(self) -> bool:
        return self._read_only

    def check_ready(self) -> None:
        if self._read_only:
            with self._session() as cursor:
                cursor.execute(_SNAPSHOT_STATUS)
                if not cursor.fetchall():
                    raise SourceError(
                        f"source {self._config.name} cannot be dumped read-only, which needs "
                        "MariaDB: MySQL does not give the binlog position of a snapshot; dump "
                        "it with written watermarks (no --read-only, [source] read_only = false)"
                    )
            return
        table = KEYSET.table(self._config.watermark)
        with self._session() as cursor:
            try:
                cursor.execute(f"SELECT count(*) FROM {table}")
                row = cursor.fetchone()
            except pymysql.err.ProgrammingError as exc:
                if exc.args[0] != 1146:  # no such table
                    raise
                row = None
            except pymysql.err.OperationalError as exc:
                if exc.args[0] not in (1142, 1044):  # command / database access denied
                    raise
                raise SourceError(
                    f"the user of source {self._config.name} cannot read the watermark table "
                    f"{self._config.watermark}: grant it SELECT and UPDATE ({exc.args[-1]})"
                ) from None
        if row is None:
            raise NotSetUp(
                f"source {self._config.name} is not set up for dumps: its watermark table "
                f"{self._config.watermark} does not exist. Start the tailer first (dblog tail "
                "creates the watermark table), then dump"
            )
        if row[0] != 1:
            raise NotSetUp(
                f"the watermark table {self._config.watermark} holds {row[0]} rows, not one: "
                "restart dblog tail, which puts its row back"
            )

    def check_keys(self, table: TableRef, keys: Sequence[Key]) -> tuple[Key, ...]:
        """Each value is assigned, in strict mode, to something of the key column's exact type
        (charset and collation included), read back, and must still equal what was given: the
        server's own input rules and comparison judge it and normalise it. No row of `table`
        is read. On MariaDB that is a variable of an anonymous block, which writes nothing and
        needs no grant (a read-only dump's role has none); MySQL has no such block, so there
        it is a temporary table, not logged in ROW format, which needs CREATE TEMPORARY TABLES
        on the watermark database (a MySQL dump is never read-only)."""
        shape = self._shape(table)
        for key in keys:
            if len(key) != len(shape.key):
                raise InvalidKey(
                    f"key {list(key)!r} of {table} has {len(key)} value(s), its primary key "
                    f"({', '.join(shape.key_columns)}) {len(shape.key)}"
                )
        if not keys:
            return ()
        normalised = [
            self._cast(table, column, [key[i] for key in keys])
            for i, column in enumerate(shape.key)
        ]
        return tuple(dict.fromkeys(zip(*normalised, strict=True)))

    def check_filter(self, table: TableRef, where: str) -> str:
        """The filter's text is scanned as the server reads it with and without backslash
        escapes (sql_mode NO_BACKSLASH_ESCAPES), and must pass both ways; then the chunk query
        is EXPLAINed, which names every table it reads. Functions that block, draw random
        values or change state (`SIDE_EFFECTS`), and stored functions, are refused: MySQL
        records no volatility to ask."""
        plain = dataclasses.replace(MYSQL, backslash_escapes=False)
        calls = scan_filter(where, MYSQL) | scan_filter(where, plain)
        where = where.strip()
        refused = sorted(calls & SIDE_EFFECTS)
        if refused:
            raise InvalidRequest(
                f"the filter on {table} calls {', '.join(refused)}, which blocks, draws random "
                "values or changes state: a filter may call only functions of the row's values"
            )
        shape = self._shape(table)  # UnknownTable, NoPrimaryKey
        query, params = KEYSET.chunk(shape, Chunk(table, 0, where=where), "*")
        with self._session() as cursor:
            cursor.execute(
                "SELECT LOWER(ROUTINE_NAME) FROM information_schema.ROUTINES "
                "WHERE ROUTINE_TYPE = 'FUNCTION'"
            )
            stored = sorted(calls & {name for (name,) in cursor.fetchall()})
            if stored:
                raise InvalidRequest(
                    f"the filter on {table} calls the stored function(s) {', '.join(stored)}: "
                    "a filter may call only built-in functions"
                )
            try:
                cursor.execute("EXPLAIN " + query, params)
            except (pymysql.err.ProgrammingError, pymysql.err.OperationalError) as exc:
                if session_lost(exc):
                    raise
                raise InvalidRequest(
                    f"the filter on {table} is not valid: {exc.args[-1] if exc.args else exc}"
                ) from None
            names = [d[0].lower() for d in cursor.description or ()]
            plan = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
        for step in plan:
            if step.get("table") not in (table.name, None) or step.get("select_type") != "SIMPLE":
                raise InvalidRequest(
                    f"the filter on {table} reads {step.get('table')} "
                    f"({step.get('select_type')}): a filter is a condition on {table}'s own "
                    "columns"
                )
        return where

    def close(self) -> None:
        for conn in (self._conn, self._replica):
            if conn is not None and conn.open:
                conn.close()
        self._conn = self._replica = None

    def _read(self, shape: _Shape, chunk: Chunk) -> _Text | None:
        """The chunk's undecoded rows (`text_values.py`), or None if the table's columns are
        no longer `shape`'s."""
        floats = [c for c in shape.columns if read_expression(c) != quote_name(c.name)]
        every = KEYSET.join([f"{KEYSET.table(chunk.table)}.*", *map(read_expression, floats)])
        query, params = KEYSET.chunk(shape, chunk, every)
        replica = self._config.read_replica is not None
        if replica:
            self._replica_caught_up()
        with self._session(replica=replica) as cursor:
            cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            cursor.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
            try:
                snapshot: ReadSnapshot | None
                if replica:
                    snapshot = self._primary_end()
                else:
                    cursor.execute(_SNAPSHOT_STATUS)
                    status = {str(k).lower(): v for k, v in cursor.fetchall()}
                    snapshot = snapshot_position(status)
                with undecoded(cursor.connection):
                    cursor.execute(query, params)
                raw: tuple[tuple[Any, ...], ...] = cursor.fetchall()
                description = cursor.description or ()
                # The SELECT holds the table's metadata lock until the transaction ends.
                key_columns = row_key(
                    cursor.connection, chunk.table, self._config.unique_keys.get(chunk.table)
                )
            except pymysql.err.OperationalError as exc:
                if exc.args[0] != _UNKNOWN_COLUMN:
                    raise
                return None
            finally:
                cursor.connection.rollback()
        names = [d[0] for d in description[: len(description) - len(floats)]]
        if names != [c.name for c in shape.columns] or key_columns != shape.key_columns:
            return None
        float_at = {c.name: len(names) + i for i, c in enumerate(floats)}
        positions = [float_at.get(c.name, i) for i, c in enumerate(shape.columns)]
        readers = tuple(
            text_reader(c, at, description[at][1])
            for c, at in zip(shape.columns, positions, strict=True)
        )
        return shape, raw, readers, snapshot

    def _cast(self, table: TableRef, column: ColumnInfo, values: list[JsonValue]) -> list[Any]:
        """`values` judged as values of `column`'s type (`check_keys`), read back as the dump
        reads them, converted as the log converts them; `InvalidKey` naming the first one the
        server refuses."""
        type_sql = column.column_type
        if column.charset is not None and column.collation is not None:
            type_sql += f" CHARACTER SET {column.charset} COLLATE {column.collation}"
        stored_as = read_expression(dataclasses.replace(column, name="v"))
        probe = KEYSET.table(TableRef(self._config.watermark_database, "dblog_key_check"))
        with self._session() as cursor:
            mariadb = "mariadb" in cursor.connection.get_server_info().lower()
            if not mariadb:
                cursor.execute(f"DROP TEMPORARY TABLE IF EXISTS {probe}")
                cursor.execute(f"CREATE TEMPORARY TABLE {probe} (n int PRIMARY KEY, v {type_sql})")
            cursor.execute("SET @dblog_sql_mode = @@SESSION.sql_mode")
            cursor.execute(f"SET SESSION sql_mode = '{_STRICT}'")
            try:
                stored = []
                for n, value in enumerate(values):
                    try:
                        param = _key_param(column, value)
                        if mariadb:
                            cursor.execute(
                                f"BEGIN NOT ATOMIC DECLARE v {type_sql}; SET v = %s; "
                                f"SELECT {stored_as}, v = %s; END",
                                (param, param),
                            )
                        else:
                            cursor.execute(f"INSERT INTO {probe} VALUES (%s, %s)", (n, param))
                            cursor.execute(
                                f"SELECT {stored_as}, v = %s FROM {probe} WHERE n = %s",
                                (param, n),
                            )
                    except (ValueError, pymysql.err.DataError) as exc:
                        raise InvalidKey(_refused(table, column, value, exc)) from None
                    except pymysql.err.OperationalError as exc:
                        if exc.args[0] in LOST_SERVER_CODES:
                            raise
                        raise InvalidKey(_refused(table, column, value, exc)) from None
                    row = cursor.fetchone()
                    assert row is not None
                    # Strict mode still rounds 1.5 into an int: a value the server holds as
                    # something that no longer equals it is refused too, as `WHERE id = 1.5`
                    # would find nothing.
                    if not row[1]:
                        reason = ValueError(
                            f"the server stores it as {converter(column)(row[0])!r}"
                        )
                        raise InvalidKey(_refused(table, column, value, reason))
                    stored.append(row[0])
            finally:
                cursor.execute("SET SESSION sql_mode = @dblog_sql_mode")
                if not mariadb:
                    cursor.execute(f"DROP TEMPORARY TABLE {probe}")
        convert = converter(column)
        return [freeze(convert(v)) for v in stored]

    def _replica_caught_up(self) -> None:
        """Wait until the read replica has applied the primary's GTID position of now: every
        commit the tailer had read when it armed the window, or the written lw (MariaDB applies
        a domain's transactions in order). Raises `ReplicaBehind` after `replica_wait_s`."""
        with self._session() as cursor:
            cursor.execute("SELECT @@gtid_binlog_pos")
            row = cursor.fetchone()
        wanted = str(row[0]) if row else ""
        with self._session(replica=True) as cursor:
            cursor.execute("SELECT MASTER_GTID_WAIT(%s, %s)", (wanted, self._config.replica_wait_s))
            waited = cursor.fetchone()
            if waited is not None and waited[0] == 0:
                return
            cursor.execute("SELECT @@gtid_slave_pos")
            found = cursor.fetchone()
        applied = found[0] if found else "?"
        raise ReplicaBehind(
            f"the read replica of {self._config.name} has applied GTID {applied}, not yet "
            f"{wanted}, which a chunk needs, after {self._config.replica_wait_s}s (is its SQL "
            "thread running?)"
        )

    def _primary_end(self) -> ReadSnapshot:
        """A replica read's hw: the primary's binlog end, read after the replica's snapshot
        was taken; every transaction that snapshot sees committed on the primary before."""
        with self._session() as cursor:
            cursor.execute("SHOW MASTER STATUS")
            row = cursor.fetchone()
        if row is None:
            raise SourceError(f"source {self._config.name} shows no binlog (SHOW MASTER STATUS)")
        end = mysql_commit(binlog_file_number(str(row[0])), int(row[1]))
        return ReadSnapshot(end - 1, exact=False)

    @contextmanager
    def _session(self, *, replica: bool = False) -> Iterator[Cursor]:
        """A cursor on the connection to the source, or to its `read_replica` (opened if there
        is none: `SourceUnavailable` if it cannot be); a server lost while it is used raises
        `SourceUnavailable` and drops both, so the next call connects again."""
        replica = replica and self._config.read_replica is not None
        conn = self._replica if replica else self._conn
        if conn is None or not conn.open:
            conn = self._config.connect(replica=replica)
            if replica:
                self._replica = conn
            else:
                self._conn = conn
        try:
            with conn.cursor() as cursor:
                yield cursor
        except pymysql.err.MySQLError as exc:
            if not session_lost(exc):
                raise
            self._drop()
            raise SourceUnavailable(
                f"lost the MySQL source {self._config.name}: {cause(exc)}"
            ) from exc

    def _drop(self) -> None:
        for conn in (self._conn, self._replica):
            if conn is not None:
                with contextlib.suppress(pymysql.Error):  # already gone: nothing to tell it
                    conn.close()
        self._conn = self._replica = None

    def _shape(self, table: TableRef) -> _Shape:
        shape = self._shapes.get(table)
        return shape if shape is not None else self._reshape(table)

    def _reshape(self, table: TableRef) -> _Shape:
        with self._session() as cursor:
            unique_key = self._config.unique_keys.get(table)
            shape = self._shapes[table] = table_shape(cursor.connection, table, unique_key)
        return shape


def _key(columns: Sequence[ColumnInfo], row: Sequence[Any]) -> Key:
    return tuple(freeze(converter(c)(v)) for c, v in zip(columns, row, strict=True))


def _key_param(column: ColumnInfo, value: JsonValue) -> Any:
    """A key value for the server to judge: text as typed, numbers as their JSON text (so
    strict mode refuses 1.5 for an integer column instead of rounding it), booleans as 1 and
    0; binary keys are base64, as events carry them."""
    if column.data_type in ("binary", "varbinary"):
        return to_param(column, value)
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int | float):
        return json.dumps(value)
    if isinstance(value, str):
        return value
    raise ValueError(f"a key value is a JSON scalar, not {type(value).__name__}")


def _refused(table: TableRef, column: ColumnInfo, value: JsonValue, reason: Exception) -> str:
    text = str(reason.args[-1] if reason.args else reason).strip()
    first = text.splitlines()[0] if text else type(reason).__name__
    return (
        f"key value {value!r} is not a valid {column.column_type} for column {column.name} "
        f"of {table}: {first}"
    )
