"""The PostgreSQL log reader: pgoutput over the streaming replication protocol, as log items.

Items are yielded as messages are decoded, never a transaction at a time, so memory stays
bounded whatever the transaction size. Positions are `[commit LSN of the transaction, index in
the transaction]`; the commit LSN comes in Begin (final_lsn) before the first change.

Unchanged TOAST values: pgoutput does not resend a large value an UPDATE left alone. Such a
column takes its value from the old row when the server sent one (REPLICA IDENTITY FULL);
otherwise it is left out of `after` (never set to null), and consumers keep the value they
stored. A primary-key-changing UPDATE becomes a delete of the old key and a create of the new
one; without FULL identity that create can lack such columns too.

TRUNCATE is not published (`setup.py` creates the publication without it): a truncated table is
repaired by a dump.
"""

from __future__ import annotations

import logging
import select
import struct
import time
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import pq, sql

from airflow_provider_dblog.core.event import Event, Op, Origin, Row, SourceInfo, TableRef
from airflow_provider_dblog.core.log import Change, Idle, LogItem, TransactionEnd, WatermarkWrite
from airflow_provider_dblog.core.position import Position, parse_pg_lsn
from airflow_provider_dblog.sources.base import SourceError, SourceUnavailable
from airflow_provider_dblog.sources.postgres import pgoutput
from airflow_provider_dblog.sources.postgres.catalog import primary_key
from airflow_provider_dblog.sources.postgres.config import PostgresSourceConfig
from airflow_provider_dblog.sources.postgres.converters import convert

log = logging.getLogger(__name__)

_XLOG_DATA_HEADER = struct.Struct("!QQq")  # after 'w': start LSN, server WAL end, send time
_KEEPALIVE = struct.Struct("!QqB")  # after 'k': server WAL end, send time, reply requested
_STATUS = struct.Struct("!cQQQqB")  # 'r', written, flushed, applied, client time, reply wanted


@dataclass(slots=True)
class _Table:
    """A relation as the current stream described it."""

    relation: pgoutput.Relation
    version: int
    ref: TableRef
    captured: bool
    is_watermark: bool
    key_columns: tuple[str, ...]


@dataclass(slots=True)
class _Transaction:
    begin: pgoutput.Begin
    seq: int = 0

    def next_position(self) -> Position:
        position = Position(self.begin.final_lsn, self.seq)
        self.seq += 1
        return position


@dataclass(slots=True)
class _Stream:
    """One replication connection and what it has received."""

    conn: psycopg.Connection[tuple[Any, ...]]
    catalog: psycopg.Connection[tuple[Any, ...]]
    db: str
    transaction: _Transaction | None = None
    last_status: float = field(default_factory=time.monotonic)


