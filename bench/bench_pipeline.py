"""Pipeline benchmark: log read throughput, log latency under a dump, tailer memory.

Starts a private PostgreSQL 15 and Redis in a temp dir and prints, in one run:

P1  events/s from WAL into NDJSON through our tailer (PostgresLogReader -> Tailer ->
    NdjsonOutput) for a backlog of N inserts written before the tailer starts, and the same WAL
    read by `pg_recvlogical` with pgoutput (the ceiling: server-side decoding, no client work).
P1s and P1u the same for 4-row transactions: P1s four inserts each, P1u sysbench's
    oltp_write_only shape (an update of an indexed column, an update, a delete and an insert),
    with the tailer's CPU per event (its reading thread and its writer's).
P1b the same on a private MariaDB: events/s from the binlog into NDJSON through our tailer
    (MysqlLogReader -> Tailer -> NdjsonOutput), against `mariadb-binlog
    --read-from-remote-server -v` decoding the same binlog (the C ceiling) and against the bare
    BinLogStreamReader loop decoding every row (the library alone). "P1b heavy": ours and the
    ceiling on a second table of heavy types (decimal(20,6), datetime(6), json, blob, enum,
    set and an int key).
P3  log event latency, commit -> durable in the output, p50/p99, without and with a concurrent
    full dump (`dblog dump`, chunk size 5000, in its own process); then with the same dump in
    direct mode into a lake (its rows never pass through the tailer): the floor the machine
    sets, two cores shared by the database, the dump and the tailer.
P4  the peak RSS of a `dblog tail` process through one transaction of 1M inserted rows.
P4m the same on MariaDB: a `dblog tail` process through one MariaDB transaction of 1M inserts.
P4b the peak RSS of a `dblog tail` process through a dump (`dblog dump`, its own process) of
    100k rows of about 3 KB in 50k-row chunks.
E   the sequencer's emission of a pre-read chunk alone: a `Session` meets the hw of a window
    whose 50k rows are already in Redis, until they are durable in NDJSON (per 10k rows).

    .venv/bin/python bench/bench_pipeline.py [--quick] [--only P1,P4]

No figure is checked against a threshold: this measures, it does not test.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pymysql
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.row_event import WriteRowsEvent
from support import (
    Env,
    RunningTailer,
    TimedNdjson,
    dblog_command,
    load_average,
    proc_status_kib,
    reader_form,
    say,
    wait_until,
)

from airflow_provider_dblog.core.event import TableRef
from airflow_provider_dblog.core.log import (
    Idle,
    LogItem,
    TransactionEnd,
    WatermarkWrite,
)
from airflow_provider_dblog.core.position import Position
from airflow_provider_dblog.core.reconciler import Window
from airflow_provider_dblog.core.schema import TableSchema
from airflow_provider_dblog.devservices.mariadb import MariaDBServer
from airflow_provider_dblog.devservices.postgres import SYSTEM_BIN_DIR, PostgresServer
from airflow_provider_dblog.devservices.redis import RedisServer
from airflow_provider_dblog.outputs.ndjson import NdjsonOutput
from airflow_provider_dblog.sources.base import Source
from airflow_provider_dblog.sources.mysql.coordinates import binlog_file_number
from airflow_provider_dblog.state import StateStore, WindowState
from airflow_provider_dblog.tailer import TailerSettings, tune_gc
from airflow_provider_dblog.tailer.metrics import TailerStats
from airflow_provider_dblog.tailer.session import Leadership, Session

PG_RECVLOGICAL = SYSTEM_BIN_DIR / "pg_recvlogical"


@dataclass(frozen=True)
class Sizes:
    p1_rows: int
    p1_rows_per_tx: int
    p1s_rows: int
    p3_rate: float
    p3_seconds: float
    p3_dump_rows: int
    p3_chunk_size: int
    p4_rows: int
    p4b_rows: int
    p4b_chunk_size: int
    emission_rows: int
    emission_runs: int

    @classmethod
    def full(cls) -> Sizes:
        return cls(
            200_000,
            1000,
            100_000,
            200.0,
            10.0,
            1_000_000,
            5000,
            1_000_000,
            100_000,
            50_000,
            50_000,
            3,
        )

    @classmethod
    def quick(cls) -> Sizes:
        return cls(5_000, 1000, 2_000, 200.0, 2.0, 20_000, 5000, 20_000, 5_000, 2_500, 2_000, 1)


@dataclass
class P1Result:
    rows: int
    ours_s: float
    ceiling_s: float
    ceiling_bytes: int
    cpu_s: tuple[float, float] = (0.0, 0.0)
    """The tailer's CPU seconds while it read: its reading thread's and its writer's."""

    def cpu_us_per_event(self) -> str:
        reader, writer = (seconds / self.rows * 1e6 for seconds in self.cpu_s)
        return f"{reader + writer:.1f} us/event (reader {reader:.1f}, writer {writer:.1f})"

    @property
    def ours_rate(self) -> float:
        return self.rows / self.ours_s

    @property
    def ceiling_rate(self) -> float:
        return self.rows / self.ceiling_s


@dataclass
class LatencyResult:
    label: str
    samples: list[float]
    missing: int
    dump_rows_during: int
    seconds: float
    dump_overlapped: bool | None

    def quantile(self, q: float) -> float:
        ordered = sorted(self.samples)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


@dataclass
class P4Result:
    rows: int
    baseline_rss_kib: int
    baseline_hwm_kib: int
    peak_hwm_kib: int
    seconds: float


# -- P1: read throughput ----------------------------------------------------------------------


def bench_p1(env: Env, rows: int, rows_per_tx: int, name: str = "bench_p1") -> P1Result:
    """The tailer and pg_recvlogical reading one backlog of `rows` inserts committed
    `rows_per_tx` a transaction: 1000 measures rows, 4 (sysbench's size) a transaction's cost."""
    return read_backlog(env, name, rows, *inserts_backlog(env, name, rows, rows_per_tx))


