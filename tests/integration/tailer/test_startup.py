"""What `dblog tail` does with a fault it meets first thing: a PostgreSQL that is down as it
starts is an outage, waited out with one warning, and then followed; a source that refuses its
setup, or an error the tailer cannot ride through, is one line and no traceback."""

from __future__ import annotations

import logging
import re
import socket
import tempfile
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import psycopg
import pytest

from airflow_provider_dblog.core.event import Event
from airflow_provider_dblog.devservices.postgres import PostgresInfo, PostgresServer
from airflow_provider_dblog.devservices.process import LOOPBACK
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.outputs import Output, read_events
from airflow_provider_dblog.state import StateStore
from airflow_provider_dblog.tailer import Tailer, TailerFailed
from tests.installed import installed
from tests.integration.e2e_support import (
    Databases,
    TailProcess,
    cli_env,
    drop_databases,
    make_databases,
    run_cli,
    wait_until,
    write_config,
)

pytestmark = pytest.mark.integration


class Closing:
    """Listens on `port` where the server was and closes each connection at once: a server
    that is down, counting the tries to reach it."""

    def __init__(self, port: int) -> None:
        self._socket = socket.create_server((LOOPBACK, port))
        self._socket.settimeout(0.2)
        self.accepted = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._socket.accept()
            except TimeoutError:
                continue
            conn.close()
            self.accepted += 1

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._socket.close()


@pytest.fixture
def own_server() -> Iterator[PostgresInfo]:
    """A PostgreSQL of this test's own, to stop and start."""
    with (
        tempfile.TemporaryDirectory(prefix="dblog-test-pg-startup-") as base,
        installed(lambda: PostgresServer(Path(base))) as server,
    ):
        yield server.info


def test_a_tailer_started_while_postgres_is_down_waits_then_follows(
    own_server: PostgresInfo, redis_server: RedisInfo, tmp_path: Path
) -> None:
    """The server is stopped before `dblog tail` starts, its port answered by a listener that
    closes every connection; once the tailer has tried several times, the server starts again.
    The tailer says once that the source is unavailable (the cause on the same line), once
    that it is back, and then follows: an insert reaches the NDJSON output. Every line of its
    log is a log line: no traceback."""
    dbs = make_databases(own_server, 0, target=False, seed_value=0)
    store = StateStore(redis_server.client(), dbs.config.name)
    events_dir = tmp_path / "events"
    config = write_config(
        tmp_path / "dblog.toml",
        dbs,
        redis_server,
        {"type": "ndjson", "directory": str(events_dir)},
        {"reconnect_max_s": 1, "heartbeat_s": 0.2},
    )
    tail_log = tmp_path / "tail.log"
    own_server.stop()
    down = Closing(own_server.port)
    tail = TailProcess(config, "early", cli_env(dbs, redis_server), tail_log)
    try:
        try:

            def tried_often() -> bool:
                assert tail.alive(), tail_log.read_text()
                return down.accepted >= 6  # three tries, if libpq tries twice (SSL, then not)

            wait_until(tried_often, 60, "the tailer trying the stopped server")
        finally:
            down.close()
        own_server.start()

        def leading() -> bool:
            assert tail.alive(), tail_log.read_text()
            health = store.tailer.health()
            return health is not None and health.metrics.get("state") == "leading"

        wait_until(leading, 60, "the tailer leading once the server is up")
        with psycopg.connect(dbs.source_dsn, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO accounts (id, owner, balance, active) VALUES (4242, 'late', 1, true)"
            )

        def inserted() -> bool:
            return events_dir.exists() and any(is_the_insert(e) for e in read_events(events_dir))

        wait_until(inserted, 60, "the insert in the output")
        assert tail.stop() == 0, tail_log.read_text()
    finally:
        if tail.alive():
            tail.kill()
    text = tail_log.read_text()
    assert all(re.match(r"\d{4}-\d\d-\d\d ", line) for line in text.splitlines()), text
    away = [line for line in text.splitlines() if "source unavailable" in line]
    assert len(away) == 1 and " WARNING " in away[0], text
    assert "closed the connection" in away[0], text
    back = [line for line in text.splitlines() if "source back after" in line]
    assert len(back) == 1 and " INFO " in back[0], text


def is_the_insert(event: Event) -> bool:
    return event.source.table == "accounts" and list(event.key.values()) == [4242]


def test_a_captured_table_that_does_not_exist_ends_the_tailer_with_one_line(
    pg15: PostgresInfo, redis_server: RedisInfo, tmp_path: Path
) -> None:
    dbs = make_databases(pg15, 0, target=False, seed_value=0)
    try:
        config = write_config(
            tmp_path / "dblog.toml",
            dbs,
            redis_server,
            {"type": "ndjson", "directory": str(tmp_path / "events")},
        )
        config.write_text(config.read_text().replace("tables = [", 'tables = ["public.gone", '))
        done = run_cli("tail", "--config", str(config), env=cli_env(dbs, redis_server))
    finally:
        drop_databases(dbs)
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    assert "Traceback" not in output, output
    errors = [line for line in output.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and errors[0].startswith("dblog: error: "), output
    assert "public.gone" in errors[0], output


class Nowhere(Output):
    def write(self, events: Sequence[Event], token: int) -> None:
        raise AssertionError("nothing is read")

    def close(self) -> None:
        pass


@pytest.fixture
def never_set_up(pg15: PostgresInfo) -> Iterator[Databases]:
    """A source whose slot was never made (nobody ran its setup)."""
    dbs = make_databases(pg15, 0, target=False, seed_value=0)
    yield dbs
    drop_databases(dbs)


def test_a_source_error_while_leading_is_one_error_line_without_a_traceback(
    never_set_up: Databases, redis_server: RedisInfo, caplog: pytest.LogCaptureFixture
) -> None:
    """The leader's first session finds no slot: the source's answer, not an outage. The tailer
    stops with `TailerFailed` and logs it as one line, with no traceback."""
    dbs = never_set_up
    store = StateStore(redis_server.client(), dbs.config.name)
    tailer = Tailer(dbs.source, store, Nowhere(), owner="unset")
    caplog.set_level(logging.INFO, logger="airflow_provider_dblog")
    with pytest.raises(TailerFailed, match=f"SourceError: replication slot '{dbs.slot}' does not"):
        tailer.run(threading.Event())
    errors = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(errors) == 1, [r.getMessage() for r in errors]
    assert errors[0].levelname == "ERROR" and errors[0].exc_info is None
    assert errors[0].getMessage().startswith("tailer unset stopped: SourceError: replication slot")
