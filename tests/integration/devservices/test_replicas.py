"""Replicas beside the primaries: a write on the primary reaches the replica, a paused replica
applies nothing until resumed, the wait helper returns once a position is applied and times out
with a clear error while paused. The same tests run on the PostgreSQL standby and the MariaDB
replica through the calls they share (`devservices.replica.Replica`)."""

from __future__ import annotations

import dataclasses
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pymysql
import pytest

from airflow_provider_dblog.devservices.mariadb import MariaDBInfo, MariaDBServer
from airflow_provider_dblog.devservices.mariadb_replica import MariaDBReplica, MariaDBReplicaInfo
from airflow_provider_dblog.devservices.pg_replica import PostgresReplica, PostgresReplicaInfo
from airflow_provider_dblog.devservices.postgres import PostgresInfo, PostgresServer
from airflow_provider_dblog.devservices.replica import Replica, ReplicaBehind, ReplicationBroken
from tests.installed import installed
from tests.pg_helpers import wait_for

pytestmark = pytest.mark.integration

#: Generous: the replica is on the same host, but CI machines are loaded.
DEADLINE = 120.0


@dataclasses.dataclass(frozen=True)
class Pair:
    """A primary and its replica, driven the same way whatever the database."""

    replica: Replica
    write: Callable[[str], None]  # on the primary, as dblog
    rows: Callable[[str], list[tuple[Any, ...]]]  # on the replica, as dblog
    received: Callable[[str], bool]  # the replica holds `position`, applied or not


def pg_pair(primary: PostgresInfo, replica: PostgresReplicaInfo) -> Pair:
    def write(statement: str) -> None:
        with psycopg.connect(primary.dsn, autocommit=True) as conn:
            conn.execute(statement.encode())

    def rows(query: str) -> list[tuple[Any, ...]]:
        with psycopg.connect(replica.dsn, autocommit=True) as conn:
            return conn.execute(query.encode()).fetchall()

    def received(position: str) -> bool:
        with psycopg.connect(replica.admin_dsn, autocommit=True) as conn:
            row = conn.execute(
                "SELECT pg_last_wal_receive_lsn() >= %s::pg_lsn", (position,)
            ).fetchone()
        return row is not None and row[0] is True

    return Pair(replica, write, rows, received)


def gtid_seq_nos(position: str) -> dict[str, int]:
    """'0-1234-17,1-1234-3' as {domain: seq_no}."""
    return {
        gtid.split("-")[0]: int(gtid.split("-")[2]) for gtid in position.split(",") if gtid.strip()
    }


def mariadb_pair(primary: MariaDBInfo, replica: MariaDBReplicaInfo) -> Pair:
    def write(statement: str) -> None:
        with (
            pymysql.connect(**primary.connect_kwargs(), autocommit=True) as conn,
            conn.cursor() as cursor,
        ):
            cursor.execute(statement)

    def rows(query: str) -> list[tuple[Any, ...]]:
        with pymysql.connect(**replica.connect_kwargs()) as conn, conn.cursor() as cursor:
            cursor.execute(query)
            return list(cursor.fetchall())

    def received(position: str) -> bool:
        have = gtid_seq_nos(replica.slave_status().get("Gtid_IO_Pos") or "")
        return all(have.get(domain, -1) >= seq for domain, seq in gtid_seq_nos(position).items())

    return Pair(replica, write, rows, received)


@pytest.fixture(params=["pg15", "mariadb"])
def pair(request: pytest.FixtureRequest) -> Pair:
    """Each replica in turn (the session's `pg15_replica` and `mariadb_replica`)."""
    primary = request.getfixturevalue(request.param)
    replica = request.getfixturevalue(f"{request.param}_replica")
    make = pg_pair if request.param == "pg15" else mariadb_pair
    return make(primary, replica)


def new_table(pair: Pair) -> str:
    table = f"replica_check_{secrets.token_hex(4)}"
    pair.write(f"CREATE TABLE {table} (id int PRIMARY KEY)")
    return table


def test_a_row_written_on_the_primary_appears_on_the_replica(pair: Pair) -> None:
    table = new_table(pair)
    pair.write(f"INSERT INTO {table} VALUES (1)")
    began = time.monotonic()
    pair.replica.wait_caught_up(DEADLINE)
    print(f"caught up in {time.monotonic() - began:.3f}s")
    assert pair.rows(f"SELECT id FROM {table}") == [(1,)]
    assert not pair.replica.replay_paused()


