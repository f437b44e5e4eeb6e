"""The MySQL/MariaDB log reader: connects, resumes, and turns binlog events into `changes`
records.

The events come from `wire.BinlogStream` (the replication protocol on a PyMySQL connection);
their headers and the bodies of non-row events are read here with `events`, and a rows event
is handed over as its bytes, which `changes.BinlogMapper` decodes with the row reader compiled
for its table map (`rows`). What the records mean (positions, transactions, watermarks) is the
mapper's work, and what is acknowledged becomes a `resume.ResumePoint`.

- The stream blocks and asks the server for a heartbeat every `heartbeat_s` of silence: a
  heartbeat is the reader's cue to yield `Idle` (a non-blocking dump would end at the log's
  end, and reconnecting to poll makes MariaDB search its binlog for the GTID state each time).
  A tenth of a second: an idle log's beats are when the tailer arms and closes read-only
  windows. A dump that adds or readies one need not wait for the next beat: `wake` ends the
  stream's wait at once, and the reader yields `Idle` at the end of what it has read.
- Each reader announces its own server_id (two readers with the same id kick each other off).
- It resumes from the saved point: MariaDB by GTID state (without one it ignores a file and
  offset and replays from the first binlog), MySQL by GTID set when gtid_mode is ON, else by
  file and offset.
- A lost connection raises `SourceUnavailable`: the tailer backs off and the reader connects
  again from the last acknowledged point.
- A binlog purged past the resume point is a `BinlogPurged` error naming it, never a skip.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import socket
from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import Any

import pymysql

from airflow_provider_dblog.core.event import TableRef
from airflow_provider_dblog.core.log import Idle, LogItem, TransactionEnd
from airflow_provider_dblog.core.schema import TableSchema
from airflow_provider_dblog.sources.base import LogBacklog, SourceError, SourceUnavailable
from airflow_provider_dblog.sources.mysql import events as ev
from airflow_provider_dblog.sources.mysql.catalog import table_schema, table_shape
from airflow_provider_dblog.sources.mysql.changes import BinlogMapper, TableColumns
from airflow_provider_dblog.sources.mysql.config import MysqlSourceConfig
from airflow_provider_dblog.sources.mysql.coordinates import binlog_file_number, mysql_commit
from airflow_provider_dblog.sources.mysql.errors import cause, session_lost, source_errors
from airflow_provider_dblog.sources.mysql.records import (
    Begin,
    BinlogRecord,
    LogEnd,
    Query,
    RowKind,
    Rows,
    Xid,
)
from airflow_provider_dblog.sources.mysql.resume import (
    Acknowledgements,
    ResumePoint,
    advance_gtid_set,
    advance_gtid_state,
)
from airflow_provider_dblog.sources.mysql.wire import WOKEN, BinlogStream

log = logging.getLogger(__name__)

_ER_MASTER_FATAL_READING_BINLOG = 1236
_TABLE_MAPS_KEPT = 1024
_ROW_KINDS = {
    **dict.fromkeys(ev.WRITES, RowKind.INSERT),
    **dict.fromkeys(ev.UPDATES, RowKind.UPDATE),
    ev.DELETE_ROWS_V1: RowKind.DELETE,
    ev.DELETE_ROWS: RowKind.DELETE,
}


class BinlogPurged(SourceError):
    """The binlog the reader must resume from is gone (purged, or the log reset): the changes
    since are lost to it."""


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
        heartbeat_s: float = 0.1,
    ) -> None:
        self._config = config
        self._heartbeat_s = heartbeat_s
        self._saved = None if resume is None else ResumePoint.from_text(resume)
        self._acks: Acknowledgements | None = None
        self._mapper: BinlogMapper | None = None
        self._stream: BinlogStream | None = None
        self._catalog: pymysql.connections.Connection[Any] | None = None
        self._server_id = config.server_id + (
            secrets.randbelow(config.server_id_span) if config.server_id_span > 1 else 0
        )
        self._mariadb = False
        # Where the stream is: the binlog file, and the GTID state up to the transaction read.
        self._file = ""
        self._gtid_state: str | None = None
        self._open_gtid: str | None = None
        self._read_to = 0
        """The commit position just past the last transaction read or the last heartbeat:
        where the log ends as far as the reader knows (what a wake's `Idle` says)."""
        # How events are framed, from the connection and the format description event.
        self._checksum = 0
        self._post_headers: bytes = b""
        self._schema_versions: Mapping[TableRef, int] = {}
        self._wake_in, self._wake_out = socket.socketpair()
        """`wake` sends a byte that ends the stream's wait (sockets, not raw descriptors: a
        late wake after `close` fails instead of writing into a reused descriptor)."""
        self._wake_in.setblocking(False)
        self._wake_out.setblocking(False)

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
            row_kinds, records, mapping = _ROW_KINDS, self._records, mapper.map
            rows, table_map, rows_head = mapper.rows, mapper.table_map, ev.rows_head
            maps: dict[bytes, ev.TableMap] = {}
            for event in stream.events():
                type_code = event[4]
                kind = row_kinds.get(type_code)
                if kind is not None:  # nearly every other event: its rows, read from its bytes
                    head = rows_head(event, type_code, self._post_header(type_code))
                    yield from rows(Rows(kind, head, event, len(event) - self._checksum))
                    continue
                if type_code == ev.TABLE_MAP:  # before each rows event, mostly the same again
                    end = len(event) - self._checksum
                    body = event[ev.HEADER_SIZE : end]
                    known = maps.get(body)
                    if known is None:
                        known = ev.table_map(event, end, self._post_header(type_code))
                        if len(maps) >= _TABLE_MAPS_KEPT:
                            maps.clear()
                        maps[body] = known
                    table_map(known)
                    continue
                if event is WOKEN:
                    if mapper.open_commit is None:
                        yield from mapping(LogEnd(self._read_to))
                    continue
                for record in records(event):
                    for item in mapping(record):
                        if isinstance(item, TransactionEnd):
                            acks.handed(item.commit, self._transaction_end(event))
                        yield item
        except pymysql.err.MySQLError as exc:
            self._drop_stream()
            code = exc.args[0] if exc.args else None
            if code == _ER_MASTER_FATAL_READING_BINLOG:
                raise self._purged(exc) from exc
            if not session_lost(exc):
                raise SourceError(f"binlog reader of {self._config.name}: {cause(exc)}") from None
            raise SourceUnavailable(f"binlog stream of {self._config.name} lost: {exc}") from exc
        raise SourceUnavailable(f"binlog stream of {self._config.name} ended")

    def use_schema_versions(self, versions: Mapping[TableRef, int]) -> None:
        """Row events carry the tailer's current schema versions (`StampsSchemaVersions`)."""
        self._schema_versions = versions
        if self._mapper is not None:
            self._mapper.schema_versions = versions

    def acknowledge(self, commit: int) -> str | None:
        """Everything up to `commit` is durable: the point after the last transaction handed
        over with a commit at most `commit` (`Idle` values lie below the next commit)."""
        if self._acks is None:
            return None if self._saved is None else self._saved.to_text()
        return self._acks.acknowledge(commit).to_text()

    def log_end(self) -> int:
        """The binlog's end less one: every transaction's first event starts below it, and a
        reader idle at the end says so (`Idle(end - 1)`)."""
        with (
            source_errors(f"cannot read the binlog end of {self._config.name}"),
            self._config.connect() as conn,
            conn.cursor() as cursor,
        ):
            status = _binlog_status(cursor)
        return mysql_commit(binlog_file_number(str(status[0])), int(status[1])) - 1

    def log_backlog(self) -> LogBacklog:
        """The binlog bytes from the last acknowledged point to the log's end, on a connection
        of its own (the metrics thread asks). The server keeps binlogs by age, not for this
        reader, so there is no retained figure."""
        point = self._acks.acknowledged if self._acks is not None else self._saved
        with (
            source_errors(f"cannot read the binlogs of {self._config.name}"),
            self._config.connect() as conn,
            conn.cursor() as cursor,
        ):
            cursor.execute("SHOW BINARY LOGS")
            files = [(str(row[0]), int(row[1])) for row in cursor.fetchall()]
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
            shape = table_shape(catalog, table, self._config.unique_keys.get(table))
            return table_schema(catalog, shape)
        except pymysql.err.MySQLError as exc:
            if not session_lost(exc):
                raise SourceError(f"cannot describe {table}: {cause(exc)}") from None
            self._drop_stream()
            raise SourceUnavailable(
                f"cannot read the catalog of {self._config.name}: {exc}"
            ) from exc

    def close(self) -> None:
        self._drop_stream()
        self._wake_in.close()
        self._wake_out.close()

    # -- Wakeable -----------------------------------------------------------------------------

    def wake(self) -> None:
        """End the stream's current wait now (any thread): between transactions the reader
        yields `Idle` at once."""
        with contextlib.suppress(OSError):  # full (a wake is pending anyway), or closed
            self._wake_out.send(b"w")

    # -- connection ---------------------------------------------------------------------------

    def _connect(self) -> BinlogStream:
        config = self._config
        catalog = config.connect()
        try:
            mariadb, db, start = self._start_point(catalog)
            self._mariadb = mariadb
            if self._mapper is None:
                self._mapper = BinlogMapper(
                    source=config.name,
                    db=db,
                    captured=config.tables,
                    watermark=config.watermark,
                    columns=self._columns,
                )
                self._mapper.schema_versions = self._schema_versions
            self._mapper.drop_transaction()
            self._acks = Acknowledgements(start)
            self._file, self._gtid_state, self._open_gtid = start.file, start.gtid_state, None
            self._read_to = self._commit(start.offset)
            with catalog.cursor() as cursor:
                cursor.execute("SELECT @@global.binlog_checksum")
                row = cursor.fetchone()
            self._checksum = 4 if row is not None and str(row[0]).upper() == "CRC32" else 0
            self._post_headers = b""
            stream = BinlogStream.open(
                pymysql.connect(**self._stream_settings()),
                server_id=self._server_id,
                heartbeat_s=self._heartbeat_s,
                mariadb=mariadb,
                file=start.file,
                offset=start.offset,
                gtid_state=start.gtid_state,
                wake=self._wake_in,
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
        settings.pop("database", None)  # a dump names no database
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

    def _records(self, event: bytes) -> Iterator[BinlogRecord]:
        """The records of an event other than a rows event (`items` reads those itself)."""
        kind, end = event[4], len(event) - self._checksum
        if kind == ev.MARIADB_GTID or kind == ev.GTID:
            gtid = (
                ev.mariadb_gtid(event, ev.HEADER.unpack_from(event)[2])
                if kind == ev.MARIADB_GTID
                else ev.mysql_gtid(event)
            )
            self._open_gtid = gtid.gtid
            yield Begin(self._start_of(event), _ts_ms(event), gtid.gtid, gtid.txid, gtid.standalone)
        elif kind == ev.QUERY:
            query = ev.query(event, end)
            yield Query(self._start_of(event), _ts_ms(event), query.schema, query.sql)
        elif kind == ev.XID or kind == ev.XA_PREPARE:
            # An XA transaction's group ends at its PREPARE; its XA COMMIT is a group of its
            # own. (Its rows are handed over at PREPARE, even if an XA ROLLBACK follows.)
            yield Xid()
        elif kind == ev.ROTATE:
            self._file = ev.rotate(event, end)
        elif kind == ev.HEARTBEAT:
            self._file = ev.heartbeat_file(event, end)
            self._read_to = self._commit(ev.HEADER.unpack_from(event)[4])
            yield LogEnd(self._read_to)
        elif kind == ev.HEARTBEAT_V2:
            self._file, offset = ev.heartbeat_v2(event, end)
            self._read_to = self._commit(offset)
            yield LogEnd(self._read_to)
        elif kind == ev.FORMAT_DESCRIPTION:
            self._post_headers = ev.post_header_lengths(event)
        elif kind == ev.PARTIAL_UPDATE_ROWS or kind in ev.MARIADB_COMPRESSED_ROWS:
            raise SourceError(
                f"the binlog of {self._config.name} holds {_UNSUPPORTED[kind]}, which the "
                f"reader does not decode: {_UNSUPPORTED_FIX[kind]}"
            )

    def _post_header(self, kind: int) -> int:
        """The post-header length of event type `kind` from the format description event."""
        lengths = self._post_headers
        if kind - 1 < len(lengths):
            return lengths[kind - 1]
        return 10 if kind in ev.ROWS_V2 else 8

    def _start_of(self, event: bytes) -> int:
        _, _, _, size, next_offset, _ = ev.HEADER.unpack_from(event)
        return self._commit(next_offset - size)

    def _commit(self, offset: int) -> int:
        return mysql_commit(binlog_file_number(self._file), offset)

    def _transaction_end(self, event: bytes) -> ResumePoint:
        """The point after the transaction `event` ended: the next event's offset, and the
        GTID state with this transaction in it."""
        if self._open_gtid is not None and self._gtid_state is not None:
            advance = advance_gtid_state if self._mariadb else advance_gtid_set
            self._gtid_state = advance(self._gtid_state, self._open_gtid)
        self._open_gtid = None
        offset = ev.HEADER.unpack_from(event)[4]
        self._read_to = self._commit(offset)
        return ResumePoint(self._file, offset, self._gtid_state)

    def _columns(self, table: TableRef) -> TableColumns:
        """The mapper's one catalog question, asked on the catalog connection."""
        catalog = self._catalog
        if catalog is None:
            raise SourceUnavailable(f"no connection to {self._config.name} for its catalog")
        shape = table_shape(catalog, table, self._config.unique_keys.get(table))
        return TableColumns(table_schema(catalog, shape), shape.columns)


def _ts_ms(event: bytes) -> int:
    return int(ev.HEADER.unpack_from(event)[0]) * 1000


_UNSUPPORTED = {
    ev.PARTIAL_UPDATE_ROWS: "partial JSON updates (binlog_row_value_options = PARTIAL_JSON)",
    **dict.fromkeys(ev.MARIADB_COMPRESSED_ROWS, "compressed row events (log_bin_compress)"),
}
_UNSUPPORTED_FIX = {
    ev.PARTIAL_UPDATE_ROWS: "SET GLOBAL binlog_row_value_options = ''",
    **dict.fromkeys(ev.MARIADB_COMPRESSED_ROWS, "SET GLOBAL log_bin_compress = OFF"),
}


def _log_end(cursor: Any, mariadb: bool) -> ResumePoint:
    """The binlog's end now: where a reader without a saved point starts."""
    status = _binlog_status(cursor)
    gtid_state: str | None = None
    if mariadb:  # the state at exactly that file and offset
        cursor.execute("SELECT BINLOG_GTID_POS(%s, %s)", (status[0], status[1]))
        row = cursor.fetchone()
        gtid_state = "" if row is None or row[0] is None else str(row[0])
    elif _gtid_mode_on(cursor):
        gtid_state = str(status[4] or "")  # Executed_Gtid_Set, as of the file and offset
    return ResumePoint(str(status[0]), int(status[1]), gtid_state)


def _binlog_status(cursor: Any) -> tuple[Any, ...]:
    """The server's binlog status row: file, offset, ..., and on MySQL its executed GTIDs."""
    try:
        cursor.execute("SHOW MASTER STATUS")
    except pymysql.err.ProgrammingError:
        cursor.execute("SHOW BINARY LOG STATUS")  # MySQL 8.4
    status: tuple[Any, ...] | None = cursor.fetchone()
    if status is None:
        raise SourceError("the binary log is off: start the server with log_bin")
    return status


def _gtid_mode_on(cursor: Any) -> bool:
    """MySQL with GTIDs. Asked of MySQL only: MariaDB always has GTIDs and no gtid_mode, and
    would answer with an error (1193) that its audit and error logs record."""
    cursor.execute("SELECT @@GLOBAL.gtid_mode")
    row = cursor.fetchone()
    return row is not None and str(row[0]).upper() == "ON"
