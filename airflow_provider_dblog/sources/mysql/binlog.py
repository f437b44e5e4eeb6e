"""The MySQL/MariaDB log reader: mysql-replication's BinLogStreamReader as the transport.

This module connects, resumes and turns the library's events into `changes` records; what the
records mean (positions, transactions, watermarks) is `changes.BinlogMapper`'s work, and what
is acknowledged becomes a `resume.ResumePoint`.

- The stream blocks and asks the server for a heartbeat every `heartbeat_s` of silence: a
  heartbeat is the reader's cue to yield `Idle` (a non-blocking dump would end at the log's
  end, and reconnecting to poll makes MariaDB search its binlog for the GTID state each time).
- Each reader announces its own server_id (two readers with the same id kick each other off).
- It resumes from the saved point: MariaDB by GTID state (without one it ignores a file and
  offset and replays from the first binlog), MySQL by GTID set when gtid_mode is ON, else by
  file and offset.
- The library reconnects by itself after a lost connection, from where it was first told to
  start, and gives up after a server restart: this reader refuses that second connection and
  raises `SourceUnavailable`, so the tailer backs off and a new reader resumes from the last
  acknowledged point.
- A binlog purged past the resume point is a `BinlogPurged` error naming it, never a skip.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import logging
import secrets
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pymysql
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.constants.NONE_SOURCE import EMPTY_SET
from pymysqlreplication.event import (
    GtidEvent,
    HeartbeatLogEvent,
    MariadbGtidEvent,
    QueryEvent,
    RotateEvent,
    XAPrepareEvent,
    XidEvent,
)
from pymysqlreplication.row_event import (
    DeleteRowsEvent,
    RowsEvent,
    UpdateRowsEvent,
    WriteRowsEvent,
)

from airflow_provider_dblog.core.event import JsonValue, TableRef
from airflow_provider_dblog.core.log import Idle, LogItem, TransactionEnd
from airflow_provider_dblog.core.position import binlog_file_number, mysql_commit
from airflow_provider_dblog.core.schema import TableSchema
from airflow_provider_dblog.sources.base import LogBacklog, SourceError, SourceUnavailable
from airflow_provider_dblog.sources.mysql.catalog import table_schema, table_shape
from airflow_provider_dblog.sources.mysql.changes import (
    Begin,
    BinlogMapper,
    BinlogRecord,
    LogEnd,
    Query,
    RawRow,
    RowKind,
    Rows,
    TableColumns,
    Xid,
)
from airflow_provider_dblog.sources.mysql.config import MysqlSourceConfig
from airflow_provider_dblog.sources.mysql.converters import converter
from airflow_provider_dblog.sources.mysql.resume import (
    Acknowledgements,
    ResumePoint,
    advance_gtid_set,
    advance_gtid_state,
)

log = logging.getLogger(__name__)

_ER_MASTER_FATAL_READING_BINLOG = 1236
_ER_UNKNOWN_SYSTEM_VARIABLE = 1193
_MARIADB_STANDALONE = 0x01  # FL_STANDALONE: a group of one statement without BEGIN/COMMIT
_EVENTS = [
    MariadbGtidEvent,
    GtidEvent,
    QueryEvent,
    XidEvent,
    XAPrepareEvent,
    WriteRowsEvent,
    UpdateRowsEvent,
    DeleteRowsEvent,
    RotateEvent,
    HeartbeatLogEvent,
]


class BinlogPurged(SourceError):
    """The binlog the reader must resume from is gone (purged, or the log reset): the changes
    since are lost to it."""


class _SecondConnection(Exception):
    """The library tried to reconnect its stream by itself (from a stale start)."""


class MysqlLogReader:
    """`LogReader` over the binlog (ROW format, FULL images) of MySQL 8 or MariaDB.

    `resume` is the point saved with the last checkpoint (`ResumePoint.to_text`); without one
    the reader starts at the log's current end. `items()` connects (again, after
    `SourceUnavailable`, from the last acknowledged point)."""

    def __init__(
        self,
        config: MysqlSourceConfig,
        resume: str | None,
        *,
        heartbeat_s: float = 1.0,
    ) -> None:
        self._config = config
        self._heartbeat_s = heartbeat_s
        self._saved = None if resume is None else ResumePoint.from_text(resume)
        self._acks: Acknowledgements | None = None
        self._mapper: BinlogMapper | None = None
        self._stream: BinLogStreamReader | None = None
        self._catalog: pymysql.connections.Connection[Any] | None = None
        self._server_id = config.server_id + (
            secrets.randbelow(config.server_id_span) if config.server_id_span > 1 else 0
        )
        self._mariadb = False
        # Where the stream is: the binlog file, and the GTID state up to the transaction read.
        self._file = ""
        self._gtid_state: str | None = None
        self._open_gtid: str | None = None
        # Columns met in the binlog that the catalog no longer has, warned about once.
        self._warned_columns: dict[TableRef, set[str]] = {}

    # -- LogReader ----------------------------------------------------------------------------

    def items(self) -> Iterator[LogItem]:
        try:
            fresh = self._stream is None and self._acks is None and self._saved is None
            stream = self._stream or self._connect()
            mapper, acks = self._mapper, self._acks
            assert mapper is not None and acks is not None
            if fresh:
                # No saved point: the log's end now is where capture starts. Handing it over
                # at once gets it saved before any change is read, so a reader started again
                # after an outage does not start at a later end and miss what came between.
                start = acks.acknowledged
                yield Idle(mysql_commit(binlog_file_number(start.file), start.offset) - 1)
            for event in stream:
                for record in self._records(event):
                    for item in mapper.map(record):
                        if isinstance(item, TransactionEnd):
                            acks.handed(item.commit, self._transaction_end(event))
                        yield item
        except (pymysql.err.OperationalError, pymysql.err.InterfaceError, _SecondConnection) as exc:
            self._drop_stream()
            code = exc.args[0] if exc.args else None
            if code == _ER_MASTER_FATAL_READING_BINLOG:
                raise self._purged(exc) from exc
            raise SourceUnavailable(f"binlog stream of {self._config.name} lost: {exc}") from exc
        raise SourceUnavailable(f"binlog stream of {self._config.name} ended")

    def acknowledge(self, commit: int) -> str | None:
        """Everything up to `commit` is durable: the point after the last transaction handed
        over with a commit at most `commit` (`Idle` values lie below the next commit)."""
        if self._acks is None:
            return None if self._saved is None else self._saved.to_text()
        return self._acks.acknowledge(commit).to_text()

    def log_backlog(self) -> LogBacklog:
        """The binlog bytes from the last acknowledged point to the log's end, on a connection
        of its own (the metrics thread asks). The server keeps binlogs by age, not for this
        reader, so there is no retained figure."""
        point = self._acks.acknowledged if self._acks is not None else self._saved
        try:
            with self._config.connect() as conn, conn.cursor() as cursor:
                cursor.execute("SHOW BINARY LOGS")
                files = [(str(row[0]), int(row[1])) for row in cursor.fetchall()]
        except (pymysql.err.OperationalError, pymysql.err.InterfaceError) as exc:
            raise SourceUnavailable(
                f"cannot read the binlogs of {self._config.name}: {exc}"
            ) from exc
        if point is None:
            return LogBacklog(behind_bytes=0, retained_bytes=None)
        at = binlog_file_number(point.file)
        behind = 0
        for name, size in files:
            number = binlog_file_number(name)
            if number > at:
                behind += size
            elif number == at:
                behind += max(0, size - point.offset)
        return LogBacklog(behind_bytes=behind, retained_bytes=None)

    def describe(self, table: TableRef) -> TableSchema:
        """`table`'s columns as the catalog has them now, described as at a DDL statement."""
        catalog = self._catalog
        if catalog is None:
            raise SourceUnavailable(f"no connection to {self._config.name} for its catalog")
        try:
            return table_schema(catalog, table_shape(catalog, table))
        except (pymysql.err.OperationalError, pymysql.err.InterfaceError) as exc:
            self._drop_stream()
            raise SourceUnavailable(
                f"cannot read the catalog of {self._config.name}: {exc}"
            ) from exc

    def close(self) -> None:
        self._drop_stream()

    # -- connection ---------------------------------------------------------------------------

    def _connect(self) -> BinLogStreamReader:
        config = self._config
        catalog = config.connect()
        try:
            mariadb, db, start = self._start_point(catalog)
            self._mariadb = mariadb
            by_gtid = start.gtid_state is not None
            if self._mapper is None:
                self._mapper = BinlogMapper(
                    source=config.name,
                    db=db,
                    captured=config.tables,
                    watermark=config.watermark,
                    columns=self._columns,
                )
            self._mapper.drop_transaction()
            self._acks = Acknowledgements(start)
            self._file, self._gtid_state, self._open_gtid = start.file, start.gtid_state, None
            stream = BinLogStreamReader(
                connection_settings=self._stream_settings(),
                server_id=self._server_id,
                blocking=True,
                slave_heartbeat=self._heartbeat_s,
                resume_stream=True,
                only_events=_EVENTS,
                only_schemas=sorted({t.schema for t in (*config.tables, config.watermark)}),
                only_tables=sorted({t.name for t in (*config.tables, config.watermark)}),
                is_mariadb=mariadb,
                auto_position=start.gtid_state if by_gtid else None,
                log_file=None if by_gtid else start.file,
                log_pos=None if by_gtid else start.offset,
                pymysql_wrapper=_OneStreamConnection(),
                enable_logging=False,
            )
        except BaseException:
            catalog.close()
            raise
        self._catalog, self._stream = catalog, stream
        return stream

    def _start_point(
        self, catalog: pymysql.connections.Connection[Any]
    ) -> tuple[bool, str, ResumePoint]:
        """Whether the server is MariaDB, the database events name (`MysqlSource.database`),
        and where to start: the last acknowledged point, the saved one, or the log's end now."""
        with catalog.cursor() as cursor:
            cursor.execute("SELECT VERSION(), DATABASE()")
            row = cursor.fetchone()
            assert row is not None
            mariadb = "mariadb" in str(row[0]).lower()
            db = "" if row[1] is None else str(row[1])
            start = self._acks.acknowledged if self._acks is not None else self._saved
            if start is None:
                start = _log_end(cursor, mariadb)
            elif mariadb and start.gtid_state is None:
                raise SourceError(
                    f"the saved resume point of {self._config.name} has no GTID state, which "
                    "MariaDB needs: delete the tailer checkpoint and dump the tables again"
                )
            elif not mariadb and (start.gtid_state is None or not _gtid_mode_on(cursor)):
                start = replace(start, gtid_state=None)
                cursor.execute("SHOW BINARY LOGS")
                if start.file not in {str(r[0]) for r in cursor.fetchall()}:
                    raise self._purged(None, start)
        return mariadb, db, start

    def _stream_settings(self) -> dict[str, Any]:
        settings = self._config.connect_kwargs()
        settings.pop("database", None)  # the library's catalog connection names its own
        # A read that waits longer than a few heartbeats means the server is gone.
        settings["read_timeout"] = max(10, int(self._heartbeat_s * 4) + 1)
        settings["connect_timeout"] = 10
        return settings

    def _drop_stream(self) -> None:
        stream, self._stream = self._stream, None
        catalog, self._catalog = self._catalog, None
        if self._mapper is not None:
            self._mapper.drop_transaction()
        if stream is not None:
            stream.close()
        if catalog is not None:
            catalog.close()

    def _purged(self, exc: BaseException | None, point: ResumePoint | None = None) -> BinlogPurged:
        point = point or (self._acks.acknowledged if self._acks is not None else self._saved)
        where = "the log" if point is None else f"binlog {point.file} at offset {point.offset}"
        if point is not None and point.gtid_state:
            where += f" (GTID state {point.gtid_state})"
        detail = f" (server: {exc.args[-1]})" if exc is not None and exc.args else ""
        name = self._config.name
        return BinlogPurged(
            f"the tailer of {name} must resume from {where}, which the server cannot send any "
            f"more{detail}: the binlog was purged or reset, and the changes since are lost to "
            f"the log. To capture again from now, delete the Redis key "
            f"dblog:{{{name}}}:tailer:resume (the tailer then starts at the log's end), restart "
            "the tailer and dump the captured tables to repair the output; keep binlogs longer "
            "(binlog_expire_logs_seconds)"
        )

    # -- events to records --------------------------------------------------------------------

    def _records(self, event: Any) -> Iterator[BinlogRecord]:
        packet = event.packet
        if isinstance(event, RowsEvent):
            yield self._rows(event)
        elif isinstance(event, MariadbGtidEvent | GtidEvent):
            gtid = str(event.gtid)
            self._open_gtid = gtid
            standalone = (
                bool(event.flags & _MARIADB_STANDALONE)
                if isinstance(event, MariadbGtidEvent)
                else None
            )
            txid = int(event.gtid_seq_no) if isinstance(event, MariadbGtidEvent) else None
            yield Begin(self._start_of(packet), event.timestamp * 1000, gtid, txid, standalone)
        elif isinstance(event, QueryEvent):
            schema = event.schema.decode() if isinstance(event.schema, bytes) else event.schema
            yield Query(self._start_of(packet), event.timestamp * 1000, str(schema), event.query)
        elif isinstance(event, XidEvent | XAPrepareEvent):
            # An XA transaction's group ends at its PREPARE; its XA COMMIT is a group of its
            # own. (Its rows are handed over at PREPARE, even if an XA ROLLBACK follows.)
            yield Xid()
        elif isinstance(event, RotateEvent):
            self._file = str(event.next_binlog)
        elif isinstance(event, HeartbeatLogEvent):
            self._file = event.ident.rstrip("\0")
            yield LogEnd(self._commit(packet.log_pos))

    def _start_of(self, packet: Any) -> int:
        return self._commit(int(packet.log_pos) - int(packet.event_size))

    def _commit(self, offset: int) -> int:
        return mysql_commit(binlog_file_number(self._file), offset)

    def _transaction_end(self, event: Any) -> ResumePoint:
        """The point after the transaction `event` ended: the next event's offset, and the
        GTID state with this transaction in it."""
        if self._open_gtid is not None and self._gtid_state is not None:
            advance = advance_gtid_state if self._mariadb else advance_gtid_set
            self._gtid_state = advance(self._gtid_state, self._open_gtid)
        self._open_gtid = None
        return ResumePoint(self._file, int(event.packet.log_pos), self._gtid_state)

    def _rows(self, event: RowsEvent) -> Rows:
        table = TableRef(str(event.schema), str(event.table))
        shape = tuple((c.name, c.type, getattr(c, "max_length", None)) for c in event.columns)
        images: list[tuple[RawRow | None, RawRow | None]]
        if isinstance(event, WriteRowsEvent):
            kind = RowKind.INSERT
            images = [(None, _values(r, "values", "none_sources")) for r in event.rows]
        elif isinstance(event, DeleteRowsEvent):
            kind = RowKind.DELETE
            images = [(_values(r, "values", "none_sources"), None) for r in event.rows]
        else:
            kind = RowKind.UPDATE
            images = [
                (
                    _values(r, "before_values", "before_none_sources"),
                    _values(r, "after_values", "after_none_sources"),
                )
                for r in event.rows
            ]
        return Rows(table, kind, images, shape)

    def _columns(self, table: TableRef) -> TableColumns:
        """The mapper's one catalog question, asked on the catalog connection."""
        catalog = self._catalog
        if catalog is None:
            raise SourceUnavailable(f"no connection to {self._config.name} for its catalog")
        shape = table_shape(catalog, table)
        converters = {column.name: converter(column) for column in shape.columns}

        def convert(name: str, value: object) -> JsonValue:
            found = converters.get(name)
            if found is not None:
                return found(value)
            if name not in self._warned_columns.setdefault(table, set()):
                self._warned_columns[table].add(name)
                log.warning(
                    "source %s: %s.%s is in the binlog but no longer in the catalog (dropped or "
                    "renamed since); its values are converted without it",
                    self._config.name,
                    table,
                    name,
                )
            return _uncatalogued(value)

        return TableColumns(table_schema(catalog, shape), convert)


