"""A MariaDB replica of a running `MariaDBServer`, replicating by GTID, for tests that read a
replica.

The replica is a `MariaDBServer` of its own (own directory, port and server_id, read_only=ON)
seeded from a consistent dump of the primary and then replicating from the GTID position of
that dump (`master_use_gtid=slave_pos`).

Why a dump and not "replicate the primary's binlog from its first event": the session's primary
serves many tests before a replica is asked for, and some of them purge its binlog (to test a
reader that resumes past a purged file). A dump taken in one transaction
(`--single-transaction --master-data --gtid`) copies whatever the primary holds now together
with the exact GTID position of that copy, so the replica starts from any primary.

What is copied: every database but the `mysql` system schema (a fresh install has the same),
plus the `dblog` user, which the replica creates itself with the primary's password and grants.
Other users created on the primary before the replica was seeded are not copied; those created
later replicate like any statement. The seed and that user are applied with sql_log_bin=0, so
the replica's own binlog stays empty and cannot diverge from its primary's GTIDs.

The replica connects to the primary over TCP as `dblog` (which holds REPLICATION SLAVE). The
password goes to the server inside CHANGE MASTER (quoted by the client, never on a command
line); MariaDB keeps it in master.info in the replica's data directory, as for any replica.
A replica of a primary with TLS runs with the primary's certificate (the same host) and
requires TLS of `dblog` as it does; it replicates over TLS, verifying the primary's.
"""

from __future__ import annotations

import dataclasses
import secrets
import subprocess
import time
from pathlib import Path
from typing import Any, ClassVar

import pymysql

from airflow_provider_dblog.devservices.mariadb import (
    ADMIN_USER,
    MariaDBInfo,
    MariaDBServer,
    _binary,
)
from airflow_provider_dblog.devservices.process import (
    LOOPBACK,
    ServerStartError,
    log_tail,
)
from airflow_provider_dblog.devservices.replica import (
    DEFAULT_TIMEOUT,
    ReplicaBehind,
    ReplicationBroken,
)

REPLICA_OPTIONS = [
    "--read-only=ON",  # only the replication threads (and SUPER) write
    "--relay-log=relay",  # named after the server, not the host
]

#: How long one MASTER_GTID_WAIT blocks before the wait looks for a replication error.
_WAIT_SLICE = 1.0


@dataclasses.dataclass(frozen=True, kw_only=True)
class MariaDBReplicaInfo(MariaDBInfo):
    """A running replica: connect as with any `MariaDBInfo`, and drive its SQL thread (see
    `devservices.replica` for the calls it shares with the PostgreSQL standby)."""

    primary_port: int
    primary_socket: Path

    def _admin_cursor_run(self, socket: Path, query: str, params: tuple[Any, ...] = ()) -> Any:
        with (
            pymysql.connect(unix_socket=str(socket), user=ADMIN_USER, connect_timeout=5) as conn,
            conn.cursor() as cursor,
        ):
            cursor.execute(query, params)
            row = cursor.fetchone()
        return None if row is None else row[0]

    def primary_position(self) -> str:
        """The primary's GTID position (@@gtid_binlog_pos): its last binlogged transaction."""
        return str(self._admin_cursor_run(self.primary_socket, "SELECT @@gtid_binlog_pos"))

    def position(self) -> str:
        """The GTID position the replica has applied (@@gtid_slave_pos)."""
        return str(self._admin_cursor_run(self.socket, "SELECT @@gtid_slave_pos"))

    def slave_status(self) -> dict[str, Any]:
        """SHOW SLAVE STATUS as a dict (empty when replication is not set up)."""
        with (
            pymysql.connect(**self.admin_connect_kwargs(), connect_timeout=5) as conn,
            conn.cursor(pymysql.cursors.DictCursor) as cursor,
        ):
            cursor.execute("SHOW SLAVE STATUS")
            row: dict[str, Any] | None = cursor.fetchone()
        return row or {}

    def replay_paused(self) -> bool:
        """True while the SQL thread is stopped (events are received but not applied)."""
        return self.slave_status().get("Slave_SQL_Running") != "Yes"

    def pause_replay(self) -> None:
        """STOP SLAVE SQL_THREAD: returns once the SQL thread has stopped. The I/O thread goes
        on receiving the primary's binlog into the relay log."""
        self._admin_cursor_run(self.socket, "STOP SLAVE SQL_THREAD")

    def resume_replay(self) -> None:
        self._admin_cursor_run(self.socket, "START SLAVE SQL_THREAD")

    def wait_replayed(self, position: str, timeout: float = DEFAULT_TIMEOUT) -> None:
        """Return once the replica has applied GTID position `position` (MASTER_GTID_WAIT);
        `ReplicaBehind` after `timeout` seconds, `ReplicationBroken` at once if the SQL thread
        stopped on an error."""
        deadline = time.monotonic() + timeout
        with (
            pymysql.connect(**self.admin_connect_kwargs(), connect_timeout=5) as conn,
            conn.cursor() as cursor,
        ):
            while True:
                remaining = deadline - time.monotonic()
                cursor.execute(
                    "SELECT MASTER_GTID_WAIT(%s, %s)",
                    (position, max(0.0, min(_WAIT_SLICE, remaining))),
                )
                row = cursor.fetchone()
                if row is not None and row[0] == 0:
                    return
                status = self.slave_status()
                if status.get("Last_SQL_Errno"):
                    raise ReplicationBroken(
                        f"replica on port {self.port} stopped applying at GTID position "
                        f"{self.position()}: {status.get('Last_SQL_Error')}; "
                        f"log {self.log_file}"
                    )
                if remaining <= 0:
                    break
        if status.get("Slave_SQL_Running") != "Yes":
            why = "replication is paused (SQL thread stopped): call resume_replay()"
        else:
            why = (
                f"I/O thread {status.get('Slave_IO_Running')}, last I/O error: "
                f"{status.get('Last_IO_Error') or 'none'}"
            )
        raise ReplicaBehind(
            f"replica on port {self.port} applied GTID position {self.position()}, "
            f"not {position}, within {timeout:.0f}s: {why}; log {self.log_file}"
        )

    def wait_caught_up(self, timeout: float = DEFAULT_TIMEOUT) -> None:
        """Wait until the replica has applied everything the primary had binlogged when called."""
        self.wait_replayed(self.primary_position(), timeout)