def inserts_backlog(env: Env, name: str, rows: int, rows_per_tx: int) -> tuple[str, str, str]:
    """P1's table, made here, and the procedure and call that write its backlog of `rows`
    inserts, `rows_per_tx` a transaction: (table, procedure, call)."""
    table = f"{name}_rows"
    env.sql(
        f"CREATE TABLE public.{table} (id bigint PRIMARY KEY, name text, n int, ts timestamptz)"
    )
    say(f"{name}: writing a backlog of {rows} inserts ({rows_per_tx} per tx)")
    fill = (
        f"CREATE PROCEDURE {name}_fill(total bigint, per_tx bigint) LANGUAGE plpgsql AS $$"
        " BEGIN FOR lo IN 1..total BY per_tx LOOP"
        f" INSERT INTO {table} SELECT i, 'name-' || i, i % 1000, now()"
        "  FROM generate_series(lo, least(lo + per_tx - 1, total)) AS i;"
        " COMMIT; END LOOP; END $$"
    )
    return table, fill, f"CALL {name}_fill({rows}, {rows_per_tx})"


def bench_p1u(env: Env, rows: int, name: str = "bench_p1u") -> P1Result:
    """The tailer and pg_recvlogical reading a backlog of `rows` events in transactions of
    sysbench's oltp_write_only (`oltp_backlog`)."""
    return read_backlog(env, name, rows, *oltp_backlog(env, name, rows))


def oltp_backlog(env: Env, name: str, rows: int) -> tuple[str, str, str]:
    """A table of sysbench's columns, made and filled here, and the procedure and call that
    write a backlog of `rows` events in transactions of sysbench's oltp_write_only: an update
    of the indexed `k`, an update of `c`, a delete and an insert of the deleted id:
    (table, procedure, call)."""
    table, size = f"{name}_rows", min(100_000, max(1_000, rows))
    env.sql(
        f"CREATE TABLE public.{table} (id int PRIMARY KEY, k int NOT NULL DEFAULT 0,"
        " c char(120) NOT NULL DEFAULT '', pad char(60) NOT NULL DEFAULT '')"
    )
    env.sql(f"CREATE INDEX ON public.{table} (k)")
    env.sql(
        f"INSERT INTO {table} SELECT i, i % 1000, md5(i::text) || md5((-i)::text), md5(i::text)"
        f" FROM generate_series(1, {size}) AS i"
    )
    say(f"{name}: writing a backlog of {rows} events (update, update, delete, insert per tx)")
    fill = (
        f"CREATE PROCEDURE {name}_fill(transactions int) LANGUAGE plpgsql AS $$"
        " DECLARE a int; b int; d int; BEGIN FOR i IN 1..transactions LOOP"
        f" a := 1 + (i::bigint * 7919) % {size}; b := 1 + (i::bigint * 104729) % {size};"
        f" d := 1 + (i::bigint * 15485863) % {size};"
        f" UPDATE {table} SET k = k + 1 WHERE id = a;"
        f" UPDATE {table} SET c = md5(i::text) || md5(a::text) WHERE id = b;"
        f" DELETE FROM {table} WHERE id = d;"
        f" INSERT INTO {table} VALUES (d, i % 1000, md5(d::text) || md5(i::text), md5(i::text));"
        " COMMIT; END LOOP; END $$"
    )
    return table, fill, f"CALL {name}_fill({rows // 4})"


