"""The PostgreSQL log reader: the streaming replication protocol that carries pgoutput.

This module is the transport: START_REPLICATION on the slot, CopyData frames, 'k' keepalives,
'w' XLogData, standby status replies and what has been received and flushed. What each decoded
message means (positions, relations, row changes, watermarks) is `changes.ChangeMapper`'s work.

Acknowledging a handed-over transaction confirms it up to the end of its commit record, so a
restart does not send it again; the slot never moves into a transaction still being read.
"""

from __future__ import annotations

import contextlib
import logging
import select
import socket
import struct
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

import psycopg
from psycopg import pq, sql
from psycopg.rows import TupleRow

from airflow_provider_dblog.core.event import TableRef
from airflow_provider_dblog.core.log import Idle, LogItem, WatermarkWrite
from airflow_provider_dblog.core.schema import TableSchema
from airflow_provider_dblog.sources.base import LogBacklog, SourceError, SourceUnavailable
from airflow_provider_dblog.sources.postgres import pgoutput
from airflow_provider_dblog.sources.postgres.catalog import describe_relation, describe_table
from airflow_provider_dblog.sources.postgres.changes import ROW_CHANGE_TAGS, ChangeMapper
from airflow_provider_dblog.sources.postgres.config import PostgresSourceConfig
from airflow_provider_dblog.sources.postgres.errors import lost_sqlstate, source_errors
from airflow_provider_dblog.sources.postgres.lsn import parse_pg_lsn

_XLOG_DATA_HEADER = struct.Struct("!QQq")  # after 'w': start LSN, server WAL end, send time
_KEEPALIVE = struct.Struct("!QqB")  # after 'k': server WAL end, send time, reply requested
_STATUS = struct.Struct("!cQQQqB")  # 'r', written, flushed, applied, client time, reply wanted
_MESSAGE_AT = 1 + _XLOG_DATA_HEADER.size
"""Where the pgoutput message starts in an XLogData frame."""
_STATUS_CHECK_FRAMES = 1023
"""`items` goes through `_next_frame` (which sends a status when one is due) at least once
every 1024 frames even while frames keep coming."""
_W, _BEGIN, _COMMIT = b"wBC"
"""The first bytes of an XLogData frame and of the Begin and Commit messages."""
_GATHER_S = 0.001
"""How long `_next_frame` lets a busy stream's next frames arrive before it reads them."""
_GATHER_HEAVY_S = 0.05
"""The same on a heavy stream that keeps up: one whose last gathering found `_HEAVY_FRAMES`
frames or more, and whose last commit was sent less than `_BEHIND_US` after it committed. Each
wake-up costs the reader, the writer (a batch, its fsync) and the checkpoint a fixed amount;
under an OLTP load 50 ms between them (at most 20 a second, each event durable 50 ms later at
most) cost 15% less CPU an event than 20 ms did, and 20 ms 10 to 40% less than 5 ms
(`bench_sustained`)."""
_GATHER_DUMPING_S = 0.02
"""`_GATHER_HEAVY_S` while a dump's watermarks come (`_DUMPING_S`): each of its chunks waits
for the reader twice, at its low and at its high watermark."""
_DUMPING_S = 1.0
"""A watermark write read this recently means a dump is running."""
_GATHER_BEHIND_S = 0.005
"""The same on a heavy stream that is behind (a backlog): there a longer sleep lets the
server's sending stall on a full socket (a backlog of small transactions was read at half the
rate with 20 ms), and a shorter one wakes the reader for less."""
_HEAVY_FRAMES = 16
_BEHIND_US = 100_000
"""A commit sent this long after it committed (both the server's clock: the frame's send time
and the commit's time) marks the stream as behind."""
_COMMIT_TIME = struct.Struct("!q")
_COMMIT_TIME_AT = _MESSAGE_AT + 18
"""Where a Commit message's commit time is in its frame: after 'C', flags, commit and end LSN."""
_BUSY_S = 0.02
"""A stream whose last frame came within this is busy: its next wait starts by gathering."""
_KEEPALIVE_IDLE_S = 0.02
"""A keepalive the reader did not ask for is an `Idle` item if the last one came this long ago
or more. A walsender that keeps up with a busy log sends one each time it waits for WAL, often
several a transaction: each would cost the tailer a look at its writer and its windows."""

log = logging.getLogger(__name__)

_TAKE_OVER_WAIT_MS = 5000
"""How long `pg_terminate_backend` waits for the slot's old holder to exit."""