def test_a_paused_replica_applies_a_write_only_once_resumed(pair: Pair) -> None:
    table = new_table(pair)
    pair.write(f"INSERT INTO {table} VALUES (1)")
    pair.replica.wait_caught_up(DEADLINE)
    pair.replica.pause_replay()
    try:
        assert pair.replica.replay_paused()
        pair.write(f"INSERT INTO {table} VALUES (2)")
        position = pair.replica.primary_position()
        # Received but not applied: the replica is behind because it is paused, not slow.
        wait_for(lambda: pair.received(position), DEADLINE, f"{position} received")
        assert pair.rows(f"SELECT id FROM {table} ORDER BY id") == [(1,)]
    finally:
        pair.replica.resume_replay()
    assert not pair.replica.replay_paused()
    pair.replica.wait_replayed(position, DEADLINE)
    assert pair.rows(f"SELECT id FROM {table} ORDER BY id") == [(1,), (2,)]


def test_wait_replayed_returns_once_applied_and_times_out_while_paused(pair: Pair) -> None:
    table = new_table(pair)
    pair.replica.wait_caught_up(DEADLINE)
    done = pair.replica.primary_position()
    pair.replica.wait_replayed(done, DEADLINE)  # applied already

    pair.replica.pause_replay()
    try:
        pair.write(f"INSERT INTO {table} VALUES (1)")
        position = pair.replica.primary_position()
        wait_for(lambda: pair.received(position), DEADLINE, f"{position} received")
        began = time.monotonic()
        with pytest.raises(ReplicaBehind) as raised:
            pair.replica.wait_replayed(position, timeout=2)
        waited = time.monotonic() - began
    finally:
        pair.replica.resume_replay()
    message = str(raised.value)
    print(message)
    assert 2 <= waited < 30
    assert f"not {position}, within 2s" in message
    assert "paused" in message and "resume_replay()" in message
    pair.replica.wait_replayed(position, DEADLINE)
    assert pair.rows(f"SELECT id FROM {table}") == [(1,)]


# --- PostgreSQL ------------------------------------------------------------------------------


def test_postgres_replica_is_a_read_only_copy_reached_as_the_primary(
    pg15: PostgresInfo, pg15_replica: PostgresReplicaInfo
) -> None:
    assert pg15_replica.port != pg15.port
    assert (pg15_replica.user, pg15_replica.password) == (pg15.user, pg15.password)
    with psycopg.connect(pg15_replica.dsn, autocommit=True) as conn:
        assert conn.execute("SELECT pg_is_in_recovery()").fetchone() == (True,)
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
            conn.execute("CREATE TABLE nope (id int)")
    with psycopg.connect(pg15.admin_dsn) as conn:
        row = conn.execute(
            "SELECT r.state, s.slot_type FROM pg_stat_replication r"
            " JOIN pg_replication_slots s ON s.active_pid = r.pid WHERE s.slot_name = %s",
            (pg15_replica.slot_name,),
        ).fetchone()
    assert row == ("streaming", "physical")
    assert pg15.password not in pg15_replica.log_file.read_text(errors="replace")


def test_postgres_replica_follows_restarts_and_drops_its_slot(tmp_path: Path) -> None:
    def slots(primary: PostgresServer) -> list[tuple[Any, ...]]:
        with psycopg.connect(primary.info.admin_dsn) as conn:
            return conn.execute("SELECT slot_name, slot_type FROM pg_replication_slots").fetchall()

    with installed(lambda: PostgresServer(tmp_path / "primary")) as primary:
        with PostgresReplica(primary, tmp_path / "replica") as replica:
            print(f"standby first start (pg_basebackup included): {replica.start_seconds:.2f}s")
            assert slots(primary) == [(replica.slot_name, "physical")]
            pair = pg_pair(primary.info, replica.info)
            table = new_table(pair)
            replica.restart()
            pair.write(f"INSERT INTO {table} VALUES (1)")
            replica.info.wait_caught_up(DEADLINE)
            primary.restart()
            pair.write(f"INSERT INTO {table} VALUES (2)")
            replica.info.wait_caught_up(DEADLINE)
            assert pair.rows(f"SELECT id FROM {table} ORDER BY id") == [(1,), (2,)]
        # The standby stopped, then its slot went: the primary holds no WAL back for it.
        assert slots(primary) == []
    assert primary.password not in replica.log_file.read_text(errors="replace")


