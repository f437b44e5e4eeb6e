"""Read-only sources (`[source] read_only = true`): the dump's watermarks are log positions, so
a role that may read the captured tables and the log, and write nothing at all, dumps them.

On PostgreSQL and MariaDB, under concurrent writes from another role, every table is dumped by
`dblog dump` while the tailer (`dblog tail`) is SIGKILLed and replaced, the dump is SIGKILLed and
run again (it resumes from its last completed chunk), and the source is restarted: the windows
a dead tailer armed fail, a dead dump's expire, and their chunks are read again; the NDJSON
replay equals the source with no time travel. The writer is paced (the tailer keeps up, and
every read-only chunk waits for the tailer to pass its hw) and the dump rate-limited, so that
each blow lands in the middle of the dump.
"""

from __future__ import annotations

import os
import random
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pymysql
import pytest

from airflow_provider_dblog.devservices.mariadb import MariaDBInfo
from airflow_provider_dblog.devservices.postgres import PostgresInfo
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.outputs import read_events
from airflow_provider_dblog.state import DumpState, StateStore
from airflow_provider_dblog.state.keys import SourceKeys
from tests.integration.dump.read_only_support import (
    RO_PASSWORD_ENV,
    read_only_role,
    refuses_writes,
    write_config,
)
from tests.integration.e2e_support import (
    DBLOG,
    REDIS_PASSWORD_ENV,
    SOURCES,
    MysqlDatabases,
    SourceDatabases,
    TailProcess,
    Writer,
    backwards,
    cli_env,
    drop_databases,
    make_mysql_databases,
    make_source,
    materialize,
    source_state,
    state_differences,
    wait_caught_up,
    wait_until,
)
from tests.integration.e2e_support import write_config as e2e_write_config

pytestmark = pytest.mark.integration


ROWS = 300
CHUNK_SIZE = 30
ROWS_PER_S = 90
"""The dump's rate limit: 900 rows in ten seconds or more, time for three blows."""
WRITES_PER_S = 40
"""The writer's pace: writes all along, and a tailer that is never far behind."""


@pytest.fixture(params=SOURCES)
def dbs(request: pytest.FixtureRequest) -> Iterator[SourceDatabases]:
    databases = make_source(request, ROWS, seed_value=random.randrange(1 << 30))
    try:
        yield databases
    finally:
        server(databases).start()  # a no-op if it runs; the session's other tests need it
        drop_databases(databases)


def server(dbs: SourceDatabases) -> MariaDBInfo | PostgresInfo:
    """The session's server the source lives on (restarted here, so brought back after)."""
    return dbs.info if isinstance(dbs, MysqlDatabases) else dbs.pg


class DumpProcess:
    """`dblog dump` of every captured table as dump "ro", its stderr in `log`; `extra`: more
    options."""

    def __init__(
        self, config: Path, env: dict[str, str], log: Path, extra: tuple[str, ...] = ()
    ) -> None:
        self.log = log
        with log.open("ab") as out:
            self.process = subprocess.Popen(
                [DBLOG, "dump", "-c", str(config), "--dump-id", "ro",
                 "--chunk-size", str(CHUNK_SIZE), "--parallelism", "2",
                 "--max-rows-per-s", str(ROWS_PER_S), "--source-patience", "120", *extra],
                stdout=subprocess.DEVNULL,
                stderr=out,
                env=env,
            )  # fmt: skip

    def running(self) -> bool:
        assert self.process.poll() is None, self.log.read_text()[-3000:]
        return True

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(30)


def test_a_read_only_role_dumps_under_writes_through_kills_and_a_source_restart(
    dbs: SourceDatabases, redis_server: RedisInfo, tmp_path: Path
) -> None:
    role = read_only_role(dbs)
    assert refuses_writes(dbs, role), "the role must have no write grant"
    config = write_config(tmp_path / "ro.toml", dbs, role.toml, RO_PASSWORD_ENV, redis_server)
    env = dict(
        os.environ, **{RO_PASSWORD_ENV: role.password, REDIS_PASSWORD_ENV: redis_server.password}
    )
    store = StateStore(redis_server.client(), dbs.config.name)
    tailers = [TailProcess(config, "ro-1", env, tmp_path / "tail-1.log")]
    writers: list[Writer] = []
    dumps: list[DumpProcess] = []

    def chunks_done(at_least: int) -> Callable[[], bool]:
        def done() -> bool:
            status = store.dumps.status("ro")
            return dumps[-1].running() and status is not None and status.chunks >= at_least

        return done

    try:
        wait_until(lambda: store.tailer.health() is not None, 60, "the read-only tailer leading")
        writers.append(Writer(dbs, tmp_path, random.randrange(1 << 30), WRITES_PER_S))
        writers[-1].wait_for(10)
        dumps.append(DumpProcess(config, env, tmp_path / "dump.log"))
        wait_until(chunks_done(3), 120, "three chunks dumped")
        tailers[0].kill()
        tailers.append(TailProcess(config, "ro-2", env, tmp_path / "tail-2.log"))
        wait_until(chunks_done(9), 120, "nine chunks dumped")
        dumps[0].kill()
        dumps.append(DumpProcess(config, env, tmp_path / "dump.log"))
        wait_until(chunks_done(15), 120, "fifteen chunks dumped")
        # The writer does not ride through a restart: one stops before, the next starts after.
        assert writers[0].stop(), "the writer committed transactions"
        server(dbs).restart()
        at_restart = store.dumps.status("ro")
        writers.append(Writer(dbs, tmp_path, random.randrange(1 << 30), WRITES_PER_S))
        writers[-1].wait_for(10, timeout_s=60)
        assert dumps[-1].process.wait(300) == 0, dumps[-1].log.read_text()[-3000:]
        assert writers[-1].stop(), "the writer committed transactions after the restart"
        wait_caught_up(dbs, store=store)
    finally:
        for writer in writers:
            writer.kill()
        for dump in dumps:
            dump.kill()
        for tailer in tailers:
            tailer.stop()
    assert at_restart is not None and at_restart.state is DumpState.RUNNING, at_restart
    events = list(read_events(tmp_path / "events"))
    assert backwards(events) == []
    assert state_differences(source_state(dbs.source), materialize(events)) == []
    status = store.dumps.status("ro")
    assert status is not None and status.state is DumpState.DONE, status
    assert status.rows >= 3 * ROWS


