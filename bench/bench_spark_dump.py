"""Spark dump benchmark: dump throughput through Spark, its cost per chunk, where the time goes,
and Spark's JDBC source against our psycopg read in mapPartitions.

Starts a private PostgreSQL 15 and Redis in a temp dir, fills a table of N rows, runs a tailer
in this process into NDJSON files, creates one local[2] SparkSession and prints:

P2        dump rows/s through Spark (`dump.spark_run.run_spark_dump`: each chunk one Spark job,
          rows from the tasks into Redis, the tailer emitting them at hw) for chunk sizes
          10k and 50k, each at parallelism (windows in flight) 1 and 2, each a fresh dump
          request; against the ceiling `COPY t TO STDOUT` of the same table (psycopg, bytes
          drained), with the ratio ours/ceiling.
P2 direct dump rows/s of direct dumps (`mode = "direct"`: the Spark tasks keep their rows, the
          tailer records only the window's changed keys, the tasks write the survivors into
          the target themselves) of the same table, chunk 50k, at parallelism 1 and 2, on
          local[2] and then on a local[1] session; the target is the lake (`--target lake`,
          the default) or SQL apply in monotonic mode (`--target sql`, a database of its own
          on the same server). With the ratio to COPY, local[2] over local[1], and the
          tailer's CPU seconds (its session and writer threads) per million dumped rows,
          direct against the sequenced chunk 50k dump; and, per direct dump, where the CPU
          went (Spark's JVM and Python workers, this process as the driver, the PostgreSQL
          and Redis servers) and how busy that kept the machine's cores.
overhead  the fixed cost of one chunk in ms: a smaller table dumped in many small chunks and
          in one chunk; the difference in time over the difference in chunks.
breakdown one instrumented Spark dump (chunk 10k, one window, one task per chunk) split into
          register + lw, the Spark job, hw -> window closed; and, measured apart in this
          process on the same chunks, the source read (`PostgresChunkSource.read_chunk`, and
          the query alone: server and transfer, no value loaded), the Redis append
          (`WindowStore.append_rows`) and the output's writes during the tailer's emission.
chunk size the whole table dumped in this process as `dblog dump` runs it (`run_dump`, one
          window at a time), at chunk sizes from 1k to 50k: what a bigger chunk gains
          without Spark's cost per chunk.
read path Spark's JDBC source reading the table into a DataFrame (all columns materialized by
          the `noop` sink; and the rows handed to Python workers) against psycopg with our
          converters in mapPartitions, same partitions. Skipped, with the reason, when the
          PostgreSQL JDBC driver (/usr/share/java/postgresql.jar) is missing.

    .venv/bin/python bench/bench_spark_dump.py [--quick] [--rows N] [--direct-chunk N]
    .venv/bin/python bench/bench_spark_dump.py --only direct [--target lake|sql]

No figure is checked against a threshold: this measures, it does not test.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from pyspark import SparkContext
from pyspark.sql import SparkSession
from support import Env, RunningTailer, TimedNdjson, load_average, step, tree_cpu_s

from airflow_provider_dblog.config import Config, load_config
from airflow_provider_dblog.core.direct import DumpMode
from airflow_provider_dblog.core.dump_plan import Chunk, DumpKind, DumpRequest
from airflow_provider_dblog.core.encoded_rows import PageLines
from airflow_provider_dblog.core.event import Event, Key, TableRef
from airflow_provider_dblog.core.position import Position
from airflow_provider_dblog.core.reconciler import ChunkRows, Closed, Failed, Reconciler, Window
from airflow_provider_dblog.devservices.postgres import PostgresServer
from airflow_provider_dblog.devservices.redis import RedisServer
from airflow_provider_dblog.dump.runner import run_dump
from airflow_provider_dblog.dump.spark_chunk import SparkChunkReader
from airflow_provider_dblog.dump.spark_run import run_spark_dump
from airflow_provider_dblog.outputs.sql_apply.statements import POSITIONS_TABLE
from airflow_provider_dblog.sources.base import ChunkSource, Source
from airflow_provider_dblog.sources.factory import source_for
from airflow_provider_dblog.state import DumpState, StateStore, WindowState
from airflow_provider_dblog.tailer import tune_gc
from airflow_provider_dblog.targets import direct_target_for

JDBC_JAR = Path("/usr/share/java/postgresql.jar")
DIRECT_TARGET_DB = "bench_direct_target"
DIRECT_TARGET_ENV = "BENCH_DIRECT_TARGET_DSN"
SOURCE = "bench_p2"
TABLE = "public.p2_rows"
OVERHEAD_TABLE = "public.p2_overhead"
COLUMNS = "id, name, n, amount, ts, pad"
PROCESS_CHUNKS = (1_000, 5_000, 10_000, 50_000)


@dataclass(frozen=True)
class Sizes:
    rows: int
    chunk_sizes: tuple[int, ...]
    parallelisms: tuple[int, ...]
    overhead_rows: int
    overhead_small_chunk: int
    read_chunk: int
    """Chunk size of the breakdown and of the psycopg read path (the first P2 chunk size)."""
    read_repeats: int
    """Each read path is timed this many times; the best is reported."""
    read_partitions: tuple[int, ...]
    process_chunk_sizes: tuple[int, ...]
    """Chunk sizes of the in-process dumps (`dblog dump`)."""
    direct_chunk: int = 200_000
    """Chunk size of the direct dumps (P2 direct), at each parallelism: their rows never pass
    through the tailer, so a chunk costs executor memory only, and a larger one spreads a Spark
    job's fixed cost (about 100 ms here) over more rows."""

    @classmethod
    def full(cls, rows: int = 1_000_000) -> Sizes:
        return cls(rows, (10_000, 50_000), (1, 2), 40_000, 1_000, 10_000, 2, (1, 2), PROCESS_CHUNKS)

    @classmethod
    def quick(cls, rows: int = 20_000) -> Sizes:
        return cls(
            rows, (10_000, 50_000), (1, 2), 1_000, 250, 10_000, 1, (2,), PROCESS_CHUNKS, 5_000
        )


