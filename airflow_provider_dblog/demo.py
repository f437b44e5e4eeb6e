"""`dblog demo`: the whole of DBLog on private servers, with nothing set up by hand.

Starts PostgreSQL and Redis in a temp dir, creates three sample tables (bigint key; composite
(text, int) key; uuid key) with rows that exist before capture starts, runs the tailer into a SQL
target (a second database, monotonic writes), runs a write workload, and while it writes: a full
dump of all tables with several windows in flight, then a repair of keys that were corrupted in
the target on purpose. At the end it checks that the target equals the source, row for row.
"""

from __future__ import annotations

import os
import random
import secrets
import tempfile
import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from airflow_provider_dblog.core.dump_plan import DumpKind, DumpRequest
from airflow_provider_dblog.core.event import TableRef
from airflow_provider_dblog.core.position import parse_pg_lsn
from airflow_provider_dblog.devservices.postgres import PostgresInfo, PostgresServer
from airflow_provider_dblog.devservices.redis import RedisServer
from airflow_provider_dblog.dump.runner import run_dump
from airflow_provider_dblog.outputs.sql_apply import SqlApplyOutput
from airflow_provider_dblog.sources.factory import parse_source_config, source_for
from airflow_provider_dblog.state import StateStore
from airflow_provider_dblog.tailer import Tailer, TailerSettings

SCHEMA = """
CREATE TABLE public.accounts (id bigint PRIMARY KEY, owner text NOT NULL, balance numeric(12,2),
                              active boolean, updated timestamptz DEFAULT now());
CREATE TABLE public.orders (region text, n int, amount numeric, note varchar(200), tags text[],
                            PRIMARY KEY (region, n));
CREATE TABLE public.items (id uuid PRIMARY KEY, name text, attrs jsonb, blob bytea);
"""
TABLES = (TableRef("public", "accounts"), TableRef("public", "orders"), TableRef("public", "items"))
ORDER_KEYS = {"accounts": "id", "orders": "region, n", "items": "id"}
REGIONS = ("eu", "us", "ap", "sa")
PASSWORD_ENV = "DBLOG_DEMO_PASSWORD"


@dataclass
class DemoSummary:
    rows_seeded: int
    writes: int
    dump_rows: int
    dump_chunks: int
    windows_retried: int
    repaired_keys: int
    events_emitted: int
    seconds: float
    equal: bool
    differences: list[str]


