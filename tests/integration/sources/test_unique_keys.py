"""Tables without a primary key, keyed by a unique index on NOT NULL columns, on PostgreSQL (the
replica identity index) and MariaDB (the only such index, or the one `[source] unique_keys`
names): followed by the tailer and dumped while writes run (updates of the unique columns in
place among them) and the tailer is SIGKILLed once, the NDJSON replays to the source, every
event keyed by the index's columns.
Tables that no index can key are refused by setup, naming the ways out."""

from __future__ import annotations

import dataclasses
import random
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pymysql
import pytest

from airflow_provider_dblog.core.dump_plan import DumpKind, DumpRequest
from airflow_provider_dblog.core.event import Op, Origin, TableRef
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.dump.runner import run_dump
from airflow_provider_dblog.outputs import read_events
from airflow_provider_dblog.sources.base import NoPrimaryKey, Source
from airflow_provider_dblog.sources.factory import source_for
from airflow_provider_dblog.state import DumpState, StateStore
from tests.integration.e2e_support import (
    SOURCES,
    MysqlDatabases,
    SourceDatabases,
    TailProcess,
    backwards,
    capturing,
    cli_env,
    drop_databases,
    make_source,
    materialize,
    source_state,
    state_differences,
    wait_caught_up,
    wait_until,
    write_config,
)

pytestmark = pytest.mark.integration
ROWS = 300


@pytest.fixture(params=SOURCES)
def source(request: pytest.FixtureRequest) -> Iterator[SourceDatabases]:
    databases = make_source(request, 0, random.randrange(1 << 30))
    yield databases
    drop_databases(databases)


def execute(dbs: SourceDatabases, *statements: str, params: Any = None) -> None:
    if isinstance(dbs, MysqlDatabases):
        kwargs = {**dbs.info.connect_kwargs(), "database": dbs.source_db, "autocommit": True}
        with pymysql.connect(**kwargs) as conn, conn.cursor() as cursor:
            for statement in statements:
                cursor.execute(statement, params)
        return
    with psycopg.connect(dbs.source_dsn, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement, params)


def keyed_source(dbs: SourceDatabases, table: str, **options: Any) -> Source:
    """The source capturing `table` alone (its slot and publication on PostgreSQL)."""
    config = dataclasses.replace(dbs.config, tables=(dbs.table(table),), **options)  # type: ignore[type-var]
    return source_for(config)


def key_of(source: Source, table: TableRef) -> tuple[str, ...]:
    chunks = source.chunk_source()
    try:
        return chunks.key_columns(table)
    finally:
        chunks.close()


READINGS = (
    "CREATE TABLE readings (sensor varchar(20) NOT NULL, at int NOT NULL, value int, "
    "note varchar(40), CONSTRAINT readings_key UNIQUE (sensor, at))"
)


