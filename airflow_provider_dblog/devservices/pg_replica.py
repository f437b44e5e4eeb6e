"""A hot standby of a running `PostgresServer`, streaming from it, for tests that read a replica.

`pg_basebackup` (from the primary's own bin dir) copies the primary into a new data directory
and creates a physical replication slot on it; the copy starts as its own server on its own port
in standby mode. The slot makes the primary keep every WAL segment the standby has not received,
so a standby that falls behind on a loaded machine catches up instead of failing; `__exit__`
drops it (`drop_slot()`), or the primary would hold WAL back for a replica that is gone.

The standby streams over the primary's private Unix socket as the superuser, which pg_hba
trusts there: no password is written anywhere for it. It is read-only and has the primary's
roles, so the `dblog` role logs in with the primary's password.
"""

from __future__ import annotations

import contextlib
import dataclasses
import secrets
from pathlib import Path
from types import TracebackType
from typing import ClassVar, Self

import psycopg
from psycopg.conninfo import make_conninfo

from airflow_provider_dblog.devservices.postgres import SUPERUSER, PostgresInfo, PostgresServer
from airflow_provider_dblog.devservices.process import ServerStartError, run_logged, socket_dir
from airflow_provider_dblog.devservices.replica import (
    DEFAULT_TIMEOUT,
    ReplicaBehind,
    poll,
)