@dataclass(frozen=True)
class CpuSplit:
    """CPU seconds each part of a dump used while it ran."""

    tasks_s: float
    """The Spark JVM and its Python workers: the tasks (and the JVM's scheduling)."""
    driver_s: float
    """This process but the tailer's threads: the dump's driver (commits included)."""
    postgres_s: float
    redis_s: float

    @property
    def total_s(self) -> float:
        return self.tasks_s + self.driver_s + self.postgres_s + self.redis_s


@dataclass(frozen=True)
class CpuMeter:
    """Where a dump's CPU goes: the PostgreSQL and Redis servers' process trees, Spark's JVM
    tree (its Python workers run the tasks) and this process (the driver)."""

    postgres_pid: int
    redis_pid: int

    def sample(self, sc: SparkContext) -> CpuSplit:
        gateway = sc._gateway  # PySpark's JVM, started by this process (local master)
        assert gateway is not None
        jvm = gateway.proc.pid
        own = os.times()
        return CpuSplit(
            tree_cpu_s(jvm),
            own.user + own.system,
            tree_cpu_s(self.postgres_pid),
            tree_cpu_s(self.redis_pid),
        )


@dataclass
class DumpRun:
    chunk_size: int
    parallelism: int
    tasks: int
    rows: int
    chunks: int
    seconds: float
    tailer_cpu_s: float = 0.0
    """CPU seconds the tailer's threads used while the dump ran."""
    master: str = "local[2]"
    cpu: CpuSplit | None = None
    """Where the CPU went while the dump ran (direct dumps)."""

    @property
    def rate(self) -> float:
        return self.rows / self.seconds

    @property
    def tailer_cpu_per_million(self) -> float:
        return self.tailer_cpu_s / max(1, self.rows) * 1_000_000


@dataclass
class Ceiling:
    rows: int
    bytes: int
    seconds: float

    @property
    def rate(self) -> float:
        return self.rows / self.seconds


@dataclass
class ChunkTimes:
    """One chunk of the instrumented dump: epoch ms of each step (the window's from Redis's
    clock, the reader's from this process's clock: the same machine)."""

    window_id: str
    rows: int
    registered_ms: float = 0.0
    job_start_ms: float = 0.0
    job_end_ms: float = 0.0
    closed_ms: float = 0.0


SPANS = (
    ("register + lw", "registered_ms", "job_start_ms"),
    ("Spark job (read + append)", "job_start_ms", "job_end_ms"),
    ("hw -> window closed", "job_end_ms", "closed_ms"),
)


@dataclass
class TimedRun:
    """A Spark dump with each chunk's steps timed (`TimedReader` and the window states)."""

    run: DumpRun
    chunks: list[ChunkTimes]

    def span_ms(self, start: str, end: str) -> float:
        """The span summed over the chunks."""
        return float(sum(getattr(c, end) - getattr(c, start) for c in self.chunks))

    def mean_ms(self, start: str, end: str) -> float:
        return self.span_ms(start, end) / max(1, len(self.chunks))

    def between_ms(self) -> float:
        """The run's time outside its chunks' windows: planning, controls, progress, counters."""
        return self.run.seconds * 1000 - self.span_ms("registered_ms", "closed_ms")


@dataclass
class Overhead:
    rows: int
    small: TimedRun
    large: TimedRun

    @property
    def extra_chunks(self) -> int:
        return self.small.run.chunks - self.large.run.chunks

    @property
    def per_chunk_ms(self) -> float:
        return (self.small.run.seconds - self.large.run.seconds) * 1000 / self.extra_chunks

    def per_chunk_spans(self) -> list[tuple[str, float]]:
        """The same difference, step by step: the fixed cost of each step of a chunk."""
        spans = [
            (label, (self.small.span_ms(a, b) - self.large.span_ms(a, b)) / self.extra_chunks)
            for label, a, b in SPANS
        ]
        between = (self.small.between_ms() - self.large.between_ms()) / self.extra_chunks
        return [*spans, ("between chunks", between)]


@dataclass
class Breakdown:
    timed: TimedRun
    output_write_s: float
    output_events: int
    read_s: float
    read_cpu_s: float
    """This thread's CPU time in read_chunk: less skewed by a crowded machine than wall time."""
    query_s: float
    append_s: float
    fetch_s: float
    reconcile_s: float
    measured_chunks: int
    measured_rows: int


@dataclass
class ReadPath:
    label: str
    rows: int
    seconds: float

    @property
    def rate(self) -> float:
        return self.rows / self.seconds