def test_a_read_only_dump_of_a_writable_mariadb_source_writes_no_watermark(
    mariadb: MariaDBInfo, redis_server: RedisInfo, tmp_path: Path
) -> None:
    """`dblog dump --read-only` on a MariaDB source that writes watermarks for its other dumps:
    under writes, with the tailer SIGKILLed and replaced mid-dump, the dump completes with
    windows the tailer armed, having written nothing (UPDATE on the watermark database is
    revoked, so a watermark write would fail the dump; the row keeps its value), and the NDJSON
    replay equals the source with no time travel."""
    dbs = make_mysql_databases(mariadb, ROWS, seed_value=random.randrange(1 << 30))
    try:
        dbs.source.ensure_setup()  # the tailer's own setup: the watermark table and its row
        user, watermark = dbs.info.user, f"`{dbs.watermark_db}`.`watermark`"  # the default name
        dbs.admin(f"REVOKE UPDATE ON `{dbs.watermark_db}`.* FROM '{user}'@'%'")
        before = watermark_rows(dbs, watermark)
        output = {"type": "ndjson", "directory": str(tmp_path / "events")}
        tailer_settings = {"heartbeat_s": 0.2, "lease_ttl_ms": 2000}
        config = e2e_write_config(tmp_path / "rw.toml", dbs, redis_server, output, tailer_settings)
        env = cli_env(dbs, redis_server)
        store = StateStore(redis_server.client(), dbs.config.name)
        tailers = [TailProcess(config, "rw-1", env, tmp_path / "tail-1.log")]
        writer: Writer | None = None
        dump: DumpProcess | None = None
        try:
            wait_until(lambda: store.tailer.health() is not None, 60, "the tailer leading")
            writer = Writer(dbs, tmp_path, random.randrange(1 << 30), WRITES_PER_S)
            writer.wait_for(10)
            dump = DumpProcess(config, env, tmp_path / "dump.log", ("--read-only",))

            def chunks_done(at_least: int) -> bool:
                status = store.dumps.status("ro")
                return status is not None and status.chunks >= at_least

            wait_until(lambda: dump.running() and chunks_done(6), 120, "six chunks dumped")
            tailers[0].kill()
            tailers.append(TailProcess(config, "rw-2", env, tmp_path / "tail-2.log"))
            assert dump.process.wait(300) == 0, dump.log.read_text()[-3000:]
            assert writer.stop(), "the writer committed transactions"
            wait_caught_up(dbs, store=store)
        finally:
            if writer is not None:
                writer.kill()
            if dump is not None:
                dump.kill()
            for tailer in tailers:
                tailer.stop()
        assert watermark_rows(dbs, watermark) == before == [(1, None)]
        request = store.dumps.get("ro")
        assert request is not None and request.request.read_only
        keys, client = SourceKeys(dbs.config.name), redis_server.client()
        windows = [keys.window(w) for w in store.windows.ids()]
        assert windows and all(client.hget(w, "armed_at") for w in windows), windows
        events = list(read_events(tmp_path / "events"))
        assert backwards(events) == []
        assert state_differences(source_state(dbs.source), materialize(events)) == []
        status = store.dumps.status("ro")
        assert status is not None and status.state is DumpState.DONE, status
    finally:
        drop_databases(dbs)


def watermark_rows(dbs: MysqlDatabases, table: str) -> list[tuple[object, ...]]:
    with (
        pymysql.connect(**dbs.info.admin_connect_kwargs()) as conn,
        conn.cursor() as cursor,
    ):
        cursor.execute(f"SELECT id, value FROM {table}")
        return list(cursor.fetchall())
