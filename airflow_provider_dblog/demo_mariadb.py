"""`dblog demo --source mariadb`: the demo's story on a private MariaDB (see demo.py).

Starts MariaDB and Redis in a temp dir, creates the three sample tables (bigint key; composite
(varchar, int) key; binary(16) uuid key) with rows that exist before capture starts, runs the
binlog tailer into NDJSON files, runs a write workload, and while it writes: a full dump of all
tables with several windows in flight, then a repair of 20 given keys. The SQL-apply output
writes PostgreSQL, so the target here is the NDJSON stream: at the end it is replayed by the
README's consumer rules and must equal the source row for row (as the dump's converters read
it), and the repair must have emitted exactly the keys asked for.
"""

from __future__ import annotations

import json
import os
import random
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pymysql

from airflow_provider_dblog.core.dump_plan import Chunk, DumpKind, DumpRequest
from airflow_provider_dblog.core.event import Event, Op, Row
from airflow_provider_dblog.core.position import binlog_file_number, mysql_commit
from airflow_provider_dblog.demo import REGIONS, DemoSummary, RandomWrites, wait_until
from airflow_provider_dblog.devservices.mariadb import MariaDBInfo, MariaDBServer
from airflow_provider_dblog.devservices.redis import RedisServer
from airflow_provider_dblog.dump.runner import run_dump
from airflow_provider_dblog.outputs.ndjson import NdjsonOutput, read_events
from airflow_provider_dblog.sources.base import Source
from airflow_provider_dblog.sources.factory import parse_source_config, source_for
from airflow_provider_dblog.state import StateStore
from airflow_provider_dblog.tailer import Tailer, TailerSettings

SCHEMA = (
    "CREATE TABLE accounts (id bigint PRIMARY KEY, owner varchar(100) NOT NULL, "
    "balance decimal(12,2), active boolean, updated datetime(6) DEFAULT CURRENT_TIMESTAMP(6))",
    "CREATE TABLE orders (region varchar(8), n int, amount decimal(14,2), note varchar(200), "
    "tags json, PRIMARY KEY (region, n))",
    "CREATE TABLE items (id binary(16) PRIMARY KEY, name varchar(100), attrs json, "
    "data varbinary(64))",
)
"""The demo's tables on MySQL: a `binary(16)` uuid key (its JSON is base64), `json` for
PostgreSQL's `text[]` and `jsonb`."""
TABLE_NAMES = ("accounts", "orders", "items")
PASSWORD_ENV = "DBLOG_DEMO_PASSWORD"
RowKey = tuple[str, str]
"""(table name, JSON list of the key values in primary-key order)."""