@dataclass
class Report:
    ceiling: Ceiling | None = None
    dumps: list[DumpRun] = field(default_factory=list)
    direct: list[DumpRun] = field(default_factory=list)
    process_dumps: list[DumpRun] = field(default_factory=list)
    overhead: Overhead | None = None
    breakdown: Breakdown | None = None
    read_paths: list[ReadPath] = field(default_factory=list)
    jdbc_skipped: str | None = None
    load_start: str = ""
    load_end: str = ""


# -- the table, the tailer's output, Spark ----------------------------------------------------


def fill_table(env: Env, table: str, rows: int) -> None:
    env.sql(
        f"CREATE TABLE {table} (id bigint PRIMARY KEY, name text, n int, amount numeric(12, 2),"
        " ts timestamptz, pad text)"
    )
    env.sql(
        f"INSERT INTO {table} SELECT i, 'name-' || i, i % 1000, (i % 100000) / 100.0,"
        " timestamptz '2026-01-01 00:00:00+00' + i * interval '1 second', repeat('x', 40)"
        f" FROM generate_series(1, {rows}) AS i"
    )
    env.sql(f"VACUUM ANALYZE {table}")


class CountingNdjson(TimedNdjson):
    """NDJSON that also adds up the time its writes (encode, write, fsync) take."""

    def __init__(self, directory: Path) -> None:
        super().__init__(directory)
        self.write_s = 0.0

    def write_items(self, items: Sequence[Event | PageLines], token: int) -> None:
        started = time.perf_counter()
        super().write_items(items, token)
        self.write_s += time.perf_counter() - started