class PostgresLogReader:
    """`LogReader` over a logical replication slot with pgoutput.

    `items()` connects (again, after SourceUnavailable) and streams from the slot's confirmed
    flush position. When nothing arrives for `idle_after` seconds outside a transaction it asks
    the server for a keepalive and yields `Idle(server WAL end)`.
    """

    def __init__(
        self,
        config: PostgresSourceConfig,
        *,
        idle_after: float = 1.0,
        status_interval: float = 10.0,
        remembered_commits: int = 100_000,
    ) -> None:
        self._config = config
        self._idle_after = idle_after
        self._status_interval = status_interval
        self._stream: _Stream | None = None
        self._tables: dict[int, _Table] = {}
        # (commit LSN, end LSN) of handed-over transactions not yet acknowledged, oldest first.
        self._commit_ends: deque[tuple[int, int]] = deque(maxlen=remembered_commits)
        self._received = 0
        self._flushed = 0

    # -- LogReader ----------------------------------------------------------------------------

    def items(self) -> Iterator[LogItem]:
        try:
            stream = self._stream or self._connect()
            while True:
                frame = self._next_frame(stream)
                if frame is None:
                    if stream.transaction is None:
                        self._send_status(stream, reply_wanted=True)
                    continue
                if frame[:1] == b"k":
                    wal_end, _, reply_wanted = _KEEPALIVE.unpack_from(frame, 1)
                    self._received = max(self._received, wal_end)
                    if reply_wanted:
                        self._send_status(stream)
                    if stream.transaction is None:
                        yield Idle(wal_end)
                elif frame[:1] == b"w":
                    _, wal_end, _ = _XLOG_DATA_HEADER.unpack_from(frame, 1)
                    self._received = max(self._received, wal_end)
                    message = pgoutput.decode(frame[1 + _XLOG_DATA_HEADER.size :])
                    yield from self._handle(stream, message)
                else:
                    raise SourceError(f"unexpected replication message {frame[:1]!r}")
        except psycopg.Error as exc:
            self._drop_stream()
            raise SourceUnavailable(
                f"replication stream of {self._config.name} lost: {exc}"
            ) from exc

    def acknowledge(self, commit: int) -> None:
        """Confirm to the slot that everything up to `commit` is durable downstream.

        A handed-over transaction's commit is confirmed up to the end of its commit record, so
        a restart does not send it again; any other value (`Idle.log_end`) as it is, but never
        into a transaction still being read, and never backwards."""
        flush = commit
        while self._commit_ends and self._commit_ends[0][0] <= commit:
            done, end = self._commit_ends.popleft()
            if done == commit:
                flush = end
        stream = self._stream
        if stream is not None and stream.transaction is not None:
            flush = min(flush, stream.transaction.begin.final_lsn)
        if flush <= self._flushed:
            return
        self._flushed = flush
        if stream is not None:
            try:
                self._send_status(stream)
            except psycopg.Error as exc:
                self._drop_stream()
                raise SourceUnavailable(
                    f"cannot acknowledge to {self._config.name}: {exc}"
                ) from exc

    def close(self) -> None:
        self._drop_stream()

    # -- connection ---------------------------------------------------------------------------

    def _connect(self) -> _Stream:
        config = self._config
        catalog = config.connect()
        try:
            row = catalog.execute(
                "SELECT current_database(), confirmed_flush_lsn::text, plugin"
                " FROM pg_replication_slots WHERE slot_name = %s",
                (config.slot,),
            ).fetchone()
            if row is None:
                raise SourceError(
                    f"replication slot {config.slot!r} does not exist: run ensure_setup first"
                )
            db, confirmed, plugin = row
            if plugin != "pgoutput":
                raise SourceError(f"replication slot {config.slot!r} uses {plugin}, not pgoutput")
            if confirmed is not None:
                self._flushed = max(self._flushed, parse_pg_lsn(confirmed))
            conn = config.connect(replication=True)
        except BaseException:
            catalog.close()
            raise
        stream = _Stream(conn, catalog, db)
        try:
            self._start_replication(stream)
        except BaseException:
            conn.close()
            catalog.close()
            raise
        self._stream = stream
        return stream

    def _start_replication(self, stream: _Stream) -> None:
        config = self._config
        publications = sql.Identifier(config.publication).as_string(stream.catalog)
        command = sql.SQL(
            "START_REPLICATION SLOT {} LOGICAL 0/0 (proto_version '1', publication_names {})"
        ).format(sql.Identifier(config.slot), sql.Literal(publications))
        pgconn = stream.conn.pgconn
        pgconn.send_query(command.as_bytes(stream.catalog))
        while pgconn.is_busy():
            _wait(pgconn.socket, select.POLLIN, None)
            pgconn.consume_input()
        result = pgconn.get_result()
        if result is None or result.status != pq.ExecStatus.COPY_BOTH:
            message = result.get_error_message() if result else "no result"
            sqlstate = result.error_field(pq.DiagnosticField.SQLSTATE) if result else None
            if sqlstate == b"55006":  # object_in_use: another reader holds the slot
                raise SourceUnavailable(f"slot {config.slot!r} is busy: {message.strip()}")
            raise SourceError(f"cannot start replication from slot {config.slot!r}: {message}")

    def _drop_stream(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            stream.conn.close()
            stream.catalog.close()

    def _next_frame(self, stream: _Stream) -> bytes | None:
        """The next CopyData payload, or None after `idle_after` seconds without one."""
        pgconn = stream.conn.pgconn
        deadline = time.monotonic() + self._idle_after
        while True:
            now = time.monotonic()
            if now - stream.last_status >= self._status_interval:
                self._send_status(stream)
            size, data = pgconn.get_copy_data(1)
            if size > 0:
                return bytes(data)
            if size < 0:
                result = pgconn.get_result()
                message = result.get_error_message() if result else ""
                raise psycopg.OperationalError(f"replication stream ended: {message.strip()}")
            if now >= deadline:
                return None
            if _wait(pgconn.socket, select.POLLIN, deadline - now):
                pgconn.consume_input()

    def _send_status(self, stream: _Stream, *, reply_wanted: bool = False) -> None:
        now_pg = int(time.time() * 1_000_000) - pgoutput.PG_EPOCH_MICROS
        message = _STATUS.pack(
            b"r", self._received, self._flushed, self._flushed, now_pg, int(reply_wanted)
        )
        pgconn = stream.conn.pgconn
        pgconn.put_copy_data(message)
        while pgconn.flush() > 0:
            _wait(pgconn.socket, select.POLLOUT, None)
        stream.last_status = time.monotonic()

    # -- messages -----------------------------------------------------------------------------

    def _handle(self, stream: _Stream, message: pgoutput.Message) -> Iterator[LogItem]:
        if isinstance(message, pgoutput.Begin):
            stream.transaction = _Transaction(message)
        elif isinstance(message, pgoutput.Commit):
            stream.transaction = None
            self._commit_ends.append((message.commit_lsn, message.end_lsn))
            yield TransactionEnd(message.commit_lsn)
        elif isinstance(message, pgoutput.Relation):
            self._relation(stream, message)
        elif isinstance(message, pgoutput.Insert | pgoutput.Update | pgoutput.Delete):
            if stream.transaction is None:
                raise SourceError("pgoutput sent a row change outside a transaction")
            yield from self._row_change(stream, stream.transaction, message)
        elif isinstance(message, pgoutput.Truncate):
            log.warning(
                "source %s: TRUNCATE of relations %s is not captured; dump the tables again",
                self._config.name,
                list(message.relation_ids),
            )
        # OriginMessage and Type need nothing: values arrive as text either way.

    def _relation(self, stream: _Stream, relation: pgoutput.Relation) -> None:
        previous = self._tables.get(relation.relation_id)
        if previous is not None and previous.relation == relation:
            return
        ref = TableRef(relation.namespace or "pg_catalog", relation.name)
        captured = ref in self._config.tables
        key_columns: tuple[str, ...] = ()
        if captured:
            key_columns = primary_key(stream.catalog, relation.relation_id)
            if not key_columns:
                raise SourceError(f"captured table {ref} has no primary key any more")
        self._tables[relation.relation_id] = _Table(
            relation=relation,
            version=previous.version + 1 if previous is not None else 1,
            ref=ref,
            captured=captured,
            is_watermark=ref == self._config.watermark,
            key_columns=key_columns,
        )

    def _row_change(
        self,
        stream: _Stream,
        transaction: _Transaction,
        message: pgoutput.Insert | pgoutput.Update | pgoutput.Delete,
    ) -> Iterator[LogItem]:
        table = self._tables.get(message.relation_id)
        if table is None:
            raise SourceError(f"pgoutput sent a change of relation {message.relation_id} first")
        if table.is_watermark:
            if isinstance(message, pgoutput.Update):
                value = _row(table, message.new, key_only=False).get("value")
                if isinstance(value, str):
                    yield WatermarkWrite(value, transaction.next_position())
            return
        if not table.captured:
            return

        def event(op: Op, key: Row, before: Row | None, after: Row | None) -> Change:
            source = SourceInfo(
                name=self._config.name,
                db=stream.db,
                schema=table.ref.schema,
                table=table.ref.name,
                position=transaction.next_position(),
                origin=Origin.LOG,
                txid=transaction.begin.xid,
                ts_ms=transaction.begin.commit_ts_us // 1000,
            )
            return Change(Event(op, key, before, after, source, table.version))

        if isinstance(message, pgoutput.Insert):
            after = _row(table, message.new, key_only=False)
            yield event(Op.CREATE, _key(table, after), None, after)
        elif isinstance(message, pgoutput.Delete):
            before = _row(table, message.old, key_only=message.old_is_key_only)
            yield event(Op.DELETE, _key(table, before), before, None)
        else:
            old = (
                None
                if message.old is None
                else _row(table, message.old, key_only=message.old_is_key_only)
            )
            new = _row(table, message.new, key_only=False, unchanged_from=old)
            new_key = _key(table, new, fallback=old)
            old_key = new_key if old is None else _key(table, old)
            if old_key != new_key:
                yield event(Op.DELETE, old_key, old, None)
                yield event(Op.CREATE, new_key, None, new)
            else:
                yield event(Op.UPDATE, new_key, old, new)


def _wait(fd: int, events: int, timeout: float | None) -> bool:
    """Wait until `fd` is ready for `events` (poll has no descriptor-number limit)."""
    poller = select.poll()
    poller.register(fd, events)
    return bool(poller.poll(None if timeout is None else max(0, int(timeout * 1000))))


def _row(
    table: _Table,
    values: pgoutput.TupleData,
    *,
    key_only: bool,
    unchanged_from: Mapping[str, Any] | None = None,
) -> Row:
    """A tuple as a row of JSON values. Unchanged TOAST values come from `unchanged_from` or
    are left out; a key-only tuple keeps only the replica identity columns."""
    columns = table.relation.columns
    if len(values) != len(columns):
        raise SourceError(f"{table.ref}: tuple of {len(values)} values for {len(columns)} columns")
    row: Row = {}
    for column, value in zip(columns, values, strict=True):
        if key_only and not column.is_key:
            continue
        if value.kind is pgoutput.Kind.UNCHANGED_TOAST:
            if unchanged_from is not None and column.name in unchanged_from:
                row[column.name] = unchanged_from[column.name]
            continue
        row[column.name] = convert(column.type_oid, value.text)
    return row


def _key(table: _Table, row: Row, fallback: Row | None = None) -> Row:
    key: Row = {}
    for name in table.key_columns:
        if name in row:
            key[name] = row[name]
        elif fallback is not None and name in fallback:
            key[name] = fallback[name]
        else:
            raise SourceError(f"{table.ref}: a change without primary-key column {name!r}")
    return key