# --- MariaDB ---------------------------------------------------------------------------------


def binlog_files(info: MariaDBInfo) -> list[Path]:
    return sorted(
        path
        for path in info.data_dir.iterdir()
        if path.name.startswith(("binlog.", "relay.")) and path.suffix != ".index"
    )


def test_mariadb_replica_is_a_read_only_copy_reached_as_the_primary(
    mariadb: MariaDBInfo, mariadb_replica: MariaDBReplicaInfo
) -> None:
    assert mariadb_replica.port != mariadb.port
    assert mariadb_replica.server_id != mariadb.server_id
    assert (mariadb_replica.user, mariadb_replica.password) == (mariadb.user, mariadb.password)
    with pymysql.connect(**mariadb_replica.connect_kwargs()) as conn, conn.cursor() as cursor:
        cursor.execute("SELECT @@read_only")
        assert cursor.fetchone() == (1,)
        with pytest.raises(pymysql.err.OperationalError, match="read-only"):
            cursor.execute("CREATE TABLE nope (id int)")
    status = mariadb_replica.slave_status()
    assert (status["Slave_IO_Running"], status["Slave_SQL_Running"]) == ("Yes", "Yes")
    assert status["Using_Gtid"] == "Slave_Pos"
    # Not in a server log, nor in a binlog or relay log (which replicas and readers read).
    assert mariadb.password not in mariadb_replica.log_file.read_text(errors="replace")
    for path in [*binlog_files(mariadb), *binlog_files(mariadb_replica)]:
        assert mariadb.password.encode() not in path.read_bytes(), path


def test_mariadb_replica_seeds_from_a_purged_binlog_and_fails_fast_when_broken(
    tmp_path: Path,
) -> None:
    """Seeded from a dump, the replica starts even when the primary's first binlog is gone (the
    session's primary has its binlog purged by other tests). A replication error ends the wait
    at once with the error, instead of at the deadline."""
    with installed(lambda: MariaDBServer(tmp_path / "primary")) as primary:
        table = f"replica_check_{secrets.token_hex(4)}"
        with pymysql.connect(**primary.info.connect_kwargs(), autocommit=True) as conn:
            conn.cursor().execute(f"CREATE TABLE {table} (id int PRIMARY KEY)")
            conn.cursor().execute(f"INSERT INTO {table} VALUES (1)")
        with pymysql.connect(**primary.info.admin_connect_kwargs()) as conn:
            cursor = conn.cursor()
            cursor.execute("FLUSH BINARY LOGS")
            cursor.execute("SHOW MASTER STATUS")
            current = cursor.fetchone()
            assert current is not None

            def purged() -> bool:
                """MariaDB keeps a binlog until its transactions are checkpointed."""
                cursor.execute(f"PURGE BINARY LOGS TO '{current[0]}'")
                cursor.execute("SHOW BINARY LOGS")
                return [row[0] for row in cursor.fetchall()] == [current[0]]

            wait_for(purged, DEADLINE, "the first binlog purged")

        with MariaDBReplica(primary, tmp_path / "replica") as replica:
            print(
                f"replica first start (install-db and seed included): {replica.start_seconds:.2f}s"
            )
            pair = mariadb_pair(primary.info, replica.info)
            assert pair.rows(f"SELECT id FROM {table}") == [(1,)]
            replica.restart()
            pair.write(f"INSERT INTO {table} VALUES (2)")
            replica.info.wait_caught_up(DEADLINE)
            assert pair.rows(f"SELECT id FROM {table} ORDER BY id") == [(1,), (2,)]

            # A row only the replica has (root may write despite read_only), then the same key
            # on the primary: the SQL thread stops on a duplicate key.
            with pymysql.connect(**replica.info.admin_connect_kwargs()) as conn:
                conn.cursor().execute("SET sql_log_bin = 0")
                conn.cursor().execute(f"INSERT INTO {table} VALUES (3)")
                conn.commit()
            pair.write(f"INSERT INTO {table} VALUES (3)")
            began = time.monotonic()
            with pytest.raises(ReplicationBroken, match="Duplicate entry"):
                replica.info.wait_caught_up(DEADLINE)
            assert time.monotonic() - began < DEADLINE / 2