def start_spark(jdbc_jar: Path | None, master: str = "local[2]") -> SparkSession:
    """One local[2] session for the whole run (and a local[1] one for the last direct dumps).
    Executors inherit this process's environment (the passwords `Env` put there), so it is
    created after the servers."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.master(master)
        .appName("dblog-bench-spark-dump")
        .config("spark.ui.enabled", "false")
    )
    if jdbc_jar is not None:
        builder = builder.config("spark.jars", str(jdbc_jar))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    sc = spark.sparkContext
    sc.parallelize(range(sc.defaultParallelism), sc.defaultParallelism).count()  # the workers
    return spark


# -- P2 ---------------------------------------------------------------------------------------


def measure_copy(env: Env, table: str, rows: int) -> Ceiling:
    """`COPY table TO STDOUT`, every byte drained by psycopg: once to warm the cache, then the
    best of three."""
    total, best = 0, math.inf
    for attempt in range(4):
        total = 0
        with psycopg.connect(env.pg.dsn) as conn, conn.cursor() as cursor:
            started = time.perf_counter()
            with cursor.copy(f"COPY {table} TO STDOUT") as copy:
                for data in copy:
                    total += len(data)
            if attempt:
                best = min(best, time.perf_counter() - started)
    return Ceiling(rows, total, best)


def spark_dump(
    sc: SparkContext,
    config: Config,
    store: StateStore,
    table: str,
    chunk_size: int,
    parallelism: int,
    tailer: RunningTailer,
    mode: DumpMode = DumpMode.SEQUENCED,
    meter: CpuMeter | None = None,
) -> DumpRun:
    """A fresh dump request of the whole table through `run_spark_dump`, timed from the call
    until it returns (sequenced: every window closed, the rows durable in the output; direct:
    every chunk committed into the target), with the tailer's CPU time meanwhile and, given a
    `meter`, where the rest of the CPU went."""
    dump_id = f"p2-{uuid.uuid4().hex[:8]}"
    request = DumpRequest(
        dump_id,
        DumpKind.TABLE,
        (TableRef.parse(table),),
        chunk_size=chunk_size,
        parallelism=parallelism,
        mode=mode,
    )
    store.dumps.create(request)
    cpu = tailer.cpu_s()
    before = meter.sample(sc) if meter else None
    started = time.perf_counter()
    state = run_spark_dump(sc, config, dump_id, direct_target_for)
    seconds = time.perf_counter() - started
    after = meter.sample(sc) if meter else None
    cpu = tailer.cpu_s() - cpu
    split = None
    if before and after:
        split = CpuSplit(
            after.tasks_s - before.tasks_s,
            after.driver_s - before.driver_s - cpu,
            after.postgres_s - before.postgres_s,
            after.redis_s - before.redis_s,
        )
    status = store.dumps.status(dump_id)
    if state is not DumpState.DONE or status is None:
        raise RuntimeError(f"bench: dump {dump_id} ended {state}")
    return DumpRun(
        chunk_size,
        parallelism,
        sc.defaultParallelism,
        status.rows,
        status.chunks,
        seconds,
        cpu,
        str(sc.master),
        split,
    )


def make_direct_target(env: Env, table: str) -> str:
    """An empty copy of `table` in a database of its own on the same server, for direct
    dumps (SQL apply in monotonic mode); its DSN."""
    with psycopg.connect(env.pg.admin_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {DIRECT_TARGET_DB} OWNER {env.pg.user}")
    dsn = env.pg.dsn.rsplit("/", 1)[0] + "/" + DIRECT_TARGET_DB
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            f"CREATE TABLE {table} (id bigint PRIMARY KEY, name text, n int,"
            " amount numeric(12, 2), ts timestamptz, pad text)"
        )
    return dsn


def empty_direct_target(dsn: str, table: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"TRUNCATE {table}")
        conn.execute(f"DROP TABLE IF EXISTS {POSITIONS_TABLE}")


@dataclass(frozen=True)
class DirectTarget:
    """Where the bench's direct dumps write: the lake (Delta tables under `lake_root`) or SQL
    apply in monotonic mode into the target database (its DSN in DIRECT_TARGET_ENV, which the
    executors inherit)."""

    config: Config
    label: str
    dsn: str | None = None
    lake_root: Path | None = None

    def empty(self) -> None:
        """Each direct run starts from an empty target: inserts, not updates of older rows."""
        if self.lake_root is not None:
            shutil.rmtree(self.lake_root, ignore_errors=True)
        if self.dsn is not None:
            empty_direct_target(self.dsn, TABLE)


def direct_target(env: Env, config: Config, kind: str, base: Path) -> DirectTarget:
    if kind == "lake":
        root = base / "lake"
        lake = dataclasses.replace(config, lake_root=str(root))
        return DirectTarget(lake, "the lake", None, root)
    dsn = make_direct_target(env, TABLE)
    os.environ[DIRECT_TARGET_ENV] = dsn  # before Spark: executors inherit it
    output = {"type": "sql_apply", "dsn_env": DIRECT_TARGET_ENV, "monotonic": True}
    return DirectTarget(dataclasses.replace(config, output=output), "SQL apply", dsn)


def direct_dumps(
    sc: SparkContext,
    target: DirectTarget,
    store: StateStore,
    tailer: RunningTailer,
    sizes: Sizes,
    meter: CpuMeter,
) -> list[DumpRun]:
    runs = []
    for parallelism in sizes.parallelisms:
        target.empty()
        run = spark_dump(
            sc,
            target.config,
            store,
            TABLE,
            sizes.direct_chunk,
            parallelism,
            tailer,
            DumpMode.DIRECT,
            meter,
        )
        runs.append(run)
        print(
            f"P2 direct {run.master} chunk {run.chunk_size} parallelism {parallelism}: ours "
            f"{run.rate:.0f} rows/s ({run.rows} rows, {run.chunks} chunks, {run.tasks} tasks "
            f"each, {run.seconds:.2f}s, into {target.label}), tailer CPU "
            f"{run.tailer_cpu_per_million:.2f} s per million rows",
            flush=True,
        )
        if run.cpu is not None:
            print(f"    {cpu_line(run)}", flush=True)
    return runs


def cpu_line(run: DumpRun) -> str:
    """Where a dump's CPU went, and how busy it kept the machine's cores."""
    assert run.cpu is not None
    c, cores = run.cpu, os.cpu_count() or 1
    return (
        f"CPU s: Spark tasks {c.tasks_s:.2f}, driver {c.driver_s:.2f}, PostgreSQL "
        f"{c.postgres_s:.2f}, Redis {c.redis_s:.2f}: {c.total_s:.2f} in {run.seconds:.2f} s, "
        f"{c.total_s / run.seconds / cores:.0%} of {cores} cores; tasks "
        f"{c.tasks_s / max(c.total_s, 1e-9):.0%} of it"
    )


def process_dump(config: Config, store: StateStore, table: str, chunk_size: int) -> DumpRun:
    """A fresh dump request of the whole table run in this process as `dblog dump` runs it
    (`run_dump`, one window at a time, each chunk read and appended to Redis here), timed until
    it returns (every window closed: the rows are durable in the output)."""
    dump_id = f"cli-{uuid.uuid4().hex[:8]}"
    ref = TableRef.parse(table)
    store.dumps.create(DumpRequest(dump_id, DumpKind.TABLE, (ref,), chunk_size=chunk_size))
    started = time.perf_counter()
    state = run_dump(store, source_for(config.source).chunk_source, dump_id)
    seconds = time.perf_counter() - started
    status = store.dumps.status(dump_id)
    if state is not DumpState.DONE or status is None:
        raise RuntimeError(f"bench: dump {dump_id} ended {state}")
    return DumpRun(chunk_size, 1, 1, status.rows, status.chunks, seconds)


@dataclass
class TimedReader:
    """The Spark dump's chunk reader, noting when each chunk's Spark job starts and ends. hw is
    written right after it returns."""

    inner: SparkChunkReader
    chunks: list[ChunkTimes] = field(default_factory=list)

    def __call__(
        self,
        store: StateStore,
        source: ChunkSource,
        window_id: str,
        chunk: Chunk,
        key_columns: tuple[str, ...],
    ) -> Any:
        started = time.time() * 1000
        stored = self.inner(store, source, window_id, chunk, key_columns)
        ended = time.time() * 1000
        rows = stored.rows if stored is not None else 0
        self.chunks.append(ChunkTimes(window_id, rows, job_start_ms=started, job_end_ms=ended))
        return stored


def key_chunks(source: ChunkSource, table: TableRef, rows: int, chunk_size: int) -> list[Chunk]:
    """The table's keyset range chunks of `chunk_size` rows, as the dump plans them."""
    upto = source.max_key(table)
    if upto is None:
        return []
    bounds: list[Key | None] = [None]
    count = math.ceil(rows / chunk_size)
    bounds += source.split_keys(table, None, upto, chunk_size, count)
    if bounds[-1] != upto:
        bounds.append(upto)
    return [
        Chunk(table, seq, after=bounds[seq], upto=bounds[seq + 1]) for seq in range(len(bounds) - 1)
    ]


