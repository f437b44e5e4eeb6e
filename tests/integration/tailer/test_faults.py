"""The failures a tailer must ride through or end on cleanly: a leader stopped (SIGSTOP, as a
long GC pause or a frozen VM looks) is replaced, and its batch never lands once it wakes; a SQL
target restarted while a backlog is applied; a writer thread that dies on an unexpected error."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, cast

import psycopg
import pytest

from airflow_provider_dblog.core.event import Event
from airflow_provider_dblog.core.event_codec import decode
from airflow_provider_dblog.demo.postgres import SCHEMA, compare
from airflow_provider_dblog.devservices.postgres import PostgresInfo
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.outputs import Output, SqlApplyOutput, read_events
from airflow_provider_dblog.state import StateStore
from airflow_provider_dblog.tailer import Tailer, TailerFailed, TailerSettings
from tests.integration.e2e_support import (
    VERSIONED,
    Databases,
    TailProcess,
    Writer,
    backwards,
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
LEASE_TTL_MS = 2000
STREAM_URL_ENV = "E2E_STREAM_URL"
TARGET_DSN_ENV = "E2E_TARGET_DSN"


@pytest.fixture
def source(pg15: PostgresInfo) -> Iterator[Databases]:
    """A private source whose three tables are empty when capture starts, and a target."""
    databases = make_databases(pg15, 0, target=True, seed_value=0)
    yield databases
    drop_databases(databases)


def holder(store: StateStore) -> str | None:
    health = store.tailer.health()
    return None if health is None else health.owner


def state_of(store: StateStore) -> object:
    health = store.tailer.health()
    return None if health is None else health.metrics.get("state")


def output_config(kind: str, dbs: Databases, tmp_path: Path) -> dict[str, Any]:
    if kind == "ndjson":
        return {"type": "ndjson", "directory": str(tmp_path / "events")}
    if kind == "redis_stream":
        return {"type": "redis_stream", "url_env": STREAM_URL_ENV, "prefix": "fault"}
    return {"type": "sql_apply", "dsn_env": TARGET_DSN_ENV, "monotonic": True}


def ndjson_events(tmp_path: Path) -> int:
    events = tmp_path / "events"
    return sum(1 for _ in read_events(events)) if events.exists() else 0


def stream_events(redis_server: RedisInfo, dbs: Databases) -> list[Event]:
    client = redis_server.client()
    entries = cast(
        list[tuple[bytes, dict[bytes, bytes]]], client.xrange(f"fault:{dbs.config.name}:events")
    )
    return [decode(fields[b"event"]) for _, fields in entries]


@pytest.mark.parametrize("kind", ["ndjson", "redis_stream", "sql_apply"])
def test_a_stopped_leader_is_replaced_and_its_batch_never_lands(
    kind: str, source: Databases, redis_server: RedisInfo, tmp_path: Path
) -> None:
    """Two `dblog tail` processes; the leader is SIGSTOPped under a write workload. The standby
    takes the lease once it expires, ends the stopped leader's hold on the slot and leads,
    writing while the old leader is still stopped (NDJSON too: its takeover seals the last
    file rather than wait for the stopped writer). When the stopped one wakes, its writes are
    refused (lease token, or its sealed file) and it stands by again. The output then holds
    every change once, in strictly increasing positions, equal to the source."""
    dbs = source
    store = StateStore(redis_server.client(), dbs.config.name)
    config = write_config(
        tmp_path / "dblog.toml",
        dbs,
        redis_server,
        output_config(kind, dbs, tmp_path),
        {"lease_ttl_ms": LEASE_TTL_MS, "heartbeat_s": 0.2, "batch_events": 50},
    )
    stream_url = (
        f"redis://:{redis_server.password}@{redis_server.host}:{redis_server.port}/"
        f"{redis_server.db}"
    )
    env = cli_env(dbs, redis_server, **{STREAM_URL_ENV: stream_url, TARGET_DSN_ENV: dbs.target_dsn})
    first = TailProcess(config, "tailer-a", env, tmp_path / "a.log")
    second: TailProcess | None = None
    writer: Writer | None = None
    try:
        wait_until(lambda: holder(store) == "tailer-a", 30, "tailer-a leading")
        second = TailProcess(config, "tailer-b", env, tmp_path / "b.log")
        wait_until(lambda: "is a standby" in (tmp_path / "b.log").read_text(), 30, "a standby")
        writer = Writer(dbs, tmp_path, seed_value=31)
        writer.wait_for(30)
        if kind == "ndjson":
            # tailer-a has taken the directory over, the only time it holds the lock (its files
            # do not fill up here): stopped inside that, it would keep tailer-b out until it woke.
            wait_until(lambda: ndjson_events(tmp_path) > 0, 60, "tailer-a writing")

        first.process.send_signal(signal.SIGSTOP)
        try:
            wait_until(lambda: holder(store) == "tailer-b", LEASE_TTL_MS / 1000 + 30, "b leading")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{(tmp_path / 'b.log').read_text()[-3000:]}") from None
        written = ndjson_events(tmp_path) if kind == "ndjson" else 0
        writer.wait_for(len(writer.transactions()) + 30)
        wait_until(lambda: state_of(store) == "leading", 30, "b reading the log")
        if kind == "ndjson":
            wait_until(
                lambda: ndjson_events(tmp_path) > written, 60, "b writing while a is stopped"
            )

        first.process.send_signal(signal.SIGCONT)
        wait_until(lambda: state_of(store) == "leading", 30, "b leading after a woke")
        wait_until(
            lambda: (
                (tmp_path / "a.log").read_text().count("is a standby") >= 1
                and "waiting for the lease again" in (tmp_path / "a.log").read_text()
            ),
            30,
            "tailer-a standing by after it woke",
        )
        writer.wait_for(len(writer.transactions()) + 20)
        writer.stop()
        wait_caught_up(dbs)
        assert holder(store) == "tailer-b"
        assert first.alive() and second.alive()
    finally:
        if writer is not None:
            writer.kill()
        first.process.send_signal(signal.SIGCONT)
        for tail in (first, second):
            if tail is not None and tail.alive():
                tail.stop()

    for log in ("a.log", "b.log"):
        text = (tmp_path / log).read_text()
        assert dbs.pg.password not in text and redis_server.password not in text
    if kind == "sql_apply":
        assert compare(dbs.source_dsn, dbs.target_dsn) == []
        return
    events = (
        list(read_events(tmp_path / "events"))
        if kind == "ndjson"
        else stream_events(redis_server, dbs)
    )
    assert backwards(events) == [], "a key went back to an older position"
    positions = [e.position for e in events]
    assert positions == sorted(set(positions)), "positions strictly increase in output order"
    assert state_differences(source_state(dbs.source), materialize(events)) == []


@pytest.fixture
def target_server(pg18: PostgresInfo) -> Iterator[PostgresInfo]:
    """A target on another server than the source, brought back up whatever the test did."""
    with psycopg.connect(pg18.admin_dsn, autocommit=True) as conn:
        conn.execute("DROP DATABASE IF EXISTS fault_target WITH (FORCE)")
        conn.execute(f"CREATE DATABASE fault_target OWNER {pg18.user}")
    base = pg18.dsn.rsplit("/", 1)[0]
    with psycopg.connect(f"{base}/fault_target", autocommit=True) as conn:
        conn.execute(SCHEMA)
        conn.execute(VERSIONED)
    try:
        yield pg18
    finally:
        pg18.start()
        with psycopg.connect(pg18.admin_dsn, autocommit=True) as conn:
            conn.execute("DROP DATABASE IF EXISTS fault_target WITH (FORCE)")


BACKLOG_ROWS = 200_000


def test_a_sql_target_restart_during_a_backlog_is_ridden_through(
    source: Databases,
    target_server: PostgresInfo,
    redis_server: RedisInfo,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A backlog of 200k rows is applied to a SQL target on its own server; the target is
    restarted (fast shutdown) while rows still flow. The tailer notices ("output unavailable"),
    reconnects, beats again and ends with the target equal to the source."""
    dbs = source
    dbs.source.ensure_setup()
    with psycopg.connect(dbs.source_dsn, autocommit=True) as conn:
        for start in range(0, BACKLOG_ROWS, 20_000):
            conn.execute(
                "INSERT INTO accounts (id, owner, balance, active)"
                " SELECT i, 'o' || i, i %% 1000, i %% 2 = 0"
                " FROM generate_series(%s::int, %s::int) i",
                (start + 1, start + 20_000),
            )
    target_dsn = target_server.dsn.rsplit("/", 1)[0] + "/fault_target"
    store = StateStore(redis_server.client(), dbs.config.name)
    output = SqlApplyOutput(target_dsn, monotonic=True)
    settings = TailerSettings(lease_ttl_ms=5000, heartbeat_s=0.2)
    tailer = Tailer(dbs.source, store, output, owner="backlog-tailer", settings=settings)
    stop = threading.Event()
    caplog.set_level(logging.WARNING, logger="airflow_provider_dblog")
    thread = tailer.start(stop)
    try:

        def applied() -> int:
            try:
                with psycopg.connect(target_dsn, connect_timeout=2) as conn:
                    row = conn.execute("SELECT count(*) FROM accounts").fetchone()
            except psycopg.OperationalError:
                return -1
            return 0 if row is None else int(row[0])

        wait_until(lambda: applied() > 0, 60, "the first rows applied")
        target_server.restart()
        assert applied() < BACKLOG_ROWS, "the restart came after the backlog: nothing tested"
        wait_until(lambda: applied() == BACKLOG_ROWS, 180, "the backlog applied after restart")
        wait_caught_up(dbs, 120)
        assert compare(dbs.source_dsn, target_dsn) == []
        assert thread.is_alive()
        health = store.tailer.health()
        assert health is not None and health.owner == "backlog-tailer"
        assert health.metrics["state"] == "leading"
        assert any("output unavailable" in r.getMessage() for r in caplog.records)
    finally:
        stop.set()
        thread.join(60)
        output.close()
    assert not thread.is_alive()