def seed(cursor: pymysql.cursors.Cursor, rows: int, rng: random.Random) -> int:
    """Create the tables in the cursor's database and write `rows` rows into each."""
    for statement in SCHEMA:
        cursor.execute(statement)
    cursor.executemany(
        "INSERT INTO accounts (id, owner, balance, active) VALUES (%s, %s, %s, %s)",
        [(i, f"owner-{i}", i * 1.5, i % 3 > 0) for i in range(1, rows + 1)],
    )
    cursor.executemany(
        "INSERT INTO orders (region, n, amount, note, tags) VALUES (%s, %s, %s, %s, %s)",
        [
            (REGIONS[i % 4], i // 4 + 1, i / 4, f"note {i}", json.dumps(["x", str(i)]))
            for i in range(rows)
        ],
    )
    cursor.executemany(
        "INSERT INTO items (id, name, attrs, data) VALUES (%s, %s, %s, %s)",
        [
            (rng.randbytes(16), f"item {i}", json.dumps({"i": i}), bytes([i % 256]) * 4)
            for i in range(rows)
        ],
    )
    return rows * 3


def write_one(cursor: pymysql.cursors.Cursor, rng: random.Random) -> None:
    """One random insert, update or delete on one of the three tables."""
    table = rng.choice(TABLE_NAMES)
    action = rng.choices(("insert", "update", "delete"), (4, 5, 1))[0]
    if table == "accounts":
        key = rng.randint(1, 3000)
        if action == "delete":
            cursor.execute("DELETE FROM accounts WHERE id = %s", (key,))
        else:
            cursor.execute(
                "INSERT INTO accounts (id, owner, balance, active) VALUES (%s, %s, %s, %s) "
                "ON DUPLICATE KEY UPDATE balance = VALUES(balance), active = VALUES(active), "
                "updated = CURRENT_TIMESTAMP(6)",
                (key, f"owner-{key}", round(rng.uniform(-1e4, 1e4), 2), rng.random() < 0.8),
            )
    elif table == "orders":
        region, n = rng.choice(REGIONS), rng.randint(1, 800)
        if action == "delete":
            cursor.execute("DELETE FROM orders WHERE region = %s AND n = %s", (region, n))
        else:
            cursor.execute(
                "INSERT INTO orders (region, n, amount, note, tags) VALUES (%s, %s, %s, %s, %s) "
                "ON DUPLICATE KEY UPDATE amount = VALUES(amount), tags = VALUES(tags)",
                (
                    region,
                    n,
                    rng.randint(1, 10**6) / 100,
                    f"note {n}",
                    json.dumps([region, str(n % 7)]),
                ),
            )
    elif action == "insert":
        cursor.execute(
            "INSERT INTO items (id, name, attrs, data) VALUES (%s, %s, %s, %s)",
            (
                uuid.UUID(int=rng.getrandbits(128)).bytes,
                "item",
                json.dumps({"size": rng.randint(1, 9), "tags": ["a", "b"]}),
                rng.randbytes(8),
            ),
        )
    else:
        cursor.execute("SELECT id FROM items ORDER BY RAND() LIMIT 1")
        row = cursor.fetchone()
        if row is None:
            return
        if action == "delete":
            cursor.execute("DELETE FROM items WHERE id = %s", (row[0],))
        else:
            cursor.execute(
                "UPDATE items SET name = %s WHERE id = %s", (f"item {rng.random()}", row[0])
            )


class Workload(RandomWrites):
    """`RandomWrites` on MariaDB, logged in as `info` says."""

    def __init__(self, info: MariaDBInfo, seed: int) -> None:
        super().__init__(seed)
        self._info = info

    def _connect(self) -> pymysql.connections.Connection[Any]:
        return pymysql.connect(**self._info.connect_kwargs())

    def _transaction(self, conn: pymysql.connections.Connection[Any], statements: int) -> None:
        conn.begin()
        with conn.cursor() as cursor:
            for _ in range(statements):
                write_one(cursor, self._rng)
        conn.commit()


def row_key(table: str, values: Iterable[Any]) -> RowKey:
    return table, json.dumps(list(values))


def replay(events: Iterable[Event]) -> dict[RowKey, Row]:
    """The tables as the stream says they are (the README's consumer rules for the row events
    and truncates; the demo's tables change no columns)."""
    state: dict[RowKey, Row] = {}
    for event in events:
        table = event.source.table
        if event.op is Op.TRUNCATE:
            state = {k: v for k, v in state.items() if k[0] != table}
        elif event.op is Op.DELETE:
            state.pop(row_key(table, event.key.values()), None)
        elif event.after is not None:
            state[row_key(table, event.key.values())] = event.after
    return state


def source_rows(source: Source) -> dict[RowKey, Row]:
    """Every row of the captured tables, as the dump's converters give it."""
    chunks = source.chunk_source()
    try:
        state: dict[RowKey, Row] = {}
        for table in source.tables:
            columns = chunks.key_columns(table)
            for row in chunks.read_chunk(Chunk(table, 0)).rows:
                state[row_key(table.name, (row[c] for c in columns))] = row
        return state
    finally:
        chunks.close()


def differences(expected: dict[RowKey, Row], actual: dict[RowKey, Row]) -> list[str]:
    """Per table: how many rows are missing from `actual`, extra in it, or differ."""
    problems = []
    for table in TABLE_NAMES:
        want = {k: v for k, v in expected.items() if k[0] == table}
        have = {k: v for k, v in actual.items() if k[0] == table}
        missing = sum(1 for k, v in want.items() if have.get(k) != v)
        extra = len(set(have) - set(want))
        if missing or extra:
            problems.append(f"{table}: {missing} rows differ or missing, {extra} extra")
    return problems


def binlog_end(info: MariaDBInfo) -> int:
    """The binlog's end now, as the reader's positions spell it."""
    with pymysql.connect(**info.connect_kwargs()) as conn, conn.cursor() as cursor:
        cursor.execute("SHOW MASTER STATUS")
        row = cursor.fetchone()
    if row is None:
        raise RuntimeError("demo: the MariaDB binlog is off")
    return mysql_commit(binlog_file_number(str(row[0])), int(row[1]))


def run_mariadb_demo(
    work_dir: Path | None = None,
    *,
    rows: int = 5000,
    chunk_size: int = 500,
    parallelism: int = 2,
    write_seconds: float = 2.0,
    say: Callable[[str], None] = print,
) -> DemoSummary:
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="dblog-demo-") as tmp:
        base = work_dir or Path(tmp)
        say(f"starting MariaDB and Redis in {base}")
        with MariaDBServer(base / "mariadb") as db, RedisServer(base / "redis") as rds:
            return _demo(
                db.info,
                rds.info.client(),
                base / "events",
                rows,
                chunk_size,
                parallelism,
                write_seconds,
                say,
                started,
            )


