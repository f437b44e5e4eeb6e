"""The replication protocol: a binlog dump asked for on a PyMySQL connection, its events read
straight from the socket.

PyMySQL connects and authenticates (TLS, auth plugins and all); the session variables a
replica sets and the dump command are sent on that connection, and from then on the stream is
read here: each packet is one event (or part of one over 16 MiB), read with one buffered read
of its length, with no packet object and no copy but the event's own bytes. mysql-replication
did the same work with a wrapper object and a copy of the remaining buffer per field read,
which bounded the reader at a few thousand rows a second.

- MariaDB starts at a GTID state (`@slave_connect_state`, then COM_BINLOG_DUMP with no file);
  MySQL at a GTID set (COM_BINLOG_DUMP_GTID) when it has one, else at a file and offset.
- The server sends a heartbeat every `heartbeat_s` of silence; a read that waits longer than a
  few heartbeats (the socket's timeout) means the server is gone.
- An error packet (a purged binlog, a duplicate server id, ...) is raised as PyMySQL's
  `OperationalError` with the server's code, as any other query error would be.
"""

from __future__ import annotations

import struct
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


class BinlogStream:
    """The events of one binlog dump, in log order, from the point the dump was asked at."""

    def __init__(self, conn: pymysql.connections.Connection[Any]) -> None:
        self._conn = conn
        self._file: Any = None

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
    ) -> BinlogStream:
        """Asks `conn`'s server for its binlog from `gtid_state` if given, else from `file`
        at `offset`. `conn` is the stream's from then on (closed here if the asking fails)."""
        try:
            return cls._ask(conn, server_id, heartbeat_s, mariadb, file, offset, gtid_state)
        except BaseException:
            conn._force_close()  # never raises, whatever state the failure left it in
            raise

    @classmethod
    def _ask(
        cls,
        conn: pymysql.connections.Connection[Any],
        server_id: int,
        heartbeat_s: float,
        mariadb: bool,
        file: str,
        offset: int,
        gtid_state: str | None,
    ) -> BinlogStream:
        with conn.cursor() as cursor:
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
        stream = cls(conn)
        stream._send(command)
        return stream

    def _send(self, payload: bytes) -> None:
        conn = self._conn
        conn._write_bytes(len(payload).to_bytes(3, "little") + b"\0" + payload)
        sock = conn._sock
        assert sock is not None
        sock.settimeout(conn._read_timeout)  # writing set the write timeout (none by default)
        self._file = sock.makefile("rb", buffering=_READ_BUFFER)

    def events(self) -> Iterator[bytes]:
        """Each event's bytes (header, body and checksum); ends when the server ends the
        dump. A lost connection raises PyMySQL's OperationalError (CR_SERVER_LOST)."""
        read = self._read
        while True:
            head = read(5)
            length, marker = head[0] | head[1] << 8 | head[2] << 16, head[4]
            body = read(length - 1)
            if length == _MAX_PACKET:
                body += self._continuation()
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

    def _continuation(self) -> bytes:
        """The rest of an event over 16 MiB: packets of 0xFFFFFF bytes, ended by a shorter one."""
        parts = []
        while True:
            head = self._read(4)
            length = head[0] | head[1] << 8 | head[2] << 16
            parts.append(self._read(length))
            if length < _MAX_PACKET:
                return b"".join(parts)

    def _read(self, size: int) -> bytes:
        try:
            data: bytes = self._file.read(size)
        except OSError as exc:
            raise pymysql.err.OperationalError(
                CR.CR_SERVER_LOST, f"Lost connection to the binlog stream ({exc})"
            ) from exc
        if len(data) < size:
            raise pymysql.err.OperationalError(
                CR.CR_SERVER_LOST, "Lost connection to the binlog stream"
            )
        return data

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        self._conn._force_close()  # no COM_QUIT: the connection is a dump stream now


def _server_error(body: bytes) -> pymysql.err.OperationalError:
    """An error packet's code and message (after '#' and the five-character SQL state)."""
    code = int.from_bytes(body[:2], "little")
    message = body[2:]
    if message[:1] == b"#":
        message = message[6:]
    return pymysql.err.OperationalError(code, message.decode("utf-8", "replace"))
