"""`dblog tail` and `dblog dump` ride through the server ending their sessions, again and again,
while another process writes: every backend of the two (found by their application_name) is
ended with `pg_terminate_backend` in a loop, the walsender included, as an administrator or a
failover does. Each is an outage (a warning naming the cause, then a reconnection), never a
traceback; the dump ends done and the NDJSON stream, replayed, equals the source."""

from __future__ import annotations

import random
import subprocess
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from airflow_provider_dblog.devservices.postgres import PostgresInfo
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.outputs import read_events
from airflow_provider_dblog.state import StateStore
from tests.integration.e2e_support import (
    DBLOG,
    Databases,
    TailProcess,
    Writer,
    cli_env,
    drop_databases,
    make_databases,
    materialize,
    source_state,
    state_differences,
    wait_caught_up,
    wait_until,
    write_config,
)

pytestmark = pytest.mark.integration
APPLICATION = "dblog_sessions_ended"
ROUNDS = 12
TERMINATE = (
    "SELECT pid, backend_type FROM (SELECT pid, backend_type FROM pg_stat_activity"
    " WHERE application_name = %s OFFSET 0) AS s WHERE pg_terminate_backend(pid)"
)
"""OFFSET 0 keeps the filter in the subquery, so no other backend is ever ended."""


@pytest.fixture
def dbs(pg15: PostgresInfo) -> Iterator[Databases]:
    databases = make_databases(pg15, 300, target=False, seed_value=random.randrange(1 << 30))
    yield databases
    drop_databases(databases)


def test_tailer_and_dump_ride_through_their_sessions_ended_in_a_loop(
    dbs: Databases, redis_server: RedisInfo, tmp_path: Path
) -> None:
    store = StateStore(redis_server.client(), dbs.config.name)
    events_dir = tmp_path / "events"
    lines = [
        line.replace(" user=", f" application_name={APPLICATION} user=")
        if line.startswith("dsn")
        else line
        for line in dbs.toml_source()
    ]
    config = write_config(
        tmp_path / "dblog.toml",
        dbs,
        redis_server,
        {"type": "ndjson", "directory": str(events_dir)},
        {"heartbeat_s": 0.2, "reconnect_max_s": 1, "window_ttl_s": 10},
        source=lines,
    )
    env = cli_env(dbs, redis_server)
    tail_log, dump_log = tmp_path / "tail.log", tmp_path / "dump.log"
    tail = TailProcess(config, "tailer", env, tail_log)
    writer: Writer | None = None
    ended: dict[int, str] = {}
    """Each backend ended: its pid and type."""
    try:
        wait_until(lambda: store.tailer.health() is not None, 60, "the tailer's first heartbeat")
        writer = Writer(dbs, tmp_path, seed_value=random.randrange(1000))
        writer.wait_for(20, timeout_s=60)
        with dump_log.open("wb") as out:
            dump = subprocess.Popen(
                [DBLOG, "dump", "-c", str(config), "--dump-id", "ended",
                 "--chunk-size", "20", "--source-patience", "300", "--window-timeout", "10"],
                stdout=subprocess.DEVNULL,
                stderr=out,
                env=env,
            )  # fmt: skip
            try:

                def dump_reading() -> bool:
                    assert dump.poll() is None, dump_log.read_text()[-3000:]
                    status = store.dumps.status("ended")
                    return status is not None and status.chunks >= 1

                wait_until(dump_reading, 120, "the dump completing its first chunk")
                with psycopg.connect(dbs.pg.admin_dsn, autocommit=True) as admin:

                    def streaming_again() -> bool:
                        """A walsender of the tailer that was not ended yet."""
                        assert tail.alive(), tail_log.read_text()[-3000:]
                        pids = admin.execute(
                            "SELECT pid FROM pg_stat_activity WHERE application_name = %s"
                            " AND backend_type = 'walsender'",
                            (APPLICATION,),
                        )
                        return any(pid not in ended for (pid,) in pids)

                    # A walsender seen streaming may close on its own before the round ends it
                    # (the tailer restarts its stream when its catalog session is lost), so
                    # rounds go on until ROUNDS walsenders were ended by one.
                    for _ in range(3 * ROUNDS):
                        if list(ended.values()).count("walsender") >= ROUNDS:
                            break
                        wait_until(streaming_again, 120, "the tailer streaming again")
                        ended.update(admin.execute(TERMINATE, (APPLICATION,)).fetchall())
                assert dump.wait(600) == 0, dump_log.read_text()[-3000:]
            finally:
                if dump.poll() is None:
                    dump.kill()
                    dump.wait()
        writer.stop()
        wait_caught_up(dbs, timeout_s=120)
        assert tail.stop() == 0, tail_log.read_text()[-3000:]
    finally:
        if writer is not None:
            writer.kill()
        if tail.alive():
            tail.kill()

    # ROUNDS walsenders were ended, and the dump's and the catalog's sessions besides.
    kinds = list(ended.values())
    assert kinds.count("walsender") >= ROUNDS, ended
    assert kinds.count("client backend") >= ROUNDS, ended
    logs = tail_log.read_text() + dump_log.read_text()
    assert "Traceback" not in logs, logs[-5000:]
    assert "source unavailable" in logs and "administrator command" in logs, logs[-5000:]
    status = store.dumps.status("ended")
    assert status is not None and status.state == "done", status
    events = list(read_events(events_dir))
    assert state_differences(source_state(dbs.source), materialize(events)) == []
