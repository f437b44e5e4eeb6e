"""The replication protocol: a binlog dump asked for on a PyMySQL connection, its events read
straight from the socket.

PyMySQL connects and authenticates (TLS, auth plugins and all); the session variables a
replica sets and the dump command are sent on that connection, and from then on the stream is
read here: each packet is one event (or part of one over 16 MiB), sliced out of the stream's own
receive buffer, with no packet object and no copy but the event's own bytes. mysql-replication
did the same work with a wrapper object and a copy of the remaining buffer per field read,
which bounded the reader at a few thousand rows a second.

- MariaDB starts at a GTID state (`@slave_connect_state`, then COM_BINLOG_DUMP with no file);
  MySQL at a GTID set (COM_BINLOG_DUMP_GTID) when it has one, else at a file and offset.
- The server sends a heartbeat every `heartbeat_s` of silence; a wait longer than a few
  heartbeats (the connection's read timeout) means the server is gone.
- The reader may end a wait at once (`Wakeable`): a byte on its wake socket makes `events`
  yield `WOKEN`, but only between packets, with every byte received read (a packet begun is
  finished first: the server is sending it).
- An error packet (a purged binlog, a duplicate server id, ...) is raised as PyMySQL's
  `OperationalError` with the server's code, as any other query error would be.
"""

from __future__ import annotations

import contextlib
import select
import socket
import ssl
import struct
import time
from collections.abc import Iterator
from typing import Any

import pymysql
from pymysql.constants import CR
from pymysqlreplication.gtid import GtidSet

_COM_BINLOG_DUMP = 0x12
_COM_BINLOG_DUMP_GTID = 0x1E
_BINLOG_THROUGH_GTID = 0x04
_MARIADB_CAPABILITY_GTID = 4
_MAX_PACKET = 0xFFFFFF
_READ_BUFFER = 1 << 20
_NO_READ_TIMEOUT = 3600.0
"""A connection without a read timeout waits this long for the server."""

WOKEN = bytes(19)
"""What `BinlogStream.events` yields when woken: no event (its type code, 0, is
UNKNOWN_EVENT's), so a reader's dispatch on the type code passes it by untested; it is told
apart by identity."""