def timed_spark_dump(
    sc: SparkContext,
    config: Config,
    store: StateStore,
    table: str,
    chunk_size: int,
    tasks: int,
) -> TimedRun:
    """What `run_spark_dump` does (a `SparkChunkReader` in `run_dump`, bounded chunks), one
    window at a time, with the reader wrapped to note when each chunk's Spark job starts and
    ends; the window's registration and closing times come from its state in Redis."""
    dump_id = f"timed-{uuid.uuid4().hex[:8]}"
    ref = TableRef.parse(table)
    store.dumps.create(DumpRequest(dump_id, DumpKind.TABLE, (ref,), chunk_size=chunk_size))
    reader = TimedReader(SparkChunkReader(sc, config, dump_id, tasks, chunk_size))
    started = time.perf_counter()
    state = run_dump(
        store,
        source_for(config.source).chunk_source,
        dump_id,
        read=reader,
        bounded_chunks=True,
    )
    seconds = time.perf_counter() - started
    status = store.dumps.status(dump_id)
    if state is not DumpState.DONE or status is None:
        raise RuntimeError(f"bench: dump {dump_id} ended {state}")
    for times in reader.chunks:
        window = store.windows.state(times.window_id)
        if window is None or window.state is not WindowState.CLOSED:
            raise RuntimeError(f"bench: window {times.window_id} is {window}")
        times.registered_ms, times.closed_ms = window.registered_ms, window.updated_ms
    run = DumpRun(chunk_size, 1, tasks, status.rows, status.chunks, seconds)
    return TimedRun(run, reader.chunks)


def bench_overhead(sc: SparkContext, config: Config, store: StateStore, sizes: Sizes) -> Overhead:
    """The same rows in many small chunks and in one; tasks as `run_spark_dump` sets them."""
    tasks = sc.defaultParallelism
    small = timed_spark_dump(sc, config, store, OVERHEAD_TABLE, sizes.overhead_small_chunk, tasks)
    large = timed_spark_dump(sc, config, store, OVERHEAD_TABLE, sizes.overhead_rows, tasks)
    return Overhead(sizes.overhead_rows, small, large)


def bench_breakdown(
    env: Env,
    sc: SparkContext,
    config: Config,
    bench_source: Source,
    store: StateStore,
    output: CountingNdjson,
    sizes: Sizes,
) -> Breakdown:
    table = TableRef.parse(TABLE)
    write_s, events = output.write_s, output.durable_events
    timed = timed_spark_dump(sc, config, store, TABLE, sizes.read_chunk, 1)
    write_s, events = output.write_s - write_s, output.durable_events - events

    # The same chunks read and appended in this process, one step at a time.
    source = bench_source.chunk_source()
    side = StateStore(env.rds.client(), "bench_breakdown")
    read_s = read_cpu_s = query_s = append_s = fetch_s = reconcile_s = 0.0
    rows_read = 0
    try:
        chunks = key_chunks(source, table, sizes.rows, sizes.read_chunk)
        key_columns = source.key_columns(table)
        for chunk in chunks:
            assert chunk.after is None or len(chunk.after) == 1
            assert chunk.upto is not None
            lower = -1 if chunk.after is None else chunk.after[0]
            with psycopg.connect(env.pg.dsn) as conn:
                t0 = time.perf_counter()
                result = conn.execute(
                    f"SELECT {COLUMNS} FROM {TABLE} WHERE id > %s AND id <= %s ORDER BY id",
                    (lower, chunk.upto[0]),
                ).pgresult
                query_s += time.perf_counter() - t0
                queried = 0 if result is None else result.ntuples
            t0, cpu0 = time.perf_counter(), time.thread_time()
            read = source.read_chunk(chunk)
            read_s += time.perf_counter() - t0
            read_cpu_s += time.thread_time() - cpu0
            if queried != len(read.rows):
                raise RuntimeError("bench: the query alone and read_chunk disagree")
            rows_read += len(read.rows)
            window = Window(uuid.uuid4().hex, "breakdown", table)
            side.windows.register(window, str(uuid.uuid4()), str(uuid.uuid4()), {}, ttl_s=600)
            t0 = time.perf_counter()
            side.windows.append_rows(
                window.window_id, 0, read.rows, key_columns, read.invisible_txids
            )
            append_s += time.perf_counter() - t0
            t0 = time.perf_counter()
            stored = side.windows.stored_rows(window.window_id)
            pages = [] if stored is None else list(side.windows.row_slices(stored))
            fetch_s += time.perf_counter() - t0
            if stored is None or sum(len(page) for page in pages) != len(read.rows):
                raise RuntimeError("bench: the rows appended are not the rows fetched")
            t0 = time.perf_counter()
            reconciler = Reconciler(SOURCE, env.pg.dbname)
            reconciler.low_watermark(window, Position(1, 0))
            closed = reconciler.high_watermark(window, Position(2, 0))
            assert isinstance(closed, Closed)
            emitted = 0
            for page in pages:
                rows = ChunkRows(window.window_id, key_columns, page, 1, emitted_before=emitted)
                reconciled = reconciler.chunk_page(closed, rows)
                if isinstance(reconciled, Failed):
                    raise RuntimeError(f"bench: reconciling the chunk gave {reconciled}")
                emitted += len(reconciled)
            reconcile_s += time.perf_counter() - t0
            if emitted != len(read.rows):
                raise RuntimeError(f"bench: reconciling the chunk gave {emitted} rows")
            side.windows.abandon(window.window_id, "bench: measured only")
    finally:
        source.close()
    return Breakdown(
        timed,
        write_s,
        events,
        read_s,
        read_cpu_s,
        query_s,
        append_s,
        fetch_s,
        reconcile_s,
        len(chunks),
        rows_read,
    )