def read_backlog(env: Env, name: str, rows: int, table: str, procedure: str, call: str) -> P1Result:
    """Slots for the tailer and the ceiling, a backlog of `rows` events written by `call` (of
    `procedure`) into `table`, then pg_recvlogical and the tailer each reading all of it."""
    ceiling_slot = f"{name}_ceiling"
    source = env.source(name, [f"public.{table}"])
    source.ensure_setup()
    env.sql("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (ceiling_slot,))
    env.sql(procedure)
    env.sql(call)
    end_lsn = env.wal_lsn()

    say(f"{name}: pg_recvlogical (pgoutput) reading the backlog")
    ceiling_file = env.base / f"{name}-ceiling.bin"
    command = [
        str(PG_RECVLOGICAL),
        "--dbname",
        env.libpq_dsn,
        "--slot",
        ceiling_slot,
        "--start",
        "--no-loop",
        "--option",
        "proto_version=1",
        "--option",
        f"publication_names={name}",
        "--endpos",
        f"{end_lsn >> 32:X}/{end_lsn & 0xFFFFFFFF:X}",
        "--file",
        str(ceiling_file),
    ]
    started = time.monotonic()
    subprocess.run(
        command,
        check=True,
        timeout=600,
        env={**os.environ, "PGPASSWORD": env.pg.password},
    )
    ceiling_s = time.monotonic() - started
    env.drop_slot(ceiling_slot)

    say(f"{name}: our tailer reading the backlog into NDJSON")
    output = TimedNdjson(env.base / f"{name}-out")
    started = time.monotonic()
    with RunningTailer(env, source, output) as tailer:
        wait_until(lambda: output.durable_events >= rows, 600, f"{name} tailer catch-up")
        ours_s = time.monotonic() - started
        cpu_s = tailer.thread_cpu_s()
    env.drop_slot(name)
    return P1Result(rows, ours_s, ceiling_s, ceiling_file.stat().st_size, cpu_s)


# -- P1b: read throughput on MariaDB ----------------------------------------------------------


@dataclass
class P1bResult:
    rows: int
    ours_s: float
    ceiling_s: float
    ceiling_bytes: int
    library_s: float | None = None
    """The bare library loop (the bench table only)."""

    @property
    def ours_rate(self) -> float:
        return self.rows / self.ours_s

    @property
    def ceiling_rate(self) -> float:
        return self.rows / self.ceiling_s

    @property
    def library_rate(self) -> float:
        assert self.library_s is not None
        return self.rows / self.library_s


@dataclass(frozen=True)
class Backlog:
    """Rows written into one table's binlog after its tailer saved where capture starts."""

    source: Source
    rows: int
    start_pos: int
    end_pos: int
    files: tuple[str, ...]
    start_gtid: str


HEAVY_TABLE = (
    "CREATE TABLE p1b_heavy (id int PRIMARY KEY, amount decimal(20,6), at datetime(6), doc json,"
    " data blob, state enum('new','paid','shipped','void'), tags set('a','b','c','d'))"
)
"""P1b heavy: the types whose decoding costs most, one of each beside an int key."""

STATES = ("new", "paid", "shipped", "void")
TAGS = ("a", "a,b", "b,c,d", "")
EPOCH = datetime(2026, 1, 1)


def heavy_row(i: int) -> tuple[Any, ...]:
    return (
        i,
        f"{i * 7919 % 10**14}.{i % 10**6:06d}",
        EPOCH + timedelta(seconds=i, microseconds=i % 10**6),
        json.dumps(
            {
                "id": i,
                "name": f"name-{i}",
                "n": i % 1000,
                "tags": ["x", "y"],
                "ok": True,
            }
        ),
        i.to_bytes(8, "big") * 8,
        STATES[i % 4],
        TAGS[i % 4],
    )


def binlog_backlog(
    env: Env,
    name: str,
    create: str,
    insert: str,
    row: Callable[[int], tuple[Any, ...]],
    sizes: Sizes,
) -> Backlog:
    """The table `create` makes, captured by source `name`: a first tailer run saves where
    capture starts (a reader without a resume point starts at the log's end), then `insert`
    writes the backlog of `row(i)` in transactions of `p1_rows_per_tx`."""
    assert env.mariadb is not None
    table = create.split()[2]
    env.mariadb_one(create)
    source = env.source(name, [table], "mysql")
    source.ensure_setup()
    store = env.store(source.name)
    with RunningTailer(env, source, TimedNdjson(env.base / f"{name}-start")):
        wait_until(lambda: store.tailer.load_resume() is not None, 60, f"{name} capture start")
    start_file, start_pos = env.mariadb_one("SHOW MASTER STATUS")[:2]
    (start_gtid,) = env.mariadb_one("SELECT @@gtid_binlog_pos")
    say(f"{name}: writing a backlog of {sizes.p1_rows} inserts ({sizes.p1_rows_per_tx} per tx)")
    with (
        pymysql.connect(**env.mariadb.connect_kwargs()) as conn,
        conn.cursor() as cursor,
    ):
        for start in range(0, sizes.p1_rows, sizes.p1_rows_per_tx):
            end = min(start + sizes.p1_rows_per_tx, sizes.p1_rows)
            cursor.executemany(insert, [row(i) for i in range(start + 1, end + 1)])
            conn.commit()
    end_file, end_pos = env.mariadb_one("SHOW MASTER STATUS")[:2]
    files = (start_file,) if end_file == start_file else (start_file, end_file)
    return Backlog(source, sizes.p1_rows, start_pos, end_pos, files, start_gtid)


def mariadb_binlog_s(env: Env, backlog: Backlog, result_file: Path) -> float:
    """Seconds `mariadb-binlog --read-from-remote-server -v` takes to decode the backlog."""
    assert env.mariadb is not None
    say(f"{backlog.source.name}: mariadb-binlog --read-from-remote-server -v decoding it")
    command = [
        str(shutil.which("mariadb-binlog") or "mariadb-binlog"),
        "--read-from-remote-server",
        f"--socket={env.mariadb.socket}",
        "--user=root",  # over the Unix socket, without a password (MariaDBServer's admin)
        "--verbose",
        "--base64-output=DECODE-ROWS",
        f"--start-position={backlog.start_pos}",
        f"--stop-position={backlog.end_pos}",
        f"--result-file={result_file}",
        *backlog.files,
    ]
    started = time.monotonic()
    subprocess.run(command, check=True, timeout=600, capture_output=True)
    return time.monotonic() - started


def library_loop_s(env: Env, backlog: Backlog, table: str) -> float:
    """Seconds the bare BinLogStreamReader loop takes to decode every row of the backlog."""
    assert env.mariadb is not None
    say(f"{backlog.source.name}: the bare BinLogStreamReader loop decoding it")
    stream = BinLogStreamReader(
        connection_settings=env.mariadb.connect_kwargs(),
        server_id=0x5DB20000 + os.getpid() % 0xFFFF,
        is_mariadb=True,
        auto_position=backlog.start_gtid,
        only_events=[WriteRowsEvent],
        only_tables=[table],
        # Blocking, as our reader reads: a non-blocking dump on MariaDB is reset by the server
        # every ~0.1 s and the library then re-reads from its start, counting rows twice.
        blocking=True,
        slave_heartbeat=1,
    )
    decoded = 0
    started = time.monotonic()
    try:
        for event in stream:
            decoded += len(event.rows)
            if decoded >= backlog.rows:
                break
    finally:
        stream.close()
    if decoded < backlog.rows:
        raise RuntimeError(f"bench: the library loop decoded {decoded} of {backlog.rows} rows")
    return time.monotonic() - started


def tailer_s(env: Env, backlog: Backlog) -> float:
    """Seconds our tailer takes to make the backlog durable in NDJSON; says the CPU its two
    threads took a row, steadier than the rate on a loaded machine."""
    say(f"{backlog.source.name}: our tailer reading it into NDJSON")
    output = TimedNdjson(env.base / f"{backlog.source.name}-out")
    started = time.monotonic()
    with RunningTailer(env, backlog.source, output) as tailer:
        wait_until(lambda: output.durable_events >= backlog.rows, 600, "P1b tailer catch-up")
        elapsed = time.monotonic() - started
        session, writer = (cpu / backlog.rows * 1e6 for cpu in tailer.thread_cpu_s())
    say(f"{backlog.source.name}: CPU a row {session:.1f} us session thread, {writer:.1f} us writer")
    return elapsed


def bench_p1b(env: Env, sizes: Sizes) -> P1bResult:
    """P1 on MariaDB: the bench table's backlog read by `mariadb-binlog -v`, the library's
    bare loop and our tailer."""
    backlog = binlog_backlog(
        env,
        "bench_p1b",
        "CREATE TABLE p1b_rows (id bigint PRIMARY KEY, name varchar(40), n int, ts datetime(6))",
        "INSERT INTO p1b_rows VALUES (%s, %s, %s, UTC_TIMESTAMP(6))",
        lambda i: (i, f"name-{i}", i % 1000),
        sizes,
    )
    ceiling_file = env.base / "p1b-ceiling.sql"
    ceiling_s = mariadb_binlog_s(env, backlog, ceiling_file)
    library_s = library_loop_s(env, backlog, "p1b_rows")
    ours_s = tailer_s(env, backlog)
    return P1bResult(backlog.rows, ours_s, ceiling_s, ceiling_file.stat().st_size, library_s)


def bench_p1b_heavy(env: Env, sizes: Sizes) -> P1bResult:
    """P1b on a table of heavy types (`HEAVY_TABLE`): `mariadb-binlog -v` and our tailer."""
    backlog = binlog_backlog(
        env,
        "bench_p1b_heavy",
        HEAVY_TABLE,
        "INSERT INTO p1b_heavy VALUES (%s, %s, %s, %s, %s, %s, %s)",
        heavy_row,
        sizes,
    )
    ceiling_file = env.base / "p1b-heavy-ceiling.sql"
    ceiling_s = mariadb_binlog_s(env, backlog, ceiling_file)
    ours_s = tailer_s(env, backlog)
    return P1bResult(backlog.rows, ours_s, ceiling_s, ceiling_file.stat().st_size)


# -- P3: latency with and without a dump ------------------------------------------------------


class PacedWriter:
    """Commits single-row inserts at `rate` per second. Each row's `created` is the server's
    clock_timestamp() at insert, just before its commit: a client-side time noted after
    COMMIT returns would be late whenever this thread waits for the GIL."""

    def __init__(self, dsn: str, rate: float, seconds: float) -> None:
        self._dsn, self._rate, self._seconds = dsn, rate, seconds
        self.committed: list[int] = []

    def run(self) -> None:
        with psycopg.connect(self._dsn, autocommit=True) as conn:
            started = time.monotonic()
            total = int(self._rate * self._seconds)
            for i in range(total):
                delay = started + i / self._rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                row = conn.execute(
                    "INSERT INTO p3_latency (payload) VALUES (%s) RETURNING id",
                    (f"row {i}",),
                ).fetchone()
                assert row is not None
                self.committed.append(row[0])


def settle(env: Env) -> None:
    """Write what the server and the phase before left in the page cache out to disk: the
    throwaway server runs without fsync, so the kernel would otherwise flush the filled table
    (and the hint bits a dump sets) about 30 s later, in the middle of a measurement, and the
    output's fsyncs would wait behind it (250 ms stalls seen)."""
    with psycopg.connect(env.pg.admin_dsn, autocommit=True) as conn:
        conn.execute("CHECKPOINT")
    os.sync()


def measure_latency(
    env: Env,
    output: TimedNdjson,
    sizes: Sizes,
    label: str,
    during: Callable[[], int] | None,
) -> LatencyResult:
    writer = PacedWriter(env.pg.dsn, sizes.p3_rate, sizes.p3_seconds)
    dump_before = during() if during else 0
    started = time.monotonic()
    writer.run()
    seconds = time.monotonic() - started
    rows_during = (during() - dump_before) if during else 0
    committed = writer.committed
    with contextlib.suppress(TimeoutError):  # what never arrives is reported as missing
        wait_until(lambda: all(k in output.latency for k in committed), 120, "P3 catch-up")
    samples = [output.latency[k] for k in committed if k in output.latency]
    return LatencyResult(label, samples, len(committed) - len(samples), rows_during, seconds, None)


def bench_p3(env: Env, sizes: Sizes) -> list[LatencyResult]:
    """Without a dump, with a sequenced dump (its rows pass through the tailer at each hw),
    and with the same dump in direct mode (its rows go into a lake, the tailer only records
    each window): the last is the machine's floor, the same reads and load without the
    tailer's emission."""
    name = "bench_p3"
    say(f"P3: filling the dump table with {sizes.p3_dump_rows} rows")
    env.sql(
        "CREATE TABLE public.p3_latency (id bigserial PRIMARY KEY, payload text,"
        " created double precision DEFAULT extract(epoch FROM clock_timestamp()))"
    )
    env.sql("CREATE TABLE public.p3_dump (id bigint PRIMARY KEY, name text, n int, pad text)")
    env.sql(
        "INSERT INTO p3_dump SELECT i, 'name-' || i, i % 1000, repeat('x', 40)"
        f" FROM generate_series(1, {sizes.p3_dump_rows}) AS i"
    )
    env.sql("VACUUM ANALYZE p3_dump")
    tables = ["public.p3_latency", "public.p3_dump"]
    source = env.source(name, tables)
    source.ensure_setup()
    toml = env.write_toml(name, tables, env.base / "p3-unused")
    lake_toml = env.base / f"{name}-lake.toml"
    lake_toml.write_text(toml.read_text() + f'\n[lake]\nroot = "{env.base / "p3-lake"}"\n')
    output = TimedNdjson(env.base / "p3-out", timed_table="p3_latency")
    results = []
    with RunningTailer(env, source, output):
        store = env.store(name)
        wait_until(lambda: store.tailer.health() is not None, 30, "P3 tailer heartbeat")
        say(f"P3: {sizes.p3_rate:.0f} commits/s for {sizes.p3_seconds:.0f}s, no dump")
        settle(env)
        results.append(measure_latency(env, output, sizes, "no dump", None))
        for mode, config in (("sequenced", toml), ("direct", lake_toml)):
            say(f"P3: the same with a full {mode} dump (chunk size {sizes.p3_chunk_size})")
            settle(env)
            results.append(latency_with_dump(env, output, store, sizes, mode, config))
    env.drop_slot(name)
    return results


def latency_with_dump(
    env: Env,
    output: TimedNdjson,
    store: StateStore,
    sizes: Sizes,
    mode: str,
    config: Path,
) -> LatencyResult:
    dump_id = f"p3-{mode}"
    with (env.base / f"{dump_id}.log").open("wb") as dump_log:
        dump = subprocess.Popen(
            [
                *dblog_command(),
                "dump",
                "--config",
                str(config),
                "--table",
                "public.p3_dump",
                "--chunk-size",
                str(sizes.p3_chunk_size),
                "--mode",
                mode,
                "--dump-id",
                dump_id,
            ],
            stdout=dump_log,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_until(lambda: dump_rows(store, dump_id) > 0, 60, f"first {mode} chunk")
        label = "with dump" if mode == "sequenced" else "with direct dump"
        result = measure_latency(env, output, sizes, label, lambda: dump_rows(store, dump_id))
        result.dump_overlapped = dump.poll() is None
        return result
    finally:
        if dump.poll() is None:
            store.dumps.cancel(dump_id)
        dump.wait(60)


def dump_rows(store: StateStore, dump_id: str) -> int:
    """The rows the dump has completed so far (its chunks' counters)."""
    status = store.dumps.status(dump_id)
    return 0 if status is None else int(status.rows)


# -- P4: tailer memory through a 1M-row transaction -------------------------------------------


def bench_p4(env: Env, sizes: Sizes) -> P4Result:
    """A `dblog tail` process through one transaction of `p4_rows` inserts, caught up when its
    slot's confirmed position passes the transaction's end."""
    name = "bench_p4"
    env.sql("CREATE TABLE public.p4_big (id bigint PRIMARY KEY, name text, n int)")
    toml = env.write_toml(name, ["public.p4_big"], env.base / "p4-out")

    def transaction() -> Callable[[], bool]:
        env.sql(
            "INSERT INTO p4_big SELECT i, 'name-' || i, i % 1000"
            f" FROM generate_series(1, {sizes.p4_rows}) AS i"
        )
        end_lsn = env.wal_lsn()
        return lambda: env.confirmed_flush(name) >= end_lsn

    ready = env.store(name).tailer.health
    return _tail_through(env, name, toml, sizes.p4_rows, "", ready, transaction)


def bench_p4m(env: Env, sizes: Sizes) -> P4Result:
    """P4 on MariaDB, caught up when the tailer's saved resume point passes the transaction's
    end."""
    name = "bench_p4m"
    env.mariadb_one("CREATE TABLE p4m_big (id bigint PRIMARY KEY, name varchar(40), n int)")
    env.source(name, ["p4m_big"], "mysql").ensure_setup()
    toml = env.write_toml(name, ["p4m_big"], env.base / "p4m-out", "mysql")
    store = env.store(name)

    def transaction() -> Callable[[], bool]:
        env.mariadb_one(
            "INSERT INTO p4m_big SELECT seq, CONCAT('name-', seq), seq % 1000"
            f" FROM seq_1_to_{sizes.p4_rows}"
        )
        end_file, end_offset = env.mariadb_one("SHOW MASTER STATUS")[:2]
        end = (binlog_file_number(str(end_file)), int(end_offset))

        def caught_up() -> bool:
            saved = json.loads(store.tailer.load_resume() or "{}")
            return (binlog_file_number(saved["file"]), saved["offset"]) >= end

        return caught_up

    # A reader without a saved point starts at the log's end: the insert waits for that point.
    return _tail_through(env, name, toml, sizes.p4_rows, "m", store.tailer.load_resume, transaction)


def _tail_through(
    env: Env,
    name: str,
    toml: Path,
    rows: int,
    suffix: str,
    ready: Callable[[], object],
    transaction: Callable[[], Callable[[], bool]],
) -> P4Result:
    """Starts `dblog tail` on `toml`, runs `transaction` once `ready` answers (not None), and
    waits for the condition it returns; the tailer's RSS before and its peak."""
    tail_log = (env.base / f"p4{suffix}-tail.log").open("wb")
    tail = subprocess.Popen(
        [
            *dblog_command(),
            "tail",
            "--config",
            str(toml),
            "--owner",
            f"bench-p4{suffix}",
        ],
        stdout=tail_log,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_until(lambda: ready() is not None, 60, f"the P4{suffix} tailer's start")
        baseline_rss = proc_status_kib(tail.pid, "VmRSS")
        baseline_hwm = proc_status_kib(tail.pid, "VmHWM")
        say(f"P4{suffix}: one transaction of {rows} inserts; tailer pid {tail.pid}")
        caught_up = transaction()
        started = time.monotonic()
        wait_until(caught_up, 900, f"P4{suffix} tailer catch-up")
        seconds = time.monotonic() - started
        peak_hwm = proc_status_kib(tail.pid, "VmHWM")
    finally:
        tail.terminate()
        tail.wait(60)
        tail_log.close()
    return P4Result(rows, baseline_rss, baseline_hwm, peak_hwm, seconds)


# -- P4b: tailer memory through a dump of wide rows ------------------------------------------


@dataclass
class P4bResult:
    rows: int
    chunk_size: int
    row_bytes: int
    baseline_rss_kib: int
    baseline_hwm_kib: int
    peak_hwm_kib: int
    seconds: float


def bench_p4b(env: Env, sizes: Sizes) -> P4bResult:
    """A `dblog tail` process, then a `dblog dump` of a table of ~3 KB rows filled before the
    tailer started (so only the dump's rows pass through it): the tailer's VmHWM after."""
    name = "bench_p4b"
    env.sql("CREATE TABLE public.p4b_wide (id bigint PRIMARY KEY, pad text)")
    env.sql(
        "INSERT INTO p4b_wide SELECT i, repeat(md5(i::text), 94)"
        f" FROM generate_series(1, {sizes.p4b_rows}) AS i"
    )
    row_bytes = env.sql("SELECT avg(octet_length(pad))::int FROM p4b_wide")
    toml = env.write_toml(name, ["public.p4b_wide"], env.base / "p4b-out")
    tail_log = (env.base / "p4b-tail.log").open("wb")
    tail = subprocess.Popen(
        [*dblog_command(), "tail", "--config", str(toml), "--owner", "bench-p4b"],
        stdout=tail_log,
        stderr=subprocess.STDOUT,
    )
    try:
        store = env.store(name)
        wait_until(lambda: store.tailer.health() is not None, 60, "the P4b tailer's heartbeat")
        baseline_rss = proc_status_kib(tail.pid, "VmRSS")
        baseline_hwm = proc_status_kib(tail.pid, "VmHWM")
        say(
            f"P4b: a dump of {sizes.p4b_rows} rows of ~{row_bytes} bytes in "
            f"{sizes.p4b_chunk_size}-row chunks; tailer pid {tail.pid}"
        )
        started = time.monotonic()
        dump_command = [*dblog_command(), "dump", "--config", str(toml), "--table"]
        dump_command += ["public.p4b_wide", "--chunk-size", str(sizes.p4b_chunk_size)]
        with (env.base / "p4b-dump.log").open("wb") as dump_log:
            done = subprocess.run(
                [*dump_command, "--dump-id", "p4b"],
                stdout=dump_log,
                stderr=subprocess.STDOUT,
                timeout=900,
            )
        if done.returncode != 0:
            raise RuntimeError(f"bench: the P4b dump failed, see {env.base / 'p4b-dump.log'}")
        seconds = time.monotonic() - started
        peak_hwm = proc_status_kib(tail.pid, "VmHWM")
    finally:
        tail.terminate()
        tail.wait(60)
        tail_log.close()
    env.drop_slot(name)
    return P4bResult(
        sizes.p4b_rows,
        sizes.p4b_chunk_size,
        row_bytes,
        baseline_rss,
        baseline_hwm,
        peak_hwm,
        seconds,
    )


# -- E: the sequencer's emission of a pre-read chunk ------------------------------------------


class WindowAtHw:
    """A log of one window: its lw, then (timed from here) its hw, then `Idle` until the window
    is closed in the store, i.e. until its rows are durable in the output."""

    def __init__(self, store: StateStore, window: Window, lw: str, hw: str) -> None:
        self._store, self._window, self._lw, self._hw = store, window, lw, hw
        self.seconds = 0.0

    def items(self) -> Iterator[LogItem]:
        yield WatermarkWrite(self._lw, Position(10, 0))
        yield TransactionEnd(10)
        started = time.perf_counter()
        yield WatermarkWrite(self._hw, Position(20, 0))
        yield TransactionEnd(20)
        while True:
            status = self._store.windows.state(self._window.window_id)
            if status is not None and status.state.ended:
                break
            yield Idle(20)
            time.sleep(0.0002)
        self.seconds = time.perf_counter() - started

    def acknowledge(self, commit: int) -> None:
        return None

    def describe(self, table: TableRef) -> TableSchema:
        raise AssertionError(f"{table} is never described here")

    def close(self) -> None:
        pass


def emission_rows(count: int) -> list[dict[str, Any]]:
    """Rows as the P2 table's reader gives them (about 150 bytes of JSON each)."""
    return [
        {
            "id": i,
            "name": f"name-{i}",
            "n": i % 1000,
            "amount": f"{i % 100000 / 100:.2f}",
            "ts": "2026-01-01T00:00:00+00:00",
            "pad": "x" * 40,
        }
        for i in range(1, count + 1)
    ]


def bench_emission(env: Env, sizes: Sizes) -> list[float]:
    """Seconds per 10k rows of each run: a `Session` in this thread (the sequencer's thread)
    meeting the hw of a window whose rows a reader already stored, until they are durable."""
    rows = emission_rows(sizes.emission_rows)
    table = TableRef("public", "emission")
    results = []
    for run in range(sizes.emission_runs):
        store = env.store(f"bench_emission_{run}")
        window = Window(f"emission-{run}", "emission", table)
        lw, hw = f"lw-{run}", f"hw-{run}"
        store.windows.register(window, lw, hw, {}, ttl_s=600)
        stored = store.windows.append_rows(window.window_id, 0, rows, ("id",), frozenset())
        assert stored == len(rows)
        token = store.tailer.acquire_lease("bench", 60_000)
        assert token is not None
        reader = WindowAtHw(store, window, lw, hw)
        output = NdjsonOutput(env.base / f"emission-{run}")
        session = Session(
            source_name=f"bench_emission_{run}",
            db="bench",
            reader=reader,
            store=store,
            output=output,
            leadership=Leadership("bench", token),
            settings=TailerSettings(),
            stats=TailerStats(),
        )
        try:
            session.run(threading.Event())
        finally:
            output.close()
        status = store.windows.state(window.window_id)
        if status is None or status.state is not WindowState.CLOSED:
            raise RuntimeError(f"bench: the emission window ended {status}")
        results.append(reader.seconds / len(rows) * 10_000)
    return results


# -- report -----------------------------------------------------------------------------------


def p3_ratio(p3: list[LatencyResult], index: int = 1) -> float:
    """p99 with a dump (the sequenced one, or `index`) over p99 without."""
    return p3[index].quantile(0.99) / max(p3[0].quantile(0.99), 1e-9)


def report(
    p1: P1Result | None,
    p1s: P1Result | None,
    p1u: P1Result | None,
    p1b: P1bResult | None,
    p1b_heavy: P1bResult | None,
    p3: list[LatencyResult] | None,
    p4: P4Result | None,
    p4m: P4Result | None,
    p4b: P4bResult | None,
    emission: list[float] | None,
) -> str:
    """The table of every figure measured (those left out by `--only` are not shown)."""
    mib = 1024.0
    lines = ["", f"{'figure':<44} {'value':>14}", "-" * 59]
    if p1 is not None:
        lines += [
            f"{'P1 backlog (inserts)':<44} {p1.rows:>14,}",
            f"{'P1 ours: tailer -> NDJSON (events/s)':<44} {p1.ours_rate:>14,.0f}",
            f"{'P1 ceiling: pg_recvlogical pgoutput (ev/s)':<44} {p1.ceiling_rate:>14,.0f}",
            f"{'P1 ratio ours/ceiling':<44} {p1.ours_rate / p1.ceiling_rate:>14.3f}",
        ]
    if p1s is not None:
        lines += [
            f"{'P1s backlog (inserts, 4 a transaction)':<44} {p1s.rows:>14,}",
            f"{'P1s ours: tailer -> NDJSON (events/s)':<44} {p1s.ours_rate:>14,.0f}",
            f"{'P1s ceiling: pg_recvlogical (events/s)':<44} {p1s.ceiling_rate:>14,.0f}",
            f"{'P1s ratio ours/ceiling':<44} {p1s.ours_rate / p1s.ceiling_rate:>14.3f}",
        ]
    if p1u is not None:
        lines += [
            f"{'P1u backlog (update, update, delete, insert)':<44} {p1u.rows:>14,}",
            f"{'P1u ours: tailer -> NDJSON (events/s)':<44} {p1u.ours_rate:>14,.0f}",
            f"{'P1u ceiling: pg_recvlogical (events/s)':<44} {p1u.ceiling_rate:>14,.0f}",
            f"{'P1u ratio ours/ceiling':<44} {p1u.ours_rate / p1u.ceiling_rate:>14.3f}",
            f"{'P1u tailer CPU (us/event, both threads)':<44} "
            f"{sum(p1u.cpu_s) / p1u.rows * 1e6:>14.1f}",
        ]
    if p1b is not None:
        lines += [
            f"{'P1b ours: binlog tailer -> NDJSON (ev/s)':<44} {p1b.ours_rate:>14,.0f}",
            f"{'P1b ceiling: mariadb-binlog -v (ev/s)':<44} {p1b.ceiling_rate:>14,.0f}",
            f"{'P1b library: BinLogStreamReader loop (ev/s)':<44} {p1b.library_rate:>14,.0f}",
            f"{'P1b ratio ours/ceiling':<44} {p1b.ours_rate / p1b.ceiling_rate:>14.3f}",
            f"{'P1b ratio ours/library':<44} {p1b.ours_rate / p1b.library_rate:>14.3f}",
        ]
    if p1b_heavy is not None:
        h = p1b_heavy
        lines += [
            f"{'P1b heavy ours: tailer -> NDJSON (ev/s)':<44} {h.ours_rate:>14,.0f}",
            f"{'P1b heavy ceiling: mariadb-binlog -v (ev/s)':<44} {h.ceiling_rate:>14,.0f}",
            f"{'P1b heavy ratio ours/ceiling':<44} {h.ours_rate / h.ceiling_rate:>14.3f}",
        ]
    for result in p3 or ():
        tag = f"P3 latency {result.label}"
        lines.append(
            f"{tag + ' p50/p99 (ms)':<44} "
            f"{f'{result.quantile(0.5):.1f} / {result.quantile(0.99):.1f}':>14}"
        )
        extra = f"n={len(result.samples)}, min={min(result.samples, default=0) * 1000:.1f} ms"
        extra += f", missing={result.missing}"
        if result.dump_overlapped is not None:
            overlap = "whole run" if result.dump_overlapped else "ended early"
            extra += (
                f", dump rows meanwhile={result.dump_rows_during:,}"
                f" ({result.dump_rows_during / result.seconds:,.0f}/s, {overlap})"
            )
        lines.append(f"{'':<6}{extra}")
    if p3 is not None:
        lines.append(f"{'P3 ratio p99 with dump / without':<44} {p3_ratio(p3):>14.1f}")
        lines.append(f"{'P3 floor: p99 with direct dump / without':<44} {p3_ratio(p3, 2):>14.1f}")
    for label, found in (("P4", p4), ("P4m", p4m)):
        if found is not None:
            lines += [
                f"{f'{label} transaction size (rows)':<44} {found.rows:>14,}",
                f"{f'{label} tailer baseline RSS (MiB)':<44} {found.baseline_rss_kib / mib:>14.1f}",
                f"{f'{label} tailer peak RSS, VmHWM (MiB)':<44} {found.peak_hwm_kib / mib:>14.1f}",
                f"{'':<6}peak before the transaction {found.baseline_hwm_kib / mib:.1f} MiB; "
                f"caught up in {found.seconds:.1f}s ({found.rows / found.seconds:,.0f} events/s)",
            ]
    if p4b is not None:
        lines += [
            f"{'P4b dump rows (bytes each, chunk size)':<44} "
            f"{f'{p4b.rows:,} ({p4b.row_bytes}, {p4b.chunk_size:,})':>14}",
            f"{'P4b tailer baseline RSS (MiB)':<44} {p4b.baseline_rss_kib / mib:>14.1f}",
            f"{'P4b tailer peak RSS, VmHWM (MiB)':<44} {p4b.peak_hwm_kib / mib:>14.1f}",
            f"{'':<6}peak before the dump {p4b.baseline_hwm_kib / mib:.1f} MiB; "
            f"dump done in {p4b.seconds:.1f}s ({p4b.rows / p4b.seconds:,.0f} rows/s)",
        ]
    if emission is not None:
        lines.append(
            f"{'E emission of a pre-read chunk (ms/10k rows)':<44} "
            f"{' / '.join(f'{s * 1000:.1f}' for s in emission):>14}"
        )
    return "\n".join(lines)


FIGURES = ("P1", "P1s", "P1u", "P1b", "P3", "P4", "P4m", "P4b", "E")


def parse_only(text: str | None) -> frozenset[str]:
    """`--only P1,P4` -> {"P1", "P4"}; every figure without the flag."""
    if text is None:
        return frozenset(FIGURES)
    chosen = frozenset(part.strip() for part in text.split(",") if part.strip())
    unknown = sorted(chosen - set(FIGURES))
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(
            f"--only takes a comma-separated list of {', '.join(FIGURES)}, got {text!r}"
        )
    return chosen


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="small sizes: a check that it works, not figures"
    )
    parser.add_argument(
        "--only",
        type=parse_only,
        default=parse_only(None),
        metavar="P1,P4",
        help=f"measure only these figures (of {', '.join(FIGURES)}); all by default",
    )
    args = parser.parse_args(argv)
    only: frozenset[str] = args.only
    sizes = Sizes.quick() if args.quick else Sizes.full()
    tune_gc()  # the tailer runs in this process: collect as `dblog tail` does
    started = time.monotonic()
    load_before = load_average()
    p1: P1Result | None = None
    p1s: P1Result | None = None
    p1u: P1Result | None = None
    p1b: P1bResult | None = None
    p1b_heavy: P1bResult | None = None
    p3: list[LatencyResult] | None = None
    p4: P4Result | None = None
    p4m: P4Result | None = None
    p4b: P4bResult | None = None
    emission: list[float] | None = None
    with (
        tempfile.TemporaryDirectory(prefix="dblog-bench-") as tmp,
        contextlib.ExitStack() as stack,
    ):
        base = Path(tmp)
        with_mariadb = ", MariaDB" if {"P1b", "P4m"} & only else ""
        say(f"starting PostgreSQL 15{with_mariadb} and Redis in {base}")
        pg = stack.enter_context(PostgresServer(base / "pg"))
        wants_mariadb = bool({"P1b", "P4m"} & only)
        mariadb = stack.enter_context(MariaDBServer(base / "mariadb")) if wants_mariadb else None
        rds = stack.enter_context(RedisServer(base / "redis"))
        env = Env(base, pg.info, rds.info, mariadb.info if mariadb is not None else None)
        if "P1" in only:
            p1 = bench_p1(env, sizes.p1_rows, sizes.p1_rows_per_tx)
            print(
                f"P1 ours {p1.ours_rate:.0f} events/s, ceiling {p1.ceiling_rate:.0f} events/s "
                f"(pg_recvlogical, pgoutput proto 1, {p1.ceiling_bytes:,} bytes), "
                f"ratio {p1.ours_rate / p1.ceiling_rate:.3f}; {p1.cpu_us_per_event()}",
                flush=True,
            )
        if "P1s" in only:
            p1s = bench_p1(env, sizes.p1s_rows, 4, "bench_p1s")
            print(
                f"P1s ours {p1s.ours_rate:.0f} events/s, ceiling {p1s.ceiling_rate:.0f} "
                f"events/s (4 inserts a transaction), ratio "
                f"{p1s.ours_rate / p1s.ceiling_rate:.3f}; {p1s.cpu_us_per_event()}",
                flush=True,
            )
        if "P1u" in only:
            p1u = bench_p1u(env, sizes.p1s_rows)
            print(
                f"P1u ours {p1u.ours_rate:.0f} events/s, ceiling {p1u.ceiling_rate:.0f} "
                f"events/s (sysbench's update, update, delete, insert a transaction), ratio "
                f"{p1u.ours_rate / p1u.ceiling_rate:.3f}; {p1u.cpu_us_per_event()}",
                flush=True,
            )
        if "P1b" in only:
            p1b = bench_p1b(env, sizes)
            print(
                f"P1b ours {p1b.ours_rate:.0f} events/s, ceiling {p1b.ceiling_rate:.0f} "
                f"events/s (mariadb-binlog -v, {p1b.ceiling_bytes:,} bytes), library "
                f"{p1b.library_rate:.0f} events/s (BinLogStreamReader loop), ratio "
                f"{p1b.ours_rate / p1b.ceiling_rate:.3f} of the ceiling, "
                f"{p1b.ours_rate / p1b.library_rate:.3f} of the library",
                flush=True,
            )
            p1b_heavy = h = bench_p1b_heavy(env, sizes)
            print(
                f"P1b heavy ours {h.ours_rate:.0f} events/s, ceiling {h.ceiling_rate:.0f} "
                f"events/s (mariadb-binlog -v, {h.ceiling_bytes:,} bytes), ratio "
                f"{h.ours_rate / h.ceiling_rate:.3f} of the ceiling (P1b's "
                f"{p1b.ours_rate / p1b.ceiling_rate:.3f})",
                flush=True,
            )
        if "P3" in only:
            p3 = bench_p3(env, sizes)
            for r in p3:
                print(
                    f"P3 latency {r.label}: p50 {r.quantile(0.5):.1f} ms, "
                    f"p99 {r.quantile(0.99):.1f} ms (n={len(r.samples)})",
                    flush=True,
                )
            print(f"P3 ratio p99 with dump / without {p3_ratio(p3):.1f}", flush=True)
            print(
                f"P3 floor: p99 with direct dump / without {p3_ratio(p3, 2):.1f}",
                flush=True,
            )
        if "P4" in only:
            p4 = bench_p4(env, sizes)
            print(
                f"P4 peak RSS {p4.peak_hwm_kib / 1024:.1f} MiB, "
                f"baseline RSS {p4.baseline_rss_kib / 1024:.1f} MiB "
                f"({p4.rows} rows in one transaction)",
                flush=True,
            )
        if "P4m" in only:
            p4m = bench_p4m(env, sizes)
            print(
                f"P4m peak RSS {p4m.peak_hwm_kib / 1024:.1f} MiB, "
                f"baseline RSS {p4m.baseline_rss_kib / 1024:.1f} MiB "
                f"({p4m.rows} rows in one MariaDB transaction)",
                flush=True,
            )
        if "P4b" in only:
            p4b = bench_p4b(env, sizes)
            print(
                f"P4b peak RSS {p4b.peak_hwm_kib / 1024:.1f} MiB, "
                f"baseline RSS {p4b.baseline_rss_kib / 1024:.1f} MiB "
                f"({p4b.rows} rows of ~{p4b.row_bytes} bytes dumped in "
                f"{p4b.chunk_size}-row chunks)",
                flush=True,
            )
        if "E" in only:
            emission = bench_emission(env, sizes)
            print(
                f"E emission of a pre-read chunk {min(emission) * 1000:.1f} ms per 10k rows "
                f"(best of {len(emission)}, {sizes.emission_rows} rows a chunk)",
                flush=True,
            )
    print(report(p1, p1s, p1u, p1b, p1b_heavy, p3, p4, p4m, p4b, emission))
    print(f"\ntotal {time.monotonic() - started:.0f}s")
    print(f"load average (1, 5, 15 min): {load_before} at the start, {load_average()} at the end")
    print(f"PostgreSQL log reader: {reader_form()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
