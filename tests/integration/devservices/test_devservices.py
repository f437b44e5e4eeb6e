"""The real-server harness: each server starts, answers as a DBLog source needs, survives
restarts and crashes with its data, frees its port on stop; `dblog dev-services` works."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import psycopg
import pymysql
import pytest
import redis

from airflow_provider_dblog.devservices import stack
from airflow_provider_dblog.devservices.mariadb import MariaDBInfo, MariaDBServer
from airflow_provider_dblog.devservices.postgres import PostgresInfo
from airflow_provider_dblog.devservices.process import (
    ServerProcess,
    ServerStartError,
    port_is_free,
)
from airflow_provider_dblog.devservices.redis import RedisInfo, RedisServer
from tests.installed import installed
from tests.pg_helpers import wait_for

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[3]


def assert_port_released(port: int) -> None:
    assert port_is_free(port), f"port {port} still bound after stop"
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()


def assert_password_not_logged(server: ServerProcess) -> None:
    assert server.password not in server.log_file.read_text(errors="replace")


# --- PostgreSQL ----------------------------------------------------------------------------


def test_postgres_is_a_logical_decoding_source(postgres: PostgresInfo) -> None:
    assert postgres.major == {"pg15": 15, "pg18": 18}[postgres.flavour]
    with psycopg.connect(postgres.dsn) as conn:
        assert conn.execute("SHOW wal_level").fetchone() == ("logical",)
        assert conn.execute("SHOW max_replication_slots").fetchone() == ("10",)
        role = conn.execute(
            "SELECT rolreplication, rolsuper FROM pg_roles WHERE rolname = current_user"
        ).fetchone()
        assert role == (True, False)
        assert conn.info.server_version // 10000 == postgres.major
    # Replication connections over TCP with the password (pg_hba), and pgoutput is there.
    with psycopg.connect(postgres.dsn, replication="database", autocommit=True) as conn:
        system = conn.execute("IDENTIFY_SYSTEM").fetchone()
        assert system is not None and system[3] == postgres.dbname
    with psycopg.connect(postgres.admin_dsn, autocommit=True) as conn:
        slot = "devservices_check"
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))


@pytest.mark.parametrize("flavour", ["pg15", "pg18"])
def test_postgres_restart_crash_and_stop(flavour: str, tmp_path: Path) -> None:
    server = installed(lambda: stack.make_postgres(flavour, tmp_path / "pg"))
    with server:
        info = server.info
        print(f"{flavour} first start (initdb included): {server.start_seconds:.2f}s")
        with psycopg.connect(info.dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
            conn.execute("INSERT INTO t VALUES (1)")

        server.restart()
        print(f"{flavour} restart: {server.start_seconds:.2f}s")
        assert server.info.port == info.port
        info.kill()  # a crash: SIGKILL to the postmaster and every backend
        assert not info.answers()
        info.start()
        print(f"{flavour} start after crash: {server.start_seconds:.2f}s")
        with psycopg.connect(info.dsn) as conn:
            assert conn.execute("SELECT id FROM t").fetchall() == [(1,)]
    assert not info.answers()
    assert_port_released(info.port)
    assert_password_not_logged(server)


# --- MariaDB -------------------------------------------------------------------------------


def test_mariadb_is_a_row_binlog_source(mariadb: MariaDBInfo) -> None:
    with pymysql.connect(**mariadb.connect_kwargs()) as conn, conn.cursor() as cursor:
        cursor.execute("SELECT @@log_bin, @@binlog_format, @@binlog_row_image")
        assert cursor.fetchone() == (1, "ROW", "FULL")
        cursor.execute("SELECT @@binlog_row_metadata, @@server_id")
        assert cursor.fetchone() == ("FULL", mariadb.server_id)
        cursor.execute("SHOW MASTER STATUS")  # needs REPLICATION CLIENT (BINLOG MONITOR)
        assert cursor.fetchone() is not None
        cursor.execute("CREATE TABLE devservices_check (id int PRIMARY KEY)")
        cursor.execute("DROP TABLE devservices_check")
    with pymysql.connect(**mariadb.admin_connect_kwargs()) as conn, conn.cursor() as cursor:
        cursor.execute("SELECT CURRENT_USER()")
        assert cursor.fetchone() == ("root@localhost",)


def test_mariadb_restart_crash_and_stop(tmp_path: Path) -> None:
    with MariaDBServer(tmp_path / "mariadb") as server:
        info = server.info
        print(f"mariadb first start (install-db included): {server.start_seconds:.2f}s")
        with pymysql.connect(**info.connect_kwargs(), autocommit=True) as conn:
            conn.cursor().execute("CREATE TABLE t (id int PRIMARY KEY)")
            conn.cursor().execute("INSERT INTO t VALUES (1)")
        server.restart()
        print(f"mariadb restart: {server.start_seconds:.2f}s")
        info.kill()
        assert not info.answers()
        info.start()
        with pymysql.connect(**info.connect_kwargs()) as conn, conn.cursor() as cursor:
            cursor.execute("SELECT id FROM t")
            assert cursor.fetchall() == ((1,),)
    assert not info.answers()
    assert_port_released(info.port)
    assert_password_not_logged(server)


# --- Redis ---------------------------------------------------------------------------------


def test_redis_is_a_durable_state_store(redis_server: RedisInfo) -> None:
    with redis_server.client() as client:
        assert client.ping()
        assert client.config_get("appendonly") == {"appendonly": "yes"}
        assert client.config_get("appendfsync") == {"appendfsync": "everysec"}
    with (
        redis.Redis(host=redis_server.host, port=redis_server.port, retry=None) as anonymous,
        pytest.raises(redis.RedisError, match=r"(?i)auth"),
    ):
        anonymous.ping()


def aof_holds(data_dir: Path, data: bytes) -> bool:
    """Some file of the AOF (Redis 7: appendonlydir/, a base and increments) holds `data`."""
    return any(data in part.read_bytes() for part in (data_dir / "appendonlydir").glob("*.aof"))


def test_redis_keeps_data_across_restart_and_crash(tmp_path: Path) -> None:
    with RedisServer(tmp_path / "redis") as server:
        info = server.info
        print(f"redis first start: {server.start_seconds:.2f}s")
        with info.client() as client:
            client.set("before-restart", "1")
        server.restart()
        with info.client() as client:
            assert client.get("before-restart") == b"1"
            client.set("before-crash", "1")
        # A crash (SIGKILL) keeps what Redis wrote to the AOF (the page cache survives the
        # process); everysec may hold a write back for up to 2 s while an fsync runs.
        wait_for(lambda: aof_holds(server.data_dir, b"before-crash"), 60, "the write in the AOF")
        info.kill()
        info.start()
        with info.client() as client:
            assert client.mget("before-restart", "before-crash") == [b"1", b"1"]
    assert not info.answers()
    assert_port_released(info.port)
    assert_password_not_logged(server)


def test_start_failure_says_why(tmp_path: Path) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        server = RedisServer(tmp_path / "redis", port=port)
        with pytest.raises(ServerStartError, match="already in use"):
            server.start()
    assert not server.running


# --- dblog dev-services ----------------------------------------------------------------------


def dblog(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run the `dblog` command line in a fresh interpreter."""
    code = "import sys; from airflow_provider_dblog.cli import main; sys.exit(main(sys.argv[1:]))"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def test_cli_up_status_down(tmp_path: Path) -> None:
    state_dir = tmp_path / "services"
    up = dblog("dev-services", "up", "--dir", str(state_dir), cwd=tmp_path)
    assert up.returncode == 0, up.stdout + up.stderr
    print(up.stdout)
    try:
        running = stack.load(state_dir)
        assert running is not None
        state_file = state_dir / stack.STATE_FILE
        assert stat.S_IMODE(state_file.stat().st_mode) == 0o600
        passwords = [s["info"]["password"] for s in json.loads(state_file.read_text()).values()]
        for password in passwords:
            assert password not in up.stdout + up.stderr
        assert running.postgres.redacted_dsn in up.stdout
        # The servers outlived the command that started them.
        assert all(info.answers() for info in running.services().values())

        status = dblog("dev-services", "status", "--dir", str(state_dir), cwd=tmp_path)
        assert status.returncode == 0, status.stdout + status.stderr
        assert status.stdout.count(" up") == 3
    finally:
        down = dblog("dev-services", "down", "--dir", str(state_dir), cwd=tmp_path)
    assert down.returncode == 0, down.stdout + down.stderr
    assert "postgres, mariadb, redis" in down.stdout
    for info in (running.postgres, running.mariadb, running.redis):
        assert not info.answers()
        assert_port_released(info.port)
    after = dblog("dev-services", "status", "--dir", str(state_dir), cwd=tmp_path)
    assert after.returncode == 1
