"""P2 and the in-process dumps: COPY's ceiling, a whole table dumped through Spark
(`run_spark_dump`), and the same table dumped as `dblog dump` runs it (`run_dump`, no Spark)."""

from __future__ import annotations

import math
import time
import uuid

import psycopg
from pyspark import SparkContext
from support import Env, RunningTailer

from airflow_provider_dblog.config import Config
from airflow_provider_dblog.core.direct import DumpMode
from airflow_provider_dblog.core.dump_plan import DumpKind, DumpRequest
from airflow_provider_dblog.core.event import TableRef
from airflow_provider_dblog.dump.runner import run_dump
from airflow_provider_dblog.dump.spark_run import run_spark_dump
from airflow_provider_dblog.sources.factory import source_for
from airflow_provider_dblog.state import DumpState, StateStore
from airflow_provider_dblog.targets import direct_target_for
from spark_dump_bench.cpu_meter import CpuMeter, CpuSplit
from spark_dump_bench.results import Ceiling, DumpRun


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