# -- read paths: Spark JDBC against psycopg in mapPartitions ----------------------------------


def read_parts_count(bench_source: Source, parts: Iterable[Chunk]) -> Iterator[int]:
    """One Spark task: read its chunks with the source's `ChunkSource` (our converters); yield
    the row count. Reads the password from its environment."""
    source = bench_source.chunk_source()
    try:
        rows = 0
        for part in parts:
            rows += len(source.read_chunk(part).rows)
        yield rows
    finally:
        source.close()


def count_into(rdd: Any, counts: list[int]) -> None:
    counts.append(rdd.sum())


def consume_rows(rows: Iterable[Any]) -> None:
    for _ in rows:
        pass


def bench_read_paths(
    env: Env,
    spark: SparkSession,
    bench_source: Source,
    sizes: Sizes,
    jdbc: bool,
) -> list[ReadPath]:
    sc = spark.sparkContext
    table = TableRef.parse(TABLE)
    source = bench_source.chunk_source()
    try:
        chunks = key_chunks(source, table, sizes.rows, sizes.read_chunk)
    finally:
        source.close()
    results = []
    task = functools.partial(read_parts_count, bench_source)
    for partitions in sizes.read_partitions:
        # parallelize cuts the list into contiguous slices, one per partition
        rdd = sc.parallelize(chunks, partitions).mapPartitions(task)
        counted: list[int] = []
        seconds = best_of(sizes.read_repeats, functools.partial(count_into, rdd, counted))
        label = f"psycopg + converters, mapPartitions, {partitions} part"
        results.append(ReadPath(label, counted[-1], seconds))
    if not jdbc:
        return results

    def jdbc_frame(dbtable: str, partitions: int) -> Any:
        reader = (
            spark.read.format("jdbc")
            .option("url", f"jdbc:postgresql://{env.pg.host}:{env.pg.port}/{env.pg.dbname}")
            .option("driver", "org.postgresql.Driver")
            .option("dbtable", dbtable)
            .option("user", env.pg.user)
            .option("password", env.pg.password)
            .option("fetchsize", str(sizes.read_chunk))
        )
        if partitions > 1:
            reader = (
                reader.option("partitionColumn", "id")
                .option("lowerBound", "1")
                .option("upperBound", str(sizes.rows))
                .option("numPartitions", str(partitions))
            )
        return reader.load()

    def to_noop(frame: Any) -> None:
        frame.write.format("noop").mode("overwrite").save()

    # Load the driver classes and open a first connection before anything is timed.
    to_noop(jdbc_frame(f"(SELECT * FROM {TABLE} LIMIT 10) AS warm", 1))
    for partitions in sizes.read_partitions:
        frame = jdbc_frame(TABLE, partitions)
        seconds = best_of(sizes.read_repeats, functools.partial(to_noop, frame))
        label = f"Spark JDBC -> noop sink (JVM), {partitions} part"
        results.append(ReadPath(label, sizes.rows, seconds))
    frame = jdbc_frame(TABLE, max(sizes.read_partitions))
    seconds = best_of(sizes.read_repeats, functools.partial(frame.foreachPartition, consume_rows))
    label = f"Spark JDBC -> rows in Python workers, {max(sizes.read_partitions)} part"
    results.append(ReadPath(label, sizes.rows, seconds))
    return results


def best_of(repeats: int, action: Callable[[], object]) -> float:
    """The shortest of `repeats` timed runs of `action`, in seconds."""
    best = math.inf
    for _ in range(repeats):
        started = time.perf_counter()
        action()
        best = min(best, time.perf_counter() - started)
    return best


# -- report -----------------------------------------------------------------------------------