def _uncatalogued(value: object) -> JsonValue:
    """A value of a column the catalog no longer has (a reader behind a DROP or RENAME COLUMN):
    without the column's type, plain JSON of what the library decoded, so reading goes on."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, decimal.Decimal):
        return format(value, "f")
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, datetime.datetime):
        return value.isoformat(sep=" ")
    if isinstance(value, set | frozenset):
        return ",".join(sorted(str(v) for v in value))
    return str(value)


def _values(row: dict[str, Any], values: str, none_sources: str) -> RawRow:
    """A row image; the empty SET decodes as None, told from NULL by its none source."""
    image: dict[str, object] = row[values]
    empty_sets = [k for k, why in row.get(none_sources, {}).items() if why == EMPTY_SET]
    if empty_sets:
        image = dict(image)
        for name in empty_sets:
            image[name] = set()
    return image


def _log_end(cursor: Any, mariadb: bool) -> ResumePoint:
    """The binlog's end now: where a reader without a saved point starts."""
    try:
        cursor.execute("SHOW MASTER STATUS")
    except pymysql.err.ProgrammingError:
        cursor.execute("SHOW BINARY LOG STATUS")  # MySQL 8.4
    status = cursor.fetchone()
    if status is None:
        raise SourceError("the binary log is off: start the server with log_bin")
    gtid_state: str | None = None
    if mariadb:  # the state at exactly that file and offset
        cursor.execute("SELECT BINLOG_GTID_POS(%s, %s)", (status[0], status[1]))
        row = cursor.fetchone()
        gtid_state = "" if row is None or row[0] is None else str(row[0])
    elif _gtid_mode_on(cursor):
        gtid_state = str(status[4] or "")  # Executed_Gtid_Set, as of the file and offset
    return ResumePoint(str(status[0]), int(status[1]), gtid_state)


def _gtid_mode_on(cursor: Any) -> bool:
    """MySQL with GTIDs (MariaDB always has them, and no gtid_mode)."""
    try:
        cursor.execute("SELECT @@GLOBAL.gtid_mode")
    except pymysql.err.MySQLError as exc:
        if exc.args and exc.args[0] == _ER_UNKNOWN_SYSTEM_VARIABLE:
            return False
        raise
    row = cursor.fetchone()
    return row is not None and str(row[0]).upper() == "ON"


class _OneStreamConnection:
    """mysql-replication's connection maker, allowing one stream connection: the library's own
    reconnection would restart from where the reader first started."""

    def __init__(self) -> None:
        self._streams = 0

    def __call__(self, **kwargs: Any) -> pymysql.connections.Connection[Any]:
        if "cursorclass" not in kwargs:  # the stream; the catalog connection sets one
            self._streams += 1
            if self._streams > 1:
                raise _SecondConnection("the binlog stream was lost")
        if "db" in kwargs:  # the library's spelling, deprecated by PyMySQL
            kwargs["database"] = kwargs.pop("db")
        return pymysql.connect(**kwargs)