STANDBY_SETTINGS = {
    "hot_standby": "on",
    # Tell the primary which rows the standby's queries still see, so its VACUUM keeps them
    # and a long chunk read on the standby is not cancelled by a replay conflict.
    "hot_standby_feedback": "on",
    # Reconnect to a restarted primary after 1 s, not the default 5 s.
    "wal_retrieve_retry_interval": "'1s'",
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class PostgresReplicaInfo(PostgresInfo):
    """A running standby: connect as with any `PostgresInfo`, and drive its replay (see
    `devservices.replica` for the calls it shares with the MariaDB replica)."""

    primary_port: int
    primary_socket_dir: Path
    slot_name: str

    @property
    def primary_admin_dsn(self) -> str:
        return (
            f"host={self.primary_socket_dir} port={self.primary_port}"
            f" user={SUPERUSER} dbname={self.dbname}"
        )

    def _admin(self) -> psycopg.Connection[tuple[object, ...]]:
        return psycopg.connect(self.admin_dsn, autocommit=True, connect_timeout=5)

    def _one(self, dsn: str, query: str, params: tuple[object, ...] = ()) -> object:
        with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as conn:
            row = conn.execute(query, params).fetchone()
        assert row is not None
        return row[0]

    def primary_position(self) -> str:
        """The primary's current WAL write position (pg_current_wal_lsn)."""
        return str(self._one(self.primary_admin_dsn, "SELECT pg_current_wal_lsn()::text"))

    def position(self) -> str:
        """The end of the last WAL record the standby replayed (pg_last_wal_replay_lsn)."""
        return str(self._one(self.admin_dsn, "SELECT pg_last_wal_replay_lsn()::text"))

    def replay_paused(self) -> bool:
        """True once a pause is requested (the standby applies nothing more until resumed)."""
        return bool(self._one(self.admin_dsn, "SELECT pg_is_wal_replay_paused()"))

    def pause_replay(self) -> None:
        """Stop applying WAL (it is still received); returns once replay has paused."""
        with self._admin() as conn:
            conn.execute("SELECT pg_wal_replay_pause()")

            def paused() -> bool:
                row = conn.execute("SELECT pg_get_wal_replay_pause_state()").fetchone()
                return row is not None and row[0] == "paused"

            if not poll(paused, DEFAULT_TIMEOUT):
                raise RuntimeError(
                    f"standby on port {self.port} did not pause replay within "
                    f"{DEFAULT_TIMEOUT:.0f}s; log {self.log_file}"
                )

    def resume_replay(self) -> None:
        with self._admin() as conn:
            conn.execute("SELECT pg_wal_replay_resume()")

    def wait_replayed(self, position: str, timeout: float = DEFAULT_TIMEOUT) -> None:
        """Return once the standby has replayed the WAL up to LSN `position`; `ReplicaBehind`
        after `timeout` seconds."""
        with self._admin() as conn:

            def replayed() -> bool:
                row = conn.execute(
                    "SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (position,)
                ).fetchone()
                return row is not None and row[0] is True

            if poll(replayed, timeout):
                return
            row = conn.execute(
                "SELECT pg_last_wal_replay_lsn()::text, pg_last_wal_receive_lsn()::text,"
                " pg_get_wal_replay_pause_state(),"
                " (SELECT status FROM pg_stat_wal_receiver)"
            ).fetchone()
        assert row is not None
        replayed_to, received_to, pause_state, receiver = row
        why = (
            "replay is paused: call resume_replay()"
            if pause_state != "not paused"
            else f"received up to {received_to}, WAL receiver {receiver or 'not running'}"
        )
        raise ReplicaBehind(
            f"standby on port {self.port} replayed WAL up to {replayed_to}, not {position}, "
            f"within {timeout:.0f}s: {why}; log {self.log_file}"
        )

    def wait_caught_up(self, timeout: float = DEFAULT_TIMEOUT) -> None:
        """Wait until the standby has replayed everything the primary had written when called."""
        self.wait_replayed(self.primary_position(), timeout)


class PostgresReplica(PostgresServer):
    """A hot standby of `primary` (which must be running) in `base_dir`."""

    name: ClassVar[str] = "postgres-replica"

    def __init__(
        self,
        primary: PostgresServer,
        base_dir: Path | str,
        *,
        slot_name: str | None = None,
        port: int | None = None,
    ) -> None:
        super().__init__(base_dir, bin_dir=primary.bin_dir, flavour=primary.flavour, port=port)
        self.primary = primary
        self.password = primary.password  # the roles are the primary's
        self.slot_name = slot_name or f"devservices_replica_{secrets.token_hex(4)}"

    @property
    def label(self) -> str:
        return f"postgres {self.flavour} replica"

    def _primary_conninfo(self) -> str:
        return make_conninfo(
            host=str(self.primary.socket_dir),
            port=str(self.primary.port),
            user=SUPERUSER,
            application_name=self.slot_name,
        )

    def _initialise(self) -> None:
        if not self.primary.running:
            raise ServerStartError(f"{self.primary.label} is not running: start it first")
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
                self.bin_dir / "pg_basebackup",
                "--pgdata", self.data_dir,
                "--dbname", self._primary_conninfo(),
                "--wal-method", "stream",
                "--create-slot",
                "--slot", self.slot_name,
                "--checkpoint", "fast",  # do not wait for the next scheduled checkpoint
                "--no-sync",
                "--no-password",
            ],
            self.log_file,
            what="pg_basebackup",
            cwd=self.base_dir,
            **self.run_as.popen_kwargs(),
        )  # fmt: skip
        settings = {
            **STANDBY_SETTINGS,
            "primary_conninfo": _quote(self._primary_conninfo()),
            "primary_slot_name": _quote(self.slot_name),
        }
        with (self.data_dir / "postgresql.conf").open("a") as conf:
            conf.write("\n# --- airflow_provider_dblog.devservices replica ---\n")
            conf.writelines(f"{name} = {value}\n" for name, value in settings.items())
        signal_file = self.data_dir / "standby.signal"
        signal_file.touch()
        self.run_as.own(signal_file)

    def _bootstrap(self) -> None:
        """Nothing to create (the standby is read-only): check that the `dblog` role logs in and
        that WAL streams from the primary."""
        with psycopg.connect(self.info.dsn, connect_timeout=5) as conn:
            conn.execute("SELECT 1")
        with self._admin_connect() as conn:

            def streaming() -> bool:
                row = conn.execute("SELECT status FROM pg_stat_wal_receiver").fetchone()
                return row is not None and row[0] == "streaming"

            if not poll(streaming, self.start_timeout):
                raise ServerStartError(
                    f"{self.label} does not stream from {self.primary.label}; log {self.log_file}"
                )

    @property
    def info(self) -> PostgresReplicaInfo:
        primary = super().info
        fields = {f.name: getattr(primary, f.name) for f in dataclasses.fields(PostgresInfo)}
        return PostgresReplicaInfo(
            **fields,
            primary_port=self.primary.port,
            primary_socket_dir=self.primary.socket_dir,
            slot_name=self.slot_name,
        )

    def drop_slot(self) -> None:
        """Drop the standby's slot on the primary, once its WAL sender has let go of it (the
        standby must be stopped). No-op if the primary is not running."""
        if not self.primary.running:
            return
        with psycopg.connect(self.primary.info.admin_dsn, autocommit=True) as conn:

            def released() -> bool:
                row = conn.execute(
                    "SELECT active FROM pg_replication_slots WHERE slot_name = %s",
                    (self.slot_name,),
                ).fetchone()
                return row is None or not row[0]

            if not poll(released, DEFAULT_TIMEOUT):
                raise RuntimeError(f"slot {self.slot_name} is still in use on the primary")
            conn.execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
                " WHERE slot_name = %s",
                (self.slot_name,),
            )

    def __enter__(self) -> Self:
        try:
            return self.start()
        except BaseException:
            self.kill()
            with contextlib.suppress(Exception):  # the start's error is the one to report
                self.drop_slot()
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
        self.drop_slot()


def _quote(value: str) -> str:
    """A string value for postgresql.conf."""
    return "'" + value.replace("\\", "\\\\").replace("'", "''") + "'"