class BinlogStream:
    """The events of one binlog dump, in log order, from the point the dump was asked at.

    The stream keeps its own receive buffer (the socket is non-blocking once the dump is
    asked): it knows when every byte received is read, and only then waits, on the socket and
    on `wake` together, so a wake never strands bytes in a buffer the wait cannot see."""

    def __init__(
        self, conn: pymysql.connections.Connection[Any], wake: socket.socket | None = None
    ) -> None:
        self._conn = conn
        self._wake = wake
        self._sock: socket.socket | None = None
        self._timeout = float(conn._read_timeout or _NO_READ_TIMEOUT)
        self._heard = time.monotonic()

    @classmethod
    def open(
        cls,
        conn: pymysql.connections.Connection[Any],
        *,
        server_id: int,
        heartbeat_s: float,
        mariadb: bool,
        file: str,
        offset: int,
        gtid_state: str | None,
        wake: socket.socket | None = None,
    ) -> BinlogStream:
        """Asks `conn`'s server for its binlog from `gtid_state` if given, else from `file`
        at `offset`. `conn` is the stream's from then on (closed here if the asking fails).
        A byte on `wake` makes `events` yield `WOKEN` while it waits for the server."""
        try:
            stream = cls(conn, wake)
            stream._ask(server_id, heartbeat_s, mariadb, file, offset, gtid_state)
            return stream
        except BaseException:
            conn._force_close()  # never raises, whatever state the failure left it in
            raise

    def _ask(
        self,
        server_id: int,
        heartbeat_s: float,
        mariadb: bool,
        file: str,
        offset: int,
        gtid_state: str | None,
    ) -> None:
        with self._conn.cursor() as cursor:
            cursor.execute("SET @master_binlog_checksum = @@global.binlog_checksum")
            cursor.execute("SET @master_heartbeat_period = %s", (int(heartbeat_s * 1e9),))
            cursor.execute("SET @mariadb_slave_capability = %s", (_MARIADB_CAPABILITY_GTID,))
            if mariadb and gtid_state is not None:
                cursor.execute("SET @slave_connect_state = %s", (gtid_state,))
                cursor.execute("SET @slave_gtid_strict_mode = 1")
                cursor.execute("SET @slave_gtid_ignore_duplicates = 0")
        if mariadb and gtid_state is not None:
            command = struct.pack("<BIHI", _COM_BINLOG_DUMP, 4, 0, server_id)
        elif gtid_state is not None:
            gtids = GtidSet(gtid_state).encoded()
            command = struct.pack(
                "<BHIIQI", _COM_BINLOG_DUMP_GTID, _BINLOG_THROUGH_GTID, server_id, 0, 4, len(gtids)
            )
            command += gtids
        else:
            command = struct.pack("<BIHI", _COM_BINLOG_DUMP, offset, 0, server_id)
            command += file.encode("utf-8")
        conn = self._conn
        conn._write_bytes(len(command).to_bytes(3, "little") + b"\0" + command)
        sock = conn._sock
        assert sock is not None
        sock.setblocking(False)  # from here `_receive` waits, with the read timeout
        self._sock = sock
        self._heard = time.monotonic()

    def events(self) -> Iterator[bytes]:
        """Each event's bytes (header, body and checksum), or `WOKEN` when a byte on `wake`
        ended a wait with nothing buffered; ends when the server ends the dump. A lost
        connection raises PyMySQL's OperationalError (CR_SERVER_LOST)."""
        buffer, at = b"", 0
        while True:
            if at + 4 > len(buffer):
                if at == len(buffer):
                    received = self._receive(_READ_BUFFER, wakeable=True)
                    if received is None:
                        yield WOKEN
                        continue
                    buffer, at = received, 0
                if at + 4 > len(buffer):
                    buffer, at = self._at_least(buffer, at, 4), 0
            length = buffer[at] | buffer[at + 1] << 8 | buffer[at + 2] << 16
            end = at + 4 + length
            if end > len(buffer):
                buffer, at = self._at_least(buffer, at, 4 + length), 0
                end = 4 + length
            marker, body, at = buffer[at + 4], buffer[at + 5 : end], end
            if length == _MAX_PACKET:
                rest, buffer, at = self._continuation(buffer, at)
                body += rest
            if marker == 0:
                yield body
            elif marker == 0xFF:
                raise _server_error(body)
            elif marker == 0xFE and length < 9:
                return
            else:
                raise pymysql.err.OperationalError(
                    CR.CR_MALFORMED_PACKET, f"binlog stream: unexpected packet 0x{marker:02x}"
                )

    def _continuation(self, buffer: bytes, at: int) -> tuple[bytes, bytes, int]:
        """The rest of an event over 16 MiB (packets of 0xFFFFFF bytes, ended by a shorter
        one) from `buffer` at `at`, and the buffer and offset after it."""
        parts = []
        while True:
            if at + 4 > len(buffer):
                buffer, at = self._at_least(buffer, at, 4), 0
            length = buffer[at] | buffer[at + 1] << 8 | buffer[at + 2] << 16
            if at + 4 + length > len(buffer):
                buffer, at = self._at_least(buffer, at, 4 + length), 0
            parts.append(buffer[at + 4 : at + 4 + length])
            at += 4 + length
            if length < _MAX_PACKET:
                return b"".join(parts), buffer, at

    def _at_least(self, buffer: bytes, at: int, size: int) -> bytes:
        """`buffer` from `at`, with bytes received after it until it holds `size` at least (a
        packet begun is finished: no wake)."""
        pending = bytearray(buffer[at:])
        while len(pending) < size:
            received = self._receive(max(_READ_BUFFER, size - len(pending)), wakeable=False)
            assert received is not None
            pending += received
        return bytes(pending)

    def _receive(self, size: int, *, wakeable: bool) -> bytes | None:
        """Up to `size` bytes from the server, waiting for some if none has come; None if
        `wakeable` and a byte on `wake` ended the wait (the wake's bytes are taken)."""
        sock = self._sock
        assert sock is not None
        wake = self._wake if wakeable else None
        while True:
            try:
                data = sock.recv(size)
            except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                if self._wait(sock, wake):
                    return None
                continue
            except OSError as exc:
                raise pymysql.err.OperationalError(
                    CR.CR_SERVER_LOST, f"Lost connection to the binlog stream ({exc})"
                ) from exc
            if not data:
                raise pymysql.err.OperationalError(
                    CR.CR_SERVER_LOST, "Lost connection to the binlog stream"
                )
            self._heard = time.monotonic()
            return data

    def _wait(self, sock: socket.socket, wake: socket.socket | None) -> bool:
        """Wait until `sock` is readable or `wake` has a byte (True, its bytes taken); a server
        silent for the read timeout (several heartbeats) is gone."""
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        if wake is not None:
            poller.register(wake, select.POLLIN)
        left = self._heard + self._timeout - time.monotonic()
        ready = {fd for fd, _ in poller.poll(max(0, int(left * 1000)))}
        if wake is not None and wake.fileno() in ready:
            with contextlib.suppress(BlockingIOError):
                wake.recv(4096)
            return True
        if not ready and left <= 0:
            raise pymysql.err.OperationalError(
                CR.CR_SERVER_LOST,
                f"Lost connection to the binlog stream (nothing for {self._timeout:.0f}s)",
            )
        return False

    def close(self) -> None:
        self._sock = None
        self._conn._force_close()  # no COM_QUIT: the connection is a dump stream now


def _server_error(body: bytes) -> pymysql.err.OperationalError:
    """An error packet's code and message (after '#' and the five-character SQL state)."""
    code = int.from_bytes(body[:2], "little")
    message = body[2:]
    if message[:1] == b"#":
        message = message[6:]
    return pymysql.err.OperationalError(code, message.decode("utf-8", "replace"))
