"""`dblog dump` started while its source is down waits for it, as `dblog tail` does, rather than
fail at once: a dump scheduled from Airflow during a restart or a failover then runs once the
server is back. It says once that the source is away and once that it is back, and the dump
ends done with the output equal to the source. (Past `--source-patience` it exits 2 in one
line: tests/integration/test_end_to_end.py.)"""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_provider_dblog.devservices.postgres import PostgresInfo, PostgresServer
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.outputs import read_events
from airflow_provider_dblog.state import StateStore
from tests.installed import installed
from tests.integration.e2e_support import (
    DBLOG,
    TailProcess,
    cli_env,
    make_databases,
    materialize,
    source_state,
    state_differences,
    wait_caught_up,
    wait_until,
    write_config,
)
from tests.integration.tailer.test_startup import Closing

pytestmark = pytest.mark.integration


@pytest.fixture
def own_server() -> Iterator[PostgresInfo]:
    """A PostgreSQL of this test's own, to stop and start."""
    with (
        tempfile.TemporaryDirectory(prefix="dblog-test-pg-dump-start-") as base,
        installed(lambda: PostgresServer(Path(base))) as server,
    ):
        yield server.info


def test_a_dump_started_while_postgres_is_down_waits_then_runs(
    own_server: PostgresInfo, redis_server: RedisInfo, tmp_path: Path
) -> None:
    dbs = make_databases(own_server, 100, target=False, seed_value=7)
    store = StateStore(redis_server.client(), dbs.config.name)
    events_dir = tmp_path / "events"
    config = write_config(
        tmp_path / "dblog.toml",
        dbs,
        redis_server,
        {"type": "ndjson", "directory": str(events_dir)},
        {"reconnect_max_s": 1, "heartbeat_s": 0.2},
    )
    env = cli_env(dbs, redis_server)
    tail = TailProcess(config, "tailer", env, tmp_path / "tail.log")
    dump_log = tmp_path / "dump.log"
    try:
        wait_until(lambda: store.tailer.health() is not None, 60, "the tailer's first heartbeat")
        own_server.stop()
        down = Closing(own_server.port)
        try:
            with dump_log.open("wb") as out:
                dump = subprocess.Popen(
                    [DBLOG, "dump", "-c", str(config), "--dump-id", "early",
                     "--chunk-size", "30", "--source-patience", "300"],
                    stdout=subprocess.DEVNULL,
                    stderr=out,
                    env=env,
                )  # fmt: skip

            def tried_often() -> bool:
                assert dump.poll() is None, dump_log.read_text()[-3000:]
                return down.accepted >= 12  # the tailer's tries and the dump's, several each

            wait_until(tried_often, 60, "the dump trying the stopped server")
            assert "dump early: source unavailable" in dump_log.read_text()
            assert store.dumps.ids() == [], "nothing is registered before its checks pass"
        finally:
            down.close()
        own_server.start()
        try:
            assert dump.wait(300) == 0, dump_log.read_text()[-3000:]
        finally:
            if dump.poll() is None:
                dump.kill()
                dump.wait()
        wait_caught_up(dbs, timeout_s=120)
        assert tail.stop() == 0, (tmp_path / "tail.log").read_text()[-3000:]
    finally:
        if tail.alive():
            tail.kill()
    lines = dump_log.read_text().splitlines()
    assert not any("Traceback" in line for line in lines), lines
    away = [line for line in lines if "source unavailable" in line]
    assert len(away) == 1 and " WARNING " in away[0], lines
    assert any("dump early: source back after" in line for line in lines), lines
    status = store.dumps.status("early")
    assert status is not None and status.state == "done" and status.rows == 300, status
    events = list(read_events(events_dir))
    assert state_differences(source_state(dbs.source), materialize(events)) == []