def _demo(
    info: MariaDBInfo,
    redis_client: Any,
    events_dir: Path,
    rows: int,
    chunk_size: int,
    parallelism: int,
    write_seconds: float,
    say: Callable[[str], None],
    started: float,
) -> DemoSummary:
    rng = random.Random(42)
    with pymysql.connect(**info.connect_kwargs()) as conn, conn.cursor() as cursor:
        seeded = seed(cursor, rows, rng)
        conn.commit()
    say(
        f"seeded {seeded} rows in accounts (bigint key), orders ((varchar, int) key), "
        "items (binary(16) uuid)"
    )
    os.environ[PASSWORD_ENV] = info.password
    source = source_for(
        parse_source_config(
            {
                "type": "mysql",
                "name": "demo",
                "dsn": f"mysql://{info.user}@{info.host}:{info.port}/{info.dbname}",
                "tables": list(TABLE_NAMES),
                "password_env": PASSWORD_ENV,
                "watermark_database": info.dbname,
            }
        )
    )
    tables = source.tables
    source.ensure_setup()
    store = StateStore(redis_client, source.name)
    output = NdjsonOutput(events_dir)
    tailer = Tailer(
        source, store, output, owner="demo-tailer", settings=TailerSettings(window_ttl_s=30)
    )
    stop_tailer = threading.Event()
    tailer_thread = tailer.start(stop_tailer)
    say(f"binlog tailer running into NDJSON in {events_dir}; writes start")

    workload = Workload(info, seed=7)
    workload.start()
    try:
        say(f"full dump of all tables: chunk size {chunk_size}, parallelism {parallelism}")
        full = DumpRequest(
            "full", DumpKind.ALL, tables, chunk_size=chunk_size, parallelism=parallelism
        )
        store.dumps.create(full)
        if (state := run_dump(store, source.chunk_source, "full")) != "done":
            raise RuntimeError(f"demo: the full dump ended {state}")

        keys = tuple((k,) for k in sorted(rng.sample(range(1, rows + 1), min(20, rows))))
        say(f"repairing {len(keys)} keys of accounts")
        repair = DumpRequest("repair", DumpKind.KEYS, (tables[0],), keys, chunk_size=50)
        store.dumps.create(repair)
        if (state := run_dump(store, source.chunk_source, "repair")) != "done":
            raise RuntimeError(f"demo: the repair ended {state}")
        remaining = max(0.0, write_seconds - (time.monotonic() - started))
        workload.stop.wait(remaining)
    finally:
        workload.join()
    say(f"writes stopped after {workload.writes} transactions; waiting for the tailer")
    end = binlog_end(info)
    wait_until(
        lambda: (store.tailer.load_checkpoint() or 0) >= end - 1, 60, "the tailer catching up"
    )
    stop_tailer.set()
    tailer_thread.join(30)
    output.close()

    events = list(read_events(events_dir))
    problems = differences(source_rows(source), replay(events))
    full_status, repair_status = store.dumps.status("full"), store.dumps.status("repair")
    assert full_status is not None and repair_status is not None
    if repair_status.rows != len(keys):
        problems.append(f"the repair emitted {repair_status.rows} rows, not {len(keys)}")
    say(f"replayed {len(events)} NDJSON events against the source")
    return DemoSummary(
        rows_seeded=seeded,
        writes=workload.writes,
        dump_rows=full_status.rows,
        dump_chunks=full_status.chunks,
        windows_retried=full_status.windows_retried + repair_status.windows_retried,
        repaired_keys=len(keys),
        events_emitted=tailer.stats.events + tailer.stats.dump_rows,
        seconds=time.monotonic() - started,
        equal=not problems,
        differences=problems,
    )