class BreaksOnSecondWrite(Output):
    """An output whose second write fails with an error no output should raise."""

    def __init__(self) -> None:
        self.writes = 0

    def write(self, events: Sequence[Event], token: int) -> None:
        self.writes += 1
        if self.writes == 2:
            raise ZeroDivisionError("the output broke")

    def close(self) -> None:
        pass


def test_a_writer_thread_that_dies_ends_the_tailer_with_its_error_logged(
    source: Databases, redis_server: RedisInfo, caplog: pytest.LogCaptureFixture
) -> None:
    """The writer dies on its second batch while the reader keeps handing rows over a small
    buffer: the reader does not block on it; `run` ends with `TailerFailed` naming the error,
    the error is logged, and the lease is released for a standby."""
    dbs = source
    dbs.source.ensure_setup()
    with psycopg.connect(dbs.source_dsn, autocommit=True) as conn:
        for i in range(1, 6):
            conn.execute(
                "INSERT INTO accounts (id, owner, balance, active)"
                " SELECT g, 'o', 1, true FROM generate_series(%s::int, %s::int) g",
                (i * 1000, i * 1000 + 999),
            )
    store = StateStore(redis_server.client(), dbs.config.name)
    settings = TailerSettings(batch_events=100, buffer_items=200, heartbeat_s=0.2)
    tailer = Tailer(dbs.source, store, BreaksOnSecondWrite(), owner="breaking", settings=settings)
    caplog.set_level(logging.ERROR, logger="airflow_provider_dblog")
    with pytest.raises(TailerFailed, match="ZeroDivisionError: the output broke") as failed:
        tailer.run(threading.Event())
    assert isinstance(failed.value.__cause__, ZeroDivisionError)
    assert any("the output broke" in r.getMessage() for r in caplog.records)
    assert store.tailer.acquire_lease("next", 5000) is not None, "the lease was released"