class MariaDBReplica(MariaDBServer):
    """A replica of `primary` (which must be running) in `base_dir`."""

    name: ClassVar[str] = "mariadb-replica"
    dump_timeout: ClassVar[float] = 300.0

    def __init__(
        self, primary: MariaDBServer, base_dir: Path | str, *, port: int | None = None
    ) -> None:
        super().__init__(base_dir, port=port, tls=primary.tls)
        self.primary = primary
        self.password = primary.password  # the `dblog` user logs in as on the primary
        while self.server_id == primary.server_id:
            self.server_id = 1000 + secrets.randbelow(1_000_000)
        self.dump = _binary("mariadb-dump")
        self.client = _binary("mariadb")

    @property
    def label(self) -> str:
        return "mariadb replica"

    def _initialise(self) -> None:
        if not self.primary.running:
            raise ServerStartError(f"{self.primary.label} is not running: start it first")
        super()._initialise()

    def _command(self) -> list[str]:
        return [*super()._command(), *REPLICA_OPTIONS]

    def _bootstrap(self) -> None:
        with self._admin_connect() as conn, conn.cursor() as cursor:
            self._create_app_user(cursor)  # with sql_log_bin = 0
        self._seed()
        primary = [LOOPBACK, self.primary.port, self.primary.info.user, self.primary.password]
        tls_options = ""
        if self.tls is not None:
            tls_options = ", master_ssl = 1, master_ssl_ca = %s, master_ssl_verify_server_cert = 1"
            primary.append(str(self.tls.ca_file))
        with self._admin_connect() as conn, conn.cursor() as cursor:
            cursor.execute(
                "CHANGE MASTER TO master_host = %s, master_port = %s, master_user = %s,"
                " master_password = %s, master_use_gtid = slave_pos, master_connect_retry = 1"
                + tls_options,
                primary,
            )
            cursor.execute("START SLAVE")
        try:
            self.info.wait_caught_up(self.start_timeout)
        except (ReplicaBehind, ReplicationBroken) as error:
            raise ServerStartError(f"{self.label} did not catch up: {error}") from error
        with pymysql.connect(**self.info.connect_kwargs(), connect_timeout=5) as conn:
            conn.ping()

    def _seed(self) -> None:
        """Load a consistent dump of the primary, ending with SET GLOBAL gtid_slave_pos at the
        dump's GTID position. Both ends log in as root over their Unix sockets: no password."""
        dump_argv = [
            self.dump,
            "--no-defaults",
            f"--socket={self.primary.socket}",
            f"--user={ADMIN_USER}",
            "--all-databases",
            "--ignore-database=mysql",
            "--single-transaction",
            "--master-data=1",
            "--gtid",
            "--routines",
            "--events",
            "--triggers",
        ]
        load_argv = [
            self.client,
            "--no-defaults",
            f"--socket={self.socket}",
            f"--user={ADMIN_USER}",
            "--init-command=SET sql_log_bin = 0",
        ]
        with self.log_file.open("ab") as log:
            log.write(f"$ {' '.join(dump_argv)} | {' '.join(load_argv)}\n".encode())
            log.flush()
            dump = subprocess.Popen(
                dump_argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log
            )
            assert dump.stdout is not None
            try:
                load = subprocess.run(
                    load_argv,
                    stdin=dump.stdout,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    timeout=self.dump_timeout,
                    check=False,
                )
            finally:
                dump.stdout.close()
                dump_code = dump.wait(timeout=self.dump_timeout)
        if dump_code != 0 or load.returncode != 0:
            raise ServerStartError(
                f"seeding {self.label} from {self.primary.label} failed (mariadb-dump code "
                f"{dump_code}, mariadb code {load.returncode}); log {self.log_file}:\n"
                f"{log_tail(self.log_file)}"
            )

    @property
    def info(self) -> MariaDBReplicaInfo:
        base = super().info
        fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(MariaDBInfo)}
        return MariaDBReplicaInfo(
            **fields, primary_port=self.primary.port, primary_socket=self.primary.socket
        )
