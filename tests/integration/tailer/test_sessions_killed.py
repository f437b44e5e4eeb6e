"""`dblog tail` and `dblog dump` of a MariaDB source ride through an administrator's
`KILL CONNECTION` of every connection of theirs, again and again, while another process writes:
the two log in as a user of their own, so the loop kills their connections only (the binlog
dump thread included), never the writer's. Each kill is an outage (a warning naming the cause,
then a reconnection), never a traceback; the dump ends done and the NDJSON stream, replayed,
equals the source. (tests/integration/tailer/test_sessions_ended.py is the same on PostgreSQL.)"""

from __future__ import annotations

import os
import random
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pymysql
import pytest

from airflow_provider_dblog.devservices.mariadb import MariaDBInfo
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.outputs import read_events
from airflow_provider_dblog.state import StateStore
from tests.integration.e2e_support import (
    DBLOG,
    MysqlDatabases,
    TailProcess,
    Writer,
    cli_env,
    drop_databases,
    make_mysql_databases,
    materialize,
    source_state,
    state_differences,
    wait_caught_up,
    wait_until,
    write_config,
)

pytestmark = pytest.mark.integration
ROUNDS = 12
KILLED_PASSWORD_ENV = "E2E_KILLED_PASSWORD"
BINLOG_DUMP = "Binlog Dump"
"""The PROCESSLIST command of a connection that streams the binlog to a reader."""


@pytest.fixture
def dbs(mariadb: MariaDBInfo) -> Iterator[MysqlDatabases]:
    databases = make_mysql_databases(mariadb, 300, seed_value=random.randrange(1 << 30))
    yield databases
    drop_databases(databases)


@pytest.fixture
def dblog_user(dbs: MysqlDatabases) -> Iterator[str]:
    """A user for the tailer and the dump only, with the grants a source needs."""
    user = f"killed_{secrets.token_hex(4)}"
    password = secrets.token_hex(12)
    os.environ[KILLED_PASSWORD_ENV] = password
    dbs.admin(
        f"CREATE USER '{user}'@'%' IDENTIFIED BY '{password}'",
        f"GRANT ALL ON `{dbs.source_db}`.* TO '{user}'@'%'",
        f"GRANT ALL ON `{dbs.watermark_db}`.* TO '{user}'@'%'",
        f"GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO '{user}'@'%'",
    )
    yield user
    dbs.admin(f"DROP USER IF EXISTS '{user}'@'%'")


def kill_all(admin: pymysql.cursors.Cursor, user: str) -> dict[int, str]:
    """KILL CONNECTION every connection of `user`: their ids and commands."""
    admin.execute("SELECT ID, COMMAND FROM information_schema.PROCESSLIST WHERE USER = %s", (user,))
    killed = {}
    for connection_id, command in admin.fetchall():
        try:
            admin.execute(f"KILL CONNECTION {int(connection_id)}")
        except pymysql.err.OperationalError as exc:
            if exc.args[0] != 1094:  # unknown thread: it closed on its own meanwhile
                raise
            continue
        killed[int(connection_id)] = str(command)
    return killed


def test_tailer_and_dump_ride_through_their_connections_killed_in_a_loop(
    dbs: MysqlDatabases, dblog_user: str, redis_server: RedisInfo, tmp_path: Path
) -> None:
    store = StateStore(redis_server.client(), dbs.config.name)
    events_dir = tmp_path / "events"
    i = dbs.info
    config = write_config(
        tmp_path / "dblog.toml",
        dbs,
        redis_server,
        {"type": "ndjson", "directory": str(events_dir)},
        {"heartbeat_s": 0.2, "reconnect_max_s": 1, "window_ttl_s": 10},
        password_env=KILLED_PASSWORD_ENV,
        source=[
            'type = "mysql"',
            f'dsn = "mysql://{dblog_user}@{i.host}:{i.port}/{dbs.source_db}"',
            f'watermark_database = "{dbs.watermark_db}"',
        ],
    )
    env = cli_env(dbs, redis_server)
    tail_log, dump_log = tmp_path / "tail.log", tmp_path / "dump.log"
    tail = TailProcess(config, "tailer", env, tail_log)
    writer: Writer | None = None
    killed: dict[int, str] = {}
    """Each connection killed: its id and command."""
    try:
        wait_until(lambda: store.tailer.health() is not None, 60, "the tailer's first heartbeat")
        writer = Writer(dbs, tmp_path, seed_value=random.randrange(1000))
        writer.wait_for(20, timeout_s=60)
        with dump_log.open("wb") as out:
            dump = subprocess.Popen(
                [DBLOG, "dump", "-c", str(config), "--dump-id", "killed",
                 "--chunk-size", "20", "--source-patience", "300", "--window-timeout", "10"],
                stdout=subprocess.DEVNULL,
                stderr=out,
                env=env,
            )  # fmt: skip
            try:

                def dump_reading() -> bool:
                    assert dump.poll() is None, dump_log.read_text()[-3000:]
                    status = store.dumps.status("killed")
                    return status is not None and status.chunks >= 1

                wait_until(dump_reading, 120, "the dump completing its first chunk")
                with (
                    pymysql.connect(**i.admin_connect_kwargs(), autocommit=True) as conn,
                    conn.cursor() as admin,
                ):

                    def streaming_again() -> bool:
                        """A binlog dump thread of the tailer's that was not killed yet."""
                        assert tail.alive(), tail_log.read_text()[-3000:]
                        admin.execute(
                            "SELECT ID FROM information_schema.PROCESSLIST"
                            " WHERE USER = %s AND COMMAND = %s",
                            (dblog_user, BINLOG_DUMP),
                        )
                        return any(int(cid) not in killed for (cid,) in admin.fetchall())

                    # A stream seen may end on its own before the round kills it (the tailer
                    # starts its stream again when its catalog connection is lost), so rounds
                    # go on until ROUNDS binlog dump threads were killed by one.
                    for _ in range(3 * ROUNDS):
                        if list(killed.values()).count(BINLOG_DUMP) >= ROUNDS:
                            break
                        wait_until(streaming_again, 120, "the tailer streaming again")
                        killed.update(kill_all(admin, dblog_user))
                assert dump.wait(600) == 0, dump_log.read_text()[-3000:]
            finally:
                if dump.poll() is None:
                    dump.kill()
                    dump.wait()
        writer.stop()
        wait_caught_up(dbs, timeout_s=120, store=store)
        assert tail.stop() == 0, tail_log.read_text()[-3000:]
    finally:
        if writer is not None:
            writer.kill()
        if tail.alive():
            tail.kill()

    # ROUNDS binlog streams were killed, and the dump's and the catalog's connections besides.
    commands = list(killed.values())
    assert commands.count(BINLOG_DUMP) >= ROUNDS, killed
    assert len(commands) - commands.count(BINLOG_DUMP) >= ROUNDS, killed
    logs = tail_log.read_text() + dump_log.read_text()
    assert "Traceback" not in logs, logs[-5000:]
    assert "source unavailable" in logs, logs[-5000:]
    assert "Connection was killed" in logs or "Lost connection" in logs, logs[-5000:]
    status = store.dumps.status("killed")
    assert status is not None and status.state == "done", status
    events = list(read_events(events_dir))
    assert state_differences(source_state(dbs.source), materialize(events)) == []
