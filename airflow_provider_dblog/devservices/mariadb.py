"""A throwaway MariaDB server set up as a DBLog source (binlog in ROW format, FULL images).

It listens on 127.0.0.1 (password login for the `dblog` user, who may read the binlog) and on a
Unix socket in its own directory (root without password, for test set-up).

Given `tls` (a certificate from `devservices.tls`), it speaks TLS with that certificate and the
`dblog` user is created `REQUIRE SSL`, so a login of it (binlog stream included) is encrypted
or refused.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import shutil
from pathlib import Path
from typing import Any, ClassVar

import pymysql

from airflow_provider_dblog.devservices.process import (
    LOOPBACK,
    ServerProcess,
    ServerStartError,
    ServiceInfo,
    run_logged,
    socket_dir,
)
from airflow_provider_dblog.devservices.tls import ServerTLS

APP_USER = "dblog"
APP_DB = "dblog"
ADMIN_USER = "root"

# Options for both mariadb-install-db and mariadbd: small and fast, UTF-8, UTC.
COMMON_OPTIONS = [
    "--innodb-log-file-size=16M",
    "--innodb-buffer-pool-size=64M",
    "--character-set-server=utf8mb4",
    "--collation-server=utf8mb4_unicode_ci",
    "--skip-name-resolve",
]

BINLOG_OPTIONS = [
    "--log-bin=binlog",
    "--binlog-format=ROW",
    "--binlog-row-image=FULL",
    "--binlog-row-metadata=FULL",
    "--gtid-strict-mode=ON",
    "--binlog-expire-logs-seconds=604800",
]
"""What makes a server a DBLog source: a ROW binlog with every column of every row and the
column names, GTIDs kept strictly in order, and a week of binlog kept for a tailer that is
down. docker/compose.yaml runs its MariaDB with these same options
(tests/unit/test_docker_compose.py checks)."""


def _binary(name: str) -> str:
    """A MariaDB program; /usr/sbin is not on every user's PATH."""
    found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin")
    if found is None:
        raise FileNotFoundError(f"{name} not found: run scripts/install-system-deps.sh")
    return found


