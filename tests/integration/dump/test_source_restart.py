"""`dblog dump` rides through a restart of its source, PostgreSQL or MariaDB: a shutdown and a
start, as a failover or a minor-version upgrade does, in the middle of a full dump. The chunk the
restart broke is retried with new watermarks once the server is back, the dump ends done, and
the target equals the source: on PostgreSQL the SQL target the tailer (in this process) applies
to; on MariaDB the NDJSON a `dblog tail` process writes (riding through the same restart),
replayed by the consumer rules against the source's rows. The Spark dump's twin is in
dump/test_spark.py.

The servers are the session's pg15 (the target is on it too) and mariadb: each is brought back
up whatever happens, for the tests after this one.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_provider_dblog.demo.postgres import compare
from airflow_provider_dblog.devservices.mariadb import MariaDBInfo
from airflow_provider_dblog.devservices.postgres import PostgresInfo
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.outputs import read_events
from airflow_provider_dblog.state import DumpState, DumpStatus, StateStore
from tests.integration.e2e_support import (
    DBLOG,
    MysqlDatabases,
    TailProcess,
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
from tests.integration.spark_support import Pipeline, running_pipeline

pytestmark = pytest.mark.integration
ROWS = 600
CHUNK_SIZE = 20
CHUNKS = 3 * ROWS // CHUNK_SIZE


@pytest.fixture
def pipeline(pg15: PostgresInfo, redis_server: RedisInfo, tmp_path: Path) -> Iterator[Pipeline]:
    with running_pipeline(pg15, redis_server, tmp_path, ROWS) as pipeline:
        try:
            yield pipeline
        finally:
            pg15.start()  # a no-op if it runs; the session's other tests (and the teardown)


def status_of(pipeline: Pipeline, dump_id: str) -> DumpStatus | None:
    return pipeline.store.dumps.status(dump_id)


def test_cli_dump_rides_through_a_source_restart(
    pipeline: Pipeline, redis_server: RedisInfo, tmp_path: Path
) -> None:
    dbs = pipeline.dbs
    log = tmp_path / "dump.log"
    with log.open("wb") as out:
        dump = subprocess.Popen(
            [DBLOG, "dump", "-c", str(pipeline.config_path), "--dump-id", "restarted",
             "--chunk-size", str(CHUNK_SIZE), "--source-patience", "120"],
            stdout=subprocess.DEVNULL,
            stderr=out,
            env=cli_env(dbs, redis_server),
        )  # fmt: skip
        try:

            def two_chunks_done() -> bool:
                assert dump.poll() is None, log.read_text()[-3000:]
                status = status_of(pipeline, "restarted")
                return status is not None and status.chunks >= 2

            wait_until(two_chunks_done, 60, "the dump completing 2 chunks")
            dbs.pg.restart()  # SIGINT: a fast shutdown, every session ended, then a start
            at_restart = status_of(pipeline, "restarted")
            assert dump.wait(180) == 0, log.read_text()[-3000:]
        finally:
            if dump.poll() is None:
                dump.kill()
                dump.wait()
    # The restart landed in the middle of the dump, and the dump met it: its connection was
    # lost (a raw psycopg traceback would have failed it) and it went on.
    assert at_restart is not None and at_restart.state is DumpState.RUNNING, at_restart
    assert at_restart.chunks < CHUNKS
    errors = log.read_text()
    assert "lost the PostgreSQL source" in errors and "Traceback" not in errors, errors[-3000:]
    final = status_of(pipeline, "restarted")
    assert final is not None and final.state is DumpState.DONE, final
    assert final.chunks == CHUNKS and final.rows == 3 * ROWS
    wait_caught_up(dbs)
    assert compare(dbs.source_dsn, dbs.target_dsn) == []


@pytest.fixture
def mysql_source(mariadb: MariaDBInfo) -> Iterator[MysqlDatabases]:
    dbs = make_mysql_databases(mariadb, ROWS, seed_value=ROWS)
    try:
        yield dbs
    finally:
        mariadb.start()  # a no-op if it runs; the session's other tests (and the teardown)
        drop_databases(dbs)


def test_cli_dump_rides_through_a_mariadb_restart(
    mysql_source: MysqlDatabases, redis_server: RedisInfo, tmp_path: Path
) -> None:
    dbs = mysql_source
    store = StateStore(redis_server.client(), dbs.config.name)
    events_dir = tmp_path / "events"
    config = write_config(
        tmp_path / "dblog.toml",
        dbs,
        redis_server,
        {"type": "ndjson", "directory": str(events_dir)},
        {"heartbeat_s": 0.2, "reconnect_max_s": 1, "window_ttl_s": 10},
    )
    env = cli_env(dbs, redis_server)
    tail = TailProcess(config, "tailer", env, tmp_path / "tail.log")
    log = tmp_path / "dump.log"
    try:
        wait_until(lambda: store.tailer.health() is not None, 30, "the tailer's first heartbeat")
        with log.open("wb") as out:
            dump = subprocess.Popen(
                [DBLOG, "dump", "-c", str(config), "--dump-id", "restarted",
                 "--chunk-size", str(CHUNK_SIZE), "--source-patience", "120",
                 "--window-timeout", "10"],
                stdout=subprocess.DEVNULL,
                stderr=out,
                env=env,
            )  # fmt: skip
            try:

                def two_chunks_done() -> bool:
                    assert dump.poll() is None, log.read_text()[-3000:]
                    status = store.dumps.status("restarted")
                    return status is not None and status.chunks >= 2

                wait_until(two_chunks_done, 60, "the dump completing 2 chunks")
                dbs.info.restart()
                at_restart = store.dumps.status("restarted")
                assert dump.wait(180) == 0, log.read_text()[-3000:]
            finally:
                if dump.poll() is None:
                    dump.kill()
                    dump.wait()
        wait_caught_up(dbs, store=store)
        assert tail.stop() == 0, (tmp_path / "tail.log").read_text()[-3000:]
    finally:
        if tail.alive():
            tail.kill()
    assert at_restart is not None and at_restart.state is DumpState.RUNNING, at_restart
    assert at_restart.chunks < CHUNKS
    errors = log.read_text()
    assert "lost the MySQL source" in errors and "Traceback" not in errors, errors[-3000:]
    final = store.dumps.status("restarted")
    assert final is not None and final.state is DumpState.DONE, final
    assert final.chunks == CHUNKS and final.rows == 3 * ROWS
    events = list(read_events(events_dir))
    assert state_differences(source_state(dbs.source), materialize(events)) == []