class RandomWrites(ABC):
    """Random write transactions of 1-4 statements on the demo's three tables, from a
    connection of its own, until stopped. A subclass says how to connect and write."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)
        self.writes = 0
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="demo-writes", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self) -> None:
        self.stop.set()
        self._thread.join()
        if self.error is not None:
            raise self.error

    @abstractmethod
    def _connect(self) -> AbstractContextManager[Any]: ...

    @abstractmethod
    def _transaction(self, conn: Any, statements: int) -> None:
        """Run `statements` random statements in one transaction and commit it."""

    def _run(self) -> None:
        try:
            with self._connect() as conn:
                while not self.stop.is_set():
                    self._transaction(conn, self._rng.randint(1, 4))
                    self.writes += 1
                    self.stop.wait(0.002)
        except BaseException as exc:
            self.error = exc


class Workload(RandomWrites):
    """`RandomWrites` on PostgreSQL, at `dsn`."""

    def __init__(self, dsn: str, seed: int) -> None:
        super().__init__(seed)
        self._dsn = dsn

    def _connect(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self._dsn, autocommit=True)

    def _transaction(self, conn: psycopg.Connection[Any], statements: int) -> None:
        with conn.transaction():
            for _ in range(statements):
                write_one(conn, self._rng)


def write_one(conn: psycopg.Connection[Any], rng: random.Random) -> None:
    table = rng.choice(("accounts", "orders", "items"))
    action = rng.choices(("insert", "update", "delete"), (4, 5, 1))[0]
    if table == "accounts":
        key = rng.randint(1, 3000)
        if action == "delete":
            conn.execute("DELETE FROM accounts WHERE id = %s", (key,))
        else:
            conn.execute(
                "INSERT INTO accounts (id, owner, balance, active) VALUES (%s, %s, %s, %s) "
                "ON CONFLICT (id) DO UPDATE SET balance = excluded.balance, "
                "active = excluded.active, updated = now()",
                (key, f"owner-{key}", round(rng.uniform(-1e4, 1e4), 2), rng.random() < 0.8),
            )
    elif table == "orders":
        region, n = rng.choice(REGIONS), rng.randint(1, 800)
        if action == "delete":
            conn.execute("DELETE FROM orders WHERE region = %s AND n = %s", (region, n))
        else:
            conn.execute(
                "INSERT INTO orders VALUES (%s, %s, %s, %s, %s) ON CONFLICT (region, n) "
                "DO UPDATE SET amount = excluded.amount, tags = excluded.tags",
                (region, n, rng.randint(1, 10**6) / 100, f"note {n}", [region, str(n % 7)]),
            )
    else:
        if action == "insert":
            conn.execute(
                "INSERT INTO items VALUES (%s, %s, %s, %s)",
                (
                    uuid.UUID(int=rng.getrandbits(128)),
                    "item",
                    psycopg.types.json.Jsonb({"size": rng.randint(1, 9), "tags": ["a", "b"]}),
                    rng.randbytes(8),
                ),
            )
        else:
            row = conn.execute("SELECT id FROM items ORDER BY random() LIMIT 1").fetchone()
            if row is None:
                return
            if action == "delete":
                conn.execute("DELETE FROM items WHERE id = %s", row)
            else:
                conn.execute(
                    "UPDATE items SET name = %s WHERE id = %s", (f"item {rng.random()}", row[0])
                )


def seed(conn: psycopg.Connection[Any], rows: int, rng: random.Random) -> int:
    conn.execute(SCHEMA)
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO accounts (id, owner, balance, active) VALUES (%s, %s, %s, %s)",
            [(i, f"owner-{i}", i * 1.5, i % 3 > 0) for i in range(1, rows + 1)],
        )
        cur.executemany(
            "INSERT INTO orders VALUES (%s, %s, %s, %s, %s)",
            [(REGIONS[i % 4], i // 4 + 1, i / 4, f"note {i}", ["x", str(i)]) for i in range(rows)],
        )
        cur.executemany(
            "INSERT INTO items VALUES (%s, %s, %s, %s)",
            [
                (
                    uuid.UUID(int=rng.getrandbits(128)),
                    f"item {i}",
                    psycopg.types.json.Jsonb({"i": i}),
                    bytes([i % 256]) * 4,
                )
                for i in range(rows)
            ],
        )
    return rows * 3


def snapshot(dsn: str) -> dict[str, list[str]]:
    """Every table as sorted JSON rows, printed by PostgreSQL itself."""
    with psycopg.connect(dsn) as conn:
        return {
            table: [
                r[0]
                for r in conn.execute(
                    f"SELECT row_to_json(t)::text FROM {table} t ORDER BY {order}"
                )
            ]
            for table, order in ORDER_KEYS.items()
        }


def compare(source_dsn: str, target_dsn: str) -> list[str]:
    source, target = snapshot(source_dsn), snapshot(target_dsn)
    problems = []
    for table in ORDER_KEYS:
        missing = set(source[table]) - set(target[table])
        extra = set(target[table]) - set(source[table])
        if missing or extra:
            problems.append(f"{table}: {len(missing)} rows differ or missing, {len(extra)} extra")
    return problems


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"demo: {what} did not happen within {timeout_s}s")
        time.sleep(0.05)


def run_demo(
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
        say(f"starting PostgreSQL and Redis in {base}")
        with PostgresServer(base / "pg") as pg, RedisServer(base / "redis") as rds:
            return _demo(
                pg.info,
                rds.info.client(),
                rows,
                chunk_size,
                parallelism,
                write_seconds,
                say,
                started,
            )


def _demo(
    pg: PostgresInfo,
    redis_client: Any,
    rows: int,
    chunk_size: int,
    parallelism: int,
    write_seconds: float,
    say: Callable[[str], None],
    started: float,
) -> DemoSummary:
    rng = random.Random(42)
    target_dsn = pg.dsn.rsplit("/", 1)[0] + "/dblog_target"
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        seeded = seed(conn, rows, rng)
    with psycopg.connect(pg.admin_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE dblog_target OWNER {pg.user}")
    with psycopg.connect(target_dsn, autocommit=True) as conn:
        conn.execute(SCHEMA)
    say(f"seeded {seeded} rows in accounts (bigint key), orders ((text, int) key), items (uuid)")

    os.environ[PASSWORD_ENV] = pg.password
    slot = f"demo_{secrets.token_hex(3)}"
    source = source_for(
        parse_source_config(
            {
                "type": "postgres",
                "name": "demo",
                "dsn": f"host={pg.host} port={pg.port} dbname={pg.dbname} user={pg.user}",
                "tables": [str(t) for t in TABLES],
                "password_env": PASSWORD_ENV,
                "slot": slot,
            }
        )
    )
    source.ensure_setup()
    store = StateStore(redis_client, source.name)
    output = SqlApplyOutput(target_dsn, monotonic=True)
    tailer = Tailer(
        source, store, output, owner="demo-tailer", settings=TailerSettings(window_ttl_s=30)
    )
    stop_tailer = threading.Event()
    tailer_thread = tailer.start(stop_tailer)
    say("tailer running; writes start")

    workload = Workload(pg.dsn, seed=7)
    workload.start()
    try:
        say(f"full dump of all tables: chunk size {chunk_size}, parallelism {parallelism}")
        full = DumpRequest(
            "full", DumpKind.ALL, TABLES, chunk_size=chunk_size, parallelism=parallelism
        )
        store.dumps.create(full)
        state = run_dump(store, source.chunk_source, "full")
        if state != "done":
            raise RuntimeError(f"demo: the full dump ended {state}")

        corrupted = _corrupt(target_dsn, rng)
        say(f"corrupted {len(corrupted)} rows of accounts in the target; repairing those keys")
        keys = tuple((k,) for k in corrupted)
        repair = DumpRequest("repair", DumpKind.KEYS, (TABLES[0],), keys, chunk_size=50)
        store.dumps.create(repair)
        state = run_dump(store, source.chunk_source, "repair")
        if state != "done":
            raise RuntimeError(f"demo: the repair ended {state}")
        remaining = max(0.0, write_seconds - (time.monotonic() - started))
        workload.stop.wait(remaining)
    finally:
        workload.join()
    say(f"writes stopped after {workload.writes} transactions; waiting for the tailer")
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
        assert row is not None
        end = parse_pg_lsn(row[0])
    wait_until(lambda: _slot_caught_up(pg, slot, end), 60, "the tailer catching up")
    stop_tailer.set()
    tailer_thread.join(30)
    output.close()

    differences = compare(pg.dsn, target_dsn)
    full_status, repair_status = store.dumps.status("full"), store.dumps.status("repair")
    assert full_status is not None and repair_status is not None
    return DemoSummary(
        rows_seeded=seeded,
        writes=workload.writes,
        dump_rows=full_status.rows,
        dump_chunks=full_status.chunks,
        windows_retried=full_status.windows_retried + repair_status.windows_retried,
        repaired_keys=len(keys),
        events_emitted=tailer.stats.events + tailer.stats.dump_rows,
        seconds=time.monotonic() - started,
        equal=not differences,
        differences=differences,
    )


def _slot_caught_up(pg: PostgresInfo, slot: str, lsn: int) -> bool:
    with psycopg.connect(pg.dsn) as conn:
        row = conn.execute(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
            (slot,),
        ).fetchone()
    return row is not None and row[0] is not None and parse_pg_lsn(row[0]) >= lsn


def _corrupt(target_dsn: str, rng: random.Random) -> list[int]:
    with psycopg.connect(target_dsn, autocommit=True) as conn:
        ids = [r[0] for r in conn.execute("SELECT id FROM accounts ORDER BY id LIMIT 2000")]
        chosen = sorted(rng.sample(ids, min(20, len(ids))))
        conn.execute("UPDATE accounts SET owner = 'CORRUPTED' WHERE id = ANY(%s)", (chosen,))
    return chosen