def print_report(report: Report) -> None:
    lines = ["", f"{'figure':<62} {'value':>10}", "-" * 73]

    def add(label: str, value: float, rate: bool = False) -> None:
        lines.append(f"{label:<62} {f'{value:,.0f}' if rate else f'{value:.1f}':>10}")

    ceiling = report.ceiling
    if ceiling is not None:
        add("P2 ceiling: COPY TO STDOUT (rows/s)", ceiling.rate, rate=True)
    for run in report.dumps:
        add(f"P2 chunk {run.chunk_size} parallelism {run.parallelism} (rows/s)", run.rate, True)
        if ceiling is not None:
            lines.append(f"{'':<6}ratio ours/ceiling {run.rate / ceiling.rate:.4f}")
    for run in report.process_dumps:
        add(f"dblog dump in process, chunk {run.chunk_size} (rows/s)", run.rate, True)
    for run in report.direct:
        label = f"P2 direct {run.master} chunk {run.chunk_size} parallelism {run.parallelism}"
        add(f"{label} (rows/s)", run.rate, True)
        if ceiling is not None:
            lines.append(f"{'':<6}ratio ours/ceiling {run.rate / ceiling.rate:.4f}")
        add(f"{label}: tailer CPU (s per million rows)", run.tailer_cpu_per_million)
    for run in report.dumps:
        add(
            f"P2 chunk {run.chunk_size} parallelism {run.parallelism}: tailer CPU "
            "(s per million rows)",
            run.tailer_cpu_per_million,
        )
    o = report.overhead
    if o is not None:
        add(f"overhead per chunk, {o.small.run.chunk_size} vs {o.rows} rows (ms)", o.per_chunk_ms)
        for label, value in o.per_chunk_spans():
            add(f"  of which {label} (ms)", value)
    b = report.breakdown
    if b is not None:
        t, n = b.timed, max(1, b.measured_chunks)
        job_ms = t.mean_ms("job_start_ms", "job_end_ms")
        read_ms, append_ms = b.read_s / n * 1000, b.append_s / n * 1000
        add(f"breakdown: chunk {t.run.chunk_size}, 1 window, 1 task (rows/s)", t.run.rate, True)
        for label, start, end in SPANS:
            add(f"  per chunk: {label} (ms)", t.mean_ms(start, end))
        add("  per chunk: between chunks (ms)", t.between_ms() / max(1, len(t.chunks)))
        add("  apart: source read_chunk (ms/chunk)", read_ms)
        add("    its CPU time in this thread (ms/chunk)", b.read_cpu_s / n * 1000)
        add("    the query alone, nothing loaded (ms/chunk)", b.query_s / n * 1000)
        add("  apart: encode + Redis WindowStore.append_rows (ms/chunk)", append_ms)
        add("  so Spark's own share of the job (ms/chunk)", job_ms - read_ms - append_ms)
        fetch_ms, reconcile_ms = b.fetch_s / n * 1000, b.reconcile_s / n * 1000
        output_ms = b.output_write_s / max(1, t.run.chunks) * 1000
        add("  apart: Redis row_slices, the tailer's fetch (ms/chunk)", fetch_ms)
        add("  apart: Reconciler.chunk_page, pages to lines (ms/chunk)", reconcile_ms)
        add("  tailer: output writes, NDJSON encode + fsync (ms/chunk)", output_ms)
        add(
            "  so the rest of hw -> window closed (ms/chunk)",
            t.mean_ms("job_end_ms", "closed_ms") - fetch_ms - reconcile_ms - output_ms,
        )
    for path in report.read_paths:
        add(f"read {path.label} (rows/s)", path.rate, rate=True)
    if report.jdbc_skipped:
        lines.append(f"read Spark JDBC: skipped ({report.jdbc_skipped})")
    lines.append(
        f"load average (1, 5, 15 min) {report.load_start} at the start, {report.load_end} at "
        f"the end, on {os.cpu_count()} CPUs: other work on the machine skews every figure"
    )
    print("\n".join(lines))