@dataclass(slots=True)
class _Stream:
    """One replication connection, the catalog connection beside it, and the reader's mapper
    (which outlives the stream)."""

    conn: psycopg.Connection[TupleRow]
    catalog: psycopg.Connection[TupleRow]
    mapper: ChangeMapper
    poller: select.poll
    """Waits for the connection's socket or the reader's wake (registered once)."""
    last_status: float = field(default_factory=time.monotonic)
    last_frame: float = 0.0
    """When `_next_frame` last returned a frame."""
    frames: int = 0
    """Frames `items` read from this stream; `gathered_from` where the last gathering began."""
    gathered_from: int = 0
    behind: bool = False
    """The last commit read was sent `_BEHIND_US` or more after it committed."""
    last_idle: float = 0.0
    """When `items` last yielded an `Idle` for a keepalive."""
    last_watermark: float = -_DUMPING_S
    """When `items` last yielded a `WatermarkWrite`."""
    asked: bool = False
    """A keepalive was asked for (the reader was idle, or woken): the next one is an `Idle`."""


class PostgresLogReader:
    """`LogReader` over a logical replication slot with pgoutput.

    `items()` connects (again, after SourceUnavailable) and streams from the slot's confirmed
    flush position. When nothing arrives for `idle_after` seconds outside a transaction it asks
    the server for a keepalive and yields `Idle(server WAL end)`: often, since an idle log's
    beats are when the tailer arms and closes read-only windows.
    """

    def __init__(
        self,
        config: PostgresSourceConfig,
        *,
        idle_after: float = 0.1,
        status_interval: float = 10.0,
        remembered_commits: int = 100_000,
    ) -> None:
        self._config = config
        self._idle_after = idle_after
        self._status_interval = status_interval
        self._stream: _Stream | None = None
        # Made on the first connection, which names the database; kept across reconnections.
        self._mapper: ChangeMapper | None = None
        self._schema_versions: Mapping[TableRef, int] = {}
        # (commit LSN, end LSN) of handed-over transactions not yet acknowledged, oldest first.
        self._commit_ends: deque[tuple[int, int]] = deque(maxlen=remembered_commits)
        self._received = 0
        self._flushed = 0
        self._wake_in, self._wake_out = socket.socketpair()
        """`wake` sends a byte that ends `_next_frame`'s wait (sockets, not raw descriptors:
        a late wake after `close` fails instead of writing into a reused descriptor)."""
        self._wake_in.setblocking(False)
        self._wake_out.setblocking(False)
        self._before_waiting: Callable[[], None] = _nothing

    # -- LogReader ----------------------------------------------------------------------------

    def items(self) -> Iterator[LogItem]:
        try:
            stream = self._stream or self._connect()
            get_copy_data = stream.conn.pgconn.get_copy_data
            mapper = stream.mapper
            frames = stream.frames
            while True:
                # The frames already received are read here, a call each; `_next_frame` waits
                # for more (and sends the periodic status while the stream is busy).
                size, data = get_copy_data(1)
                frames += 1
                stream.frames = frames
                frame: bytes | None
                if size > 0 and frames & _STATUS_CHECK_FRAMES:
                    frame = bytes(data)
                else:
                    if size == 0 and mapper.holding:
                        yield from mapper.take_all()  # what was read goes out before a wait
                    frame = self._next_frame(stream, size, data)
                if frame is None:
                    if stream.mapper.open_commit is None:
                        self._send_status(stream, reply_wanted=True)
                        stream.asked = True
                    continue
                tag = frame[_MESSAGE_AT] if len(frame) > _MESSAGE_AT and frame[0] == _W else 0
                # Nearly every frame: a row change, read into the run.
                if tag in ROW_CHANGE_TAGS and mapper.add_change(frame, _MESSAGE_AT):
                    if mapper.full:
                        yield from mapper.take_all()
                    continue
                # A transaction's begin and commit: the runs go out together later.
                if tag == _BEGIN:
                    if mapper.read_begin(frame, _MESSAGE_AT):
                        continue
                elif tag == _COMMIT:
                    _, wal_end, sent = _XLOG_DATA_HEADER.unpack_from(frame, 1)
                    self._received = max(self._received, wal_end)
                    committed = _COMMIT_TIME.unpack_from(frame, _COMMIT_TIME_AT)[0]
                    stream.behind = sent - committed >= _BEHIND_US
                    ends = mapper.read_commit(frame, _MESSAGE_AT)
                    if ends is not None:
                        self._commit_ends.append(ends)
                        if mapper.full:
                            yield from mapper.take_all()
                        continue
                if frame[:1] == b"k":
                    wal_end, _, reply_wanted = _KEEPALIVE.unpack_from(frame, 1)
                    self._received = max(self._received, wal_end)
                    if reply_wanted:
                        self._send_status(stream)
                    now = time.monotonic()
                    if stream.mapper.open_commit is None and (
                        stream.asked or now - stream.last_idle >= _KEEPALIVE_IDLE_S
                    ):
                        stream.asked = False
                        stream.last_idle = now
                        yield from mapper.take_all()
                        yield Idle(wal_end)
                    continue
                # Any other message, or one read the general way: what was read goes out first.
                if mapper.holding:
                    yield from mapper.take_all()
                if frame[:1] == b"w":
                    _, wal_end, _ = _XLOG_DATA_HEADER.unpack_from(frame, 1)
                    self._received = max(self._received, wal_end)
                    message = pgoutput.decode(frame[_MESSAGE_AT:])
                    if isinstance(message, pgoutput.Commit):
                        self._commit_ends.append((message.commit_lsn, message.end_lsn))
                    for item in stream.mapper.map(message):
                        if isinstance(item, WatermarkWrite):
                            stream.last_watermark = time.monotonic()
                        yield item
                else:
                    raise SourceError(f"unexpected replication message {frame[:1]!r}")
        except psycopg.Error as exc:
            self._drop_stream()
            raise SourceUnavailable(
                f"replication stream of {self._config.name} lost: {exc}"
            ) from exc

    def acknowledge(self, commit: int) -> None:
        """Confirm to the slot that everything up to `commit` is durable downstream; the slot
        is the resume point, so there is none to return.

        A handed-over transaction's commit is confirmed up to the end of its commit record, so
        a restart does not send it again; any other value (`Idle.log_end`) as it is, but never
        into a transaction still being read, and never backwards."""
        flush = commit
        while self._commit_ends and self._commit_ends[0][0] <= commit:
            done, end = self._commit_ends.popleft()
            if done == commit:
                flush = end
        stream = self._stream
        if stream is not None and stream.mapper.open_commit is not None:
            flush = min(flush, stream.mapper.open_commit)
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

    def use_schema_versions(self, versions: Mapping[TableRef, int]) -> None:
        """Row events carry their table's version in `versions` (`StampsSchemaVersions`)."""
        self._schema_versions = versions
        if self._mapper is not None:
            self._mapper.schema_versions = versions

    def describe(self, table: TableRef) -> TableSchema:
        """`table`'s columns as the catalog has them now, described as Relation messages are."""
        try:
            return describe_table(self._catalog(), table)
        except psycopg.Error as exc:
            self._drop_stream()
            raise SourceUnavailable(
                f"cannot read the catalog of {self._config.name}: {exc}"
            ) from exc

    def close(self) -> None:
        self._drop_stream()
        self._wake_in.close()
        self._wake_out.close()

    # -- AnnouncesWaits -----------------------------------------------------------------------

    def before_waiting(self, hook: Callable[[], None]) -> None:
        """Call `hook` whenever `items` is about to wait for frames (`_next_frame`)."""
        self._before_waiting = hook

    # -- Wakeable -----------------------------------------------------------------------------

    def wake(self) -> None:
        """End the current wait for the log now (any thread): the next idle beat comes at once."""
        with contextlib.suppress(OSError):  # full (a wake is pending anyway), or closed
            self._wake_out.send(b"w")

    # -- ReportsLogBacklog --------------------------------------------------------------------

    def log_backlog(self) -> LogBacklog:
        """The slot as the server sees it, on a short connection of its own (any thread): WAL
        from the confirmed flush position to the server's current one, and from the slot's
        restart position (the WAL it holds back from removal)."""
        with source_errors(f"cannot read slot {self._config.slot!r}"), self._config.connect() as c:
            row = c.execute(
                "SELECT greatest(0, pg_wal_lsn_diff(now, confirmed_flush_lsn)),"
                " pg_wal_lsn_diff(now, restart_lsn)"
                " FROM pg_replication_slots, pg_current_wal_lsn() AS now"
                " WHERE slot_name = %s",
                (self._config.slot,),
            ).fetchone()
        if row is None or row[0] is None:
            raise SourceError(f"replication slot {self._config.slot!r} does not exist")
        return LogBacklog(int(row[0]), None if row[1] is None else max(0, int(row[1])))

    def log_end(self) -> int:
        """The WAL flushed so far: every commit record the slot can decode starts below it."""
        with (
            source_errors(f"cannot read the WAL end of {self._config.name}"),
            self._config.connect() as conn,
        ):
            row = conn.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()
        assert row is not None
        return parse_pg_lsn(row[0])

    # -- connection ---------------------------------------------------------------------------

    def _connect(self) -> _Stream:
        with source_errors(f"cannot start the replication stream of {self._config.name}"):
            return self._open_stream()

    def _open_stream(self) -> _Stream:
        config = self._config
        catalog = config.connect()
        try:
            row = catalog.execute(
                "SELECT current_database(), confirmed_flush_lsn::text, plugin, active_pid"
                " FROM pg_replication_slots WHERE slot_name = %s",
                (config.slot,),
            ).fetchone()
            if row is None:
                raise SourceError(
                    f"replication slot {config.slot!r} does not exist: run ensure_setup first"
                )
            db, confirmed, plugin, holder = row
            if plugin != "pgoutput":
                raise SourceError(f"replication slot {config.slot!r} uses {plugin}, not pgoutput")
            if holder is not None:
                self._take_slot_from(catalog, holder)
            if confirmed is not None:
                self._flushed = max(self._flushed, parse_pg_lsn(confirmed))
            conn = config.connect(replication=True)
        except BaseException:
            catalog.close()
            raise
        if self._mapper is None:
            self._mapper = ChangeMapper(
                source=config.name,
                db=db,
                captured=config.tables,
                watermark=config.watermark,
                describe=self._describe_relation,
                schema_versions=self._schema_versions,
            )
        poller = select.poll()
        poller.register(conn.pgconn.socket, select.POLLIN)
        poller.register(self._wake_in, select.POLLIN)
        stream = _Stream(conn, catalog, self._mapper, poller)
        try:
            self._start_replication(stream)
        except BaseException:
            conn.close()
            catalog.close()
            raise
        self._stream = stream
        return stream

    def _take_slot_from(self, catalog: psycopg.Connection[TupleRow], pid: int) -> None:
        """End the session that holds the slot. Only the lease holder opens a reader, so the
        holder is a tailer that lost its lease without noticing (stopped, partitioned, frozen):
        its walsender would otherwise keep the slot until `wal_sender_timeout`, and no leader
        could read. Its writes are refused by the fencing token whenever it wakes."""
        slot = self._config.slot
        log.warning("slot %r is held by backend %d (a stale tailer): ending it", slot, pid)
        try:
            catalog.execute("SELECT pg_terminate_backend(%s, %s)", (pid, _TAKE_OVER_WAIT_MS))
        except psycopg.errors.InsufficientPrivilege as exc:
            raise SourceError(
                f"slot {slot!r} is held by backend {pid}, which the role of {self._config.name} "
                f"may not end ({exc}): grant it pg_signal_backend, or end that backend"
            ) from None
        released = catalog.execute(
            "SELECT active_pid IS NULL FROM pg_replication_slots WHERE slot_name = %s", (slot,)
        ).fetchone()
        if released is None or not released[0]:
            raise SourceUnavailable(f"slot {slot!r} is still held by backend {pid}")

    def _start_replication(self, stream: _Stream) -> None:
        config = self._config
        publications = sql.Identifier(config.publication).as_string(stream.catalog)
        command = sql.SQL(
            "START_REPLICATION SLOT {} LOGICAL 0/0 (proto_version '1', publication_names {})"
        ).format(sql.Identifier(config.slot), sql.Literal(publications))
        pgconn = stream.conn.pgconn
        pgconn.send_query(command.as_bytes(stream.catalog))
        while pgconn.is_busy():
            _wait(pgconn.socket, select.POLLIN)
            pgconn.consume_input()
        result = pgconn.get_result()
        if result is None or result.status != pq.ExecStatus.COPY_BOTH:
            message = result.get_error_message().strip() if result else "no result"
            field = result.error_field(pq.DiagnosticField.SQLSTATE) if result else None
            sqlstate = field.decode() if field else None
            if sqlstate == "55006":  # object_in_use: another reader holds the slot
                raise SourceUnavailable(f"slot {config.slot!r} is busy: {message}")
            if result is None or lost_sqlstate(sqlstate):
                raise SourceUnavailable(f"replication from slot {config.slot!r} lost: {message}")
            raise SourceError(f"cannot start replication from slot {config.slot!r}: {message}")

    def _drop_stream(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            stream.mapper.drop_transaction()
            stream.conn.close()
            stream.catalog.close()

    def _catalog(self) -> psycopg.Connection[TupleRow]:
        stream = self._stream
        if stream is None:
            raise SourceUnavailable(f"no stream of {self._config.name} to read the catalog over")
        return stream.catalog

    def _describe_relation(self, relation: pgoutput.Relation) -> TableSchema:
        """The mapper's one catalog question, asked on the current stream's catalog connection."""
        columns = tuple((c.name, c.type_oid, c.type_modifier) for c in relation.columns)
        return describe_relation(self._catalog(), relation.relation_id, columns)

    def _next_frame(self, stream: _Stream, size: int, data: memoryview | bytes) -> bytes | None:
        """The next CopyData payload, or None after `idle_after` seconds without one: the
        frame `size, data` that `get_copy_data` gave last, or the next one received.

        On a busy stream the server sends a transaction's messages one by one as it decodes
        them; waking for each would cost a poll and a read a message. So a wait that follows a
        frame closely starts with a short sleep (`_GATHER_S`, longer on a heavy stream), after
        which everything that arrived meanwhile is read in one go: a few milliseconds of delay
        at most, for a fraction of the system calls and of the writer's batches. What the
        socket holds already is read first, without a wait (a backlog never sleeps)."""
        pgconn = stream.conn.pgconn
        now = time.monotonic()
        deadline = now + self._idle_after
        if size == 0:
            pgconn.consume_input()
            size, data = pgconn.get_copy_data(1)
        gather = size == 0 and now - stream.last_frame < _BUSY_S
        while True:
            if now - stream.last_status >= self._status_interval:
                self._send_status(stream)
            if size > 0:
                stream.last_frame = now
                return bytes(data)
            if size < 0:
                result = pgconn.get_result()
                message = result.get_error_message() if result else ""
                raise psycopg.OperationalError(f"replication stream ended: {message.strip()}")
            if now >= deadline:
                return None
            self._before_waiting()
            if gather:
                gather = False
                frames = stream.frames - stream.gathered_from
                time.sleep(gathering_s(frames, stream.behind, now - stream.last_watermark))
                stream.gathered_from = stream.frames
                pgconn.consume_input()
            else:
                readable, woken = _wait_or_wake(stream.poller, self._wake_in, deadline - now)
                if woken:
                    return None
                if readable:
                    pgconn.consume_input()
            size, data = pgconn.get_copy_data(1)
            now = time.monotonic()

    def _send_status(self, stream: _Stream, *, reply_wanted: bool = False) -> None:
        now_pg = int(time.time() * 1_000_000) - pgoutput.PG_EPOCH_MICROS
        message = _STATUS.pack(
            b"r", self._received, self._flushed, self._flushed, now_pg, int(reply_wanted)
        )
        pgconn = stream.conn.pgconn
        pgconn.put_copy_data(message)
        while pgconn.flush() > 0:
            _wait(pgconn.socket, select.POLLOUT)
        stream.last_status = time.monotonic()


def gathering_s(frames: int, behind: bool, watermark_s: float) -> float:
    """How long a wait on a busy stream lets its next frames arrive: longer on a heavy one
    (`frames` at its last gathering), less so while it is `behind` or a dump's watermarks come
    (the last read `watermark_s` ago)."""
    if frames < _HEAVY_FRAMES:
        return _GATHER_S
    if behind:
        return _GATHER_BEHIND_S
    if watermark_s < _DUMPING_S:
        return _GATHER_DUMPING_S
    return _GATHER_HEAVY_S


def _nothing() -> None:
    pass


def _wait_or_wake(poller: select.poll, wake: socket.socket, timeout: float) -> tuple[bool, bool]:
    """Wait until `poller`'s socket is readable, `wake` has a byte or `timeout` passes:
    (readable, woken); the wake's bytes are taken."""
    ready = poller.poll(max(0, int(timeout * 1000)))
    woken = False
    for found, _ in ready:
        if found == wake.fileno():
            woken = True
            with contextlib.suppress(BlockingIOError):
                wake.recv(4096)
    return len(ready) > woken, woken


def _wait(fd: int, events: int) -> None:
    """Wait until `fd` is ready for `events` (poll has no descriptor-number limit)."""
    poller = select.poll()
    poller.register(fd, events)
    poller.poll()
