"""What a chunk costs: the overhead per chunk (the same rows dumped in many small chunks and
in one) and the breakdown of one chunk's time, from Spark dumps with each chunk's steps timed
and, measured apart in this process, each step on its own."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import psycopg
from pyspark import SparkContext
from support import Env

from airflow_provider_dblog.config import Config
from airflow_provider_dblog.core.dump_plan import Chunk, DumpKind, DumpRequest
from airflow_provider_dblog.core.event import TableRef
from airflow_provider_dblog.core.position import Position
from airflow_provider_dblog.core.reconciler import ChunkRows, Closed, Failed, Reconciler, Window
from airflow_provider_dblog.dump.runner import run_dump
from airflow_provider_dblog.dump.spark_chunk import SparkChunkReader
from airflow_provider_dblog.sources.base import ChunkSource, Source
from airflow_provider_dblog.sources.factory import source_for
from airflow_provider_dblog.state import DumpState, StateStore, WindowState
from spark_dump_bench.fixture import (
    COLUMNS,
    OVERHEAD_TABLE,
    SOURCE,
    TABLE,
    CountingNdjson,
    Sizes,
    key_chunks,
)
from spark_dump_bench.results import Breakdown, ChunkTimes, DumpRun, Overhead, TimedRun


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