def print_direct_summary(report: Report) -> None:
    """The direct figures against COPY, local[2] against local[1], and the tailer's CPU per
    million dumped rows direct against sequenced."""
    ceiling = report.ceiling
    by_master = {(run.master, run.parallelism): run for run in report.direct}
    for (master, parallelism), run in sorted(by_master.items()):
        if ceiling is not None:
            print(
                f"P2 direct {master} parallelism {parallelism}: ratio ours/ceiling "
                f"{run.rate / ceiling.rate:.4f}"
            )
        one = by_master.get(("local[1]", parallelism))
        if master == "local[2]" and one is not None:
            print(
                f"P2 direct local[2]/local[1] parallelism {parallelism}: {run.rate / one.rate:.2f}"
            )
    sequenced = max(report.dumps, key=lambda r: (r.chunk_size, r.parallelism), default=None)
    direct = by_master.get(("local[2]", sequenced.parallelism)) if sequenced else None
    if sequenced is not None and direct is not None:
        print(
            "P2 tailer CPU per million dumped rows: sequenced "
            f"{sequenced.tailer_cpu_per_million:.2f} s (chunk {sequenced.chunk_size} parallelism "
            f"{sequenced.parallelism}), direct {direct.tailer_cpu_per_million:.2f} s (chunk "
            f"{direct.chunk_size} parallelism {direct.parallelism})"
        )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (well under a minute)")
    parser.add_argument("--rows", type=int, help="rows in the dumped table")
    parser.add_argument("--direct-chunk", type=int, help="chunk size of the direct dumps")
    parser.add_argument(
        "--target",
        choices=("lake", "sql"),
        default="lake",
        help="where the direct dumps write: the lake (default) or SQL apply",
    )
    parser.add_argument(
        "--only",
        choices=("all", "direct"),
        default="all",
        help="direct: only the ceiling, one sequenced dump and the direct dumps",
    )
    args = parser.parse_args(argv)
    sizes = Sizes.quick() if args.quick else Sizes.full()
    tune_gc()  # the tailer runs in this process: collect as `dblog tail` does
    if args.rows:
        sizes = dataclasses.replace(sizes, rows=args.rows)
    if args.direct_chunk:
        sizes = dataclasses.replace(sizes, direct_chunk=args.direct_chunk)
    jdbc_jar = JDBC_JAR if JDBC_JAR.is_file() else None
    report = Report()
    if jdbc_jar is None:
        report.jdbc_skipped = (
            f"{JDBC_JAR} is missing: install libpostgresql-jdbc-java "
            "(scripts/install-system-deps.sh)"
        )
    started = time.monotonic()
    report.load_start = load_average()
    with tempfile.TemporaryDirectory(prefix="dblog-bench-spark-") as tmp:
        base = Path(tmp)
        step(f"starting PostgreSQL 15 and Redis in {base}")
        with PostgresServer(base / "pg") as pg, RedisServer(base / "redis") as rds:
            env = Env(base, pg.info, rds.info)
            meter = CpuMeter(
                int((pg.info.data_dir / "postmaster.pid").read_text().split()[0]),
                int(rds.info.client().info("server")["process_id"]),
            )
            step(
                f"filling {TABLE} with {sizes.rows} rows, {OVERHEAD_TABLE} with "
                f"{sizes.overhead_rows}"
            )
            fill_table(env, TABLE, sizes.rows)
            fill_table(env, OVERHEAD_TABLE, sizes.overhead_rows)
            tables = [TABLE, OVERHEAD_TABLE]
            bench_source = env.source(SOURCE, tables)
            bench_source.ensure_setup()
            config = load_config(env.write_toml(SOURCE, tables, base / "out"))
            store = env.store(SOURCE)

            step("P2 ceiling: COPY TO STDOUT")
            report.ceiling = ceiling = measure_copy(env, TABLE, sizes.rows)
            print(
                f"P2 ceiling COPY {TABLE} TO STDOUT {ceiling.rate:.0f} rows/s "
                f"({ceiling.bytes:,} bytes in {ceiling.seconds:.2f}s)",
                flush=True,
            )
            direct = direct_target(env, config, args.target, base)
            step("starting Spark (local[2])")
            spark = start_spark(jdbc_jar)
            sc = spark.sparkContext
            output = CountingNdjson(base / "out")
            with RunningTailer(env, bench_source, output) as tailer:
                try:
                    sequenced = [
                        (chunk_size, parallelism)
                        for chunk_size in sizes.chunk_sizes
                        for parallelism in sizes.parallelisms
                    ]
                    if args.only == "direct":
                        sequenced = [(sizes.direct_chunk, max(sizes.parallelisms))]
                    for chunk_size, parallelism in sequenced:
                        run = spark_dump(sc, config, store, TABLE, chunk_size, parallelism, tailer)
                        report.dumps.append(run)
                        print(
                            f"P2 chunk {chunk_size} parallelism {parallelism}: ours "
                            f"{run.rate:.0f} rows/s ({run.rows} rows, {run.chunks} chunks, "
                            f"{run.tasks} tasks each, {run.seconds:.2f}s), ceiling "
                            f"{ceiling.rate:.0f} rows/s, ratio {run.rate / ceiling.rate:.4f}",
                            flush=True,
                        )
                    step(f"P2 direct on local[2]: the tasks write into {direct.label}")
                    report.direct += direct_dumps(sc, direct, store, tailer, sizes, meter)
                    if args.only == "all":
                        for chunk_size in sizes.process_chunk_sizes:
                            run = process_dump(config, store, TABLE, chunk_size)
                            report.process_dumps.append(run)
                            print(
                                f"dblog dump in process, chunk {chunk_size}: {run.rate:.0f} "
                                f"rows/s ({run.rows} rows, {run.chunks} chunks, "
                                f"{run.seconds:.2f}s)",
                                flush=True,
                            )
                        step(
                            f"overhead: {sizes.overhead_rows} rows in chunks of "
                            f"{sizes.overhead_small_chunk} and in one chunk"
                        )
                        report.overhead = o = bench_overhead(sc, config, store, sizes)
                        print(
                            f"overhead per chunk {o.per_chunk_ms:.1f} ms ({o.small.run.chunks} "
                            f"chunks in {o.small.run.seconds:.2f}s vs {o.large.run.chunks} in "
                            f"{o.large.run.seconds:.2f}s, {o.rows} rows)",
                            flush=True,
                        )
                        step("breakdown: one instrumented dump, then each step apart")
                        report.breakdown = bench_breakdown(
                            env, sc, config, bench_source, store, output, sizes
                        )
                        step("read paths: psycopg in mapPartitions, Spark JDBC")
                        report.read_paths = bench_read_paths(
                            env, spark, bench_source, sizes, jdbc=jdbc_jar is not None
                        )
                        for path in report.read_paths:
                            print(
                                f"read {path.label}: {path.rate:.0f} rows/s ({path.seconds:.2f}s)"
                            )
                finally:
                    spark.stop()
                step("P2 direct on local[1]: the same dumps on one core")
                spark = start_spark(None, "local[1]")
                try:
                    report.direct += direct_dumps(
                        spark.sparkContext, direct, store, tailer, sizes, meter
                    )
                finally:
                    spark.stop()
            print_direct_summary(report)
    report.load_end = load_average()
    print_report(report)
    print(f"\ntotal {time.monotonic() - started:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