def test_a_table_keyed_by_a_unique_index_is_followed_and_dumped(
    source: SourceDatabases, redis_server: RedisInfo, tmp_path: Path
) -> None:
    dbs = source
    execute(dbs, READINGS)
    if not isinstance(dbs, MysqlDatabases):
        execute(dbs, "ALTER TABLE readings REPLICA IDENTITY USING INDEX readings_key")
    rows = [(f"s{i % 7}", i, i * 10) for i in range(ROWS)]
    values = ", ".join(f"('{s}', {a}, {v})" for s, a, v in rows)
    execute(dbs, f"INSERT INTO readings (sensor, at, value) VALUES {values}")
    readings = dbs.table("readings")
    captured = keyed_source(dbs, "readings")
    captured.ensure_setup()
    assert key_of(captured, readings) == ("sensor", "at")
    store = StateStore(redis_server.client(), dbs.config.name)
    config = write_config(
        tmp_path / "dblog.toml",
        capturing(dbs, "readings"),
        redis_server,
        {"type": "ndjson", "directory": str(tmp_path / "events")},
        {"heartbeat_s": 0.2, "window_ttl_s": 10, "reconnect_max_s": 2, "lease_ttl_ms": 2000},
    )
    tail = TailProcess(config, "tailer", cli_env(dbs, redis_server), tmp_path / "tail.log")
    try:
        wait_until(lambda: store.tailer.health() is not None, 30, "the tailer's first heartbeat")
        store.dumps.create(DumpRequest("unique", DumpKind.TABLE, (readings,), chunk_size=40))
        writes = threading.Thread(target=write_while_dumping, args=(dbs,), daemon=True)
        ended: list[DumpState] = []
        dump = threading.Thread(
            target=lambda: ended.append(
                run_dump(store, captured.chunk_source, "unique", window_timeout_s=10)
            ),
            daemon=True,
        )
        writes.start()
        dump.start()
        wait_until(
            lambda: chunks_done(store, "unique") >= 2 or not dump.is_alive(), 120, "2 chunks"
        )
        tail.kill()  # mid-dump and mid-writes: its windows expire and are read again
        tail.start()
        dump.join(180)
        writes.join(120)
        assert ended == [DumpState.DONE] and not writes.is_alive(), ended
        wait_caught_up(dbs, store=store)
        assert tail.stop() == 0, (tmp_path / "tail.log").read_text()[-3000:]
    finally:
        if tail.alive():
            tail.kill()
    events = [e for e in read_events(tmp_path / "events") if e.source.table == "readings"]
    changes = [e for e in events if e.op not in (Op.SCHEMA, Op.TRUNCATE)]
    assert {tuple(e.key) for e in changes} == {("sensor", "at")}
    assert {e.source.origin for e in changes} == {Origin.LOG, Origin.DUMP}
    assert backwards(events) == []
    assert state_differences(source_state(captured, [readings]), materialize(events)) == []


def chunks_done(store: StateStore, dump_id: str) -> int:
    status = store.dumps.status(dump_id)
    return 0 if status is None else status.chunks


def write_while_dumping(dbs: SourceDatabases) -> None:
    """Updates of a value, of the unique columns in place (a new key), deletes and inserts."""
    for i in range(0, ROWS, 9):
        execute(
            dbs,
            "UPDATE readings SET value = value + 1 WHERE sensor = %s AND at = %s",
            "UPDATE readings SET at = at + 100000 WHERE sensor = %s AND at = %s",
            params=(f"s{i % 7}", i),
        )
        execute(
            dbs, "DELETE FROM readings WHERE sensor = %s AND at = %s", params=(f"s{i % 7}", i + 1)
        )
        execute(
            dbs,
            "INSERT INTO readings (sensor, at, value) VALUES (%s, %s, 1)",
            params=(f"n{i}", i),
        )


def test_a_table_no_unique_index_can_key_is_refused_naming_the_ways_out(
    source: SourceDatabases,
) -> None:
    dbs = source
    execute(
        dbs,
        "CREATE TABLE loose (code varchar(10), n int NOT NULL, "
        "CONSTRAINT loose_code UNIQUE (code))",
        "CREATE TABLE twice (a int NOT NULL, b int NOT NULL, CONSTRAINT twice_a UNIQUE (a), "
        "CONSTRAINT twice_b UNIQUE (b))",
    )
    with pytest.raises(NoPrimaryKey, match=r"no unique index on .*NOT NULL.*primary key"):
        keyed_source(dbs, "loose").ensure_setup()
    if isinstance(dbs, MysqlDatabases):
        with pytest.raises(NoPrimaryKey, match=r"2 unique indexes .* \[source\] unique_keys"):
            keyed_source(dbs, "twice").ensure_setup()
        chosen = keyed_source(dbs, "twice", unique_keys={dbs.table("twice"): "twice_b"})
        chosen.ensure_setup()
        assert key_of(chosen, dbs.table("twice")) == ("b",)
        wrong = {dbs.table("twice"): "nowhere"}
        with pytest.raises(NoPrimaryKey, match=r"names index nowhere .* does not exist"):
            keyed_source(dbs, "twice", unique_keys=wrong).ensure_setup()
    else:
        with pytest.raises(NoPrimaryKey, match="REPLICA IDENTITY USING INDEX twice_a; ALTER"):
            keyed_source(dbs, "twice").ensure_setup()
        execute(dbs, "ALTER TABLE twice REPLICA IDENTITY USING INDEX twice_b")
        chosen = keyed_source(dbs, "twice")
        chosen.ensure_setup()
        assert key_of(chosen, dbs.table("twice")) == ("b",)