@dataclasses.dataclass(frozen=True, kw_only=True)
class MariaDBInfo(ServiceInfo):
    """How to reach a running MariaDB. `dsn` and `connect_kwargs()` log in as `dblog` over
    TCP; `admin_connect_kwargs()` as root over the Unix socket."""

    host: str
    port: int
    user: str
    password: str = dataclasses.field(repr=False)
    dbname: str
    socket: Path
    server_id: int

    @property
    def dsn(self) -> str:
        return f"mysql://{self.user}:{self.password}@{self.host}:{self.port}/{self.dbname}"

    @property
    def redacted_dsn(self) -> str:
        return f"mysql://{self.user}:***@{self.host}:{self.port}/{self.dbname}"

    def connect_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for `pymysql.connect` (the binlog stream's too)."""
        return {
            "host": self.host,
            "port": self.port,
            "user": self.user,
            "password": self.password,
            "database": self.dbname,
        }

    def admin_connect_kwargs(self) -> dict[str, Any]:
        return {"unix_socket": str(self.socket), "user": ADMIN_USER, "database": self.dbname}

    def answers(self) -> bool:
        try:
            with pymysql.connect(**self.connect_kwargs(), connect_timeout=2) as conn:
                conn.ping()
        except pymysql.Error:
            return False
        return True


class MariaDBServer(ServerProcess):
    """MariaDB in `base_dir` (data/ with the binlog, run/ for the socket, mariadb.log)."""

    name: ClassVar[str] = "mariadb"

    def __init__(
        self, base_dir: Path | str, *, port: int | None = None, tls: ServerTLS | None = None
    ) -> None:
        super().__init__(base_dir, port=port)
        self.tls = tls
        self.mariadbd = _binary("mariadbd")
        self.install_db = _binary("mariadb-install-db")
        self.data_dir = self.base_dir / "data"
        self.socket = self.base_dir / "run" / "mariadb.sock"
        # Temporary tables' files in a directory of its own, not /tmp: servers installed at
        # once beside it saw their temporary files vanish there ("Could not remove temporary
        # table").
        self.tmp_dir = self.base_dir / "tmp"
        # Must differ from the server_id every binlog reader announces.
        self.server_id = 1000 + secrets.randbelow(1_000_000)
        # mariadbd refuses to run as root unless told to.
        self._user_option = ["--user=root"] if os.geteuid() == 0 else []

    def _initialise(self) -> None:
        if self.data_dir.exists():
            raise ServerStartError(f"{self.data_dir} already exists; remove it first")
        self.socket = socket_dir(self.socket.parent, self.socket.name) / self.socket.name
        self.tmp_dir.mkdir(parents=True, exist_ok=True)
        run_logged(
            [
                self.install_db,
                "--no-defaults",
                f"--datadir={self.data_dir}",
                f"--tmpdir={self.tmp_dir}",
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
                *self._user_option,
                *COMMON_OPTIONS,
            ],
            self.log_file,
            what="mariadb-install-db",
            cwd=self.base_dir,
        )

    def _command(self) -> list[str]:
        return [
            self.mariadbd,
            "--no-defaults",  # must come first
            f"--datadir={self.data_dir}",
            f"--tmpdir={self.tmp_dir}",
            f"--socket={self.socket}",
            f"--port={self.port}",
            f"--bind-address={LOOPBACK}",
            f"--pid-file={self.base_dir / 'mariadb.pid'}",
            *BINLOG_OPTIONS,
            f"--server-id={self.server_id}",
            "--default-time-zone=+00:00",
            *self._user_option,
            *COMMON_OPTIONS,
            *self._tls_options(),
        ]

    def _tls_options(self) -> list[str]:
        if self.tls is None:
            return []
        return [
            f"--ssl-cert={self.tls.cert_file}",
            f"--ssl-key={self.tls.key_file}",
            f"--ssl-ca={self.tls.ca_file}",
        ]

    def _admin_connect(self) -> pymysql.connections.Connection[Any]:
        return pymysql.connect(unix_socket=str(self.socket), user=ADMIN_USER, connect_timeout=2)

    def _check(self) -> None:
        with self._admin_connect() as conn, conn.cursor() as cursor:
            cursor.execute("SELECT 1")

    def _bootstrap(self) -> None:
        with self._admin_connect() as conn, conn.cursor() as cursor:
            cursor.execute(f"CREATE DATABASE `{APP_DB}`")
            self._create_app_user(cursor)
        with pymysql.connect(**self.info.connect_kwargs(), connect_timeout=5) as conn:
            conn.ping()

    def _create_app_user(self, cursor: pymysql.cursors.Cursor) -> None:
        # PyMySQL quotes the parameter on the client; the server logs no statements, and
        # sql_log_bin = 0 keeps the statement (with the password in clear) out of the binlog
        # that binlog readers and replicas read.
        cursor.execute("SET sql_log_bin = 0")
        require = " REQUIRE SSL" if self.tls is not None else ""
        cursor.execute(f"CREATE USER '{APP_USER}'@'%%' IDENTIFIED BY %s{require}", (self.password,))
        cursor.execute(f"GRANT ALL ON `{APP_DB}`.* TO '{APP_USER}'@'%'")
        cursor.execute(f"GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO '{APP_USER}'@'%'")

    @property
    def info(self) -> MariaDBInfo:
        return MariaDBInfo(
            host=LOOPBACK,
            port=self.port,
            user=APP_USER,
            password=self.password,
            dbname=APP_DB,
            socket=self.socket,
            server_id=self.server_id,
            data_dir=self.data_dir,
            log_file=self.log_file,
            server=self,
        )
