"""The dump as a PySpark application: one stored dump request, each chunk one Spark job.

    spark-submit spark_jobs/dump.py --dump-id ID --config dblog.toml
    python spark_jobs/dump.py --dump-id ID --config dblog.toml --master 'local[2]'

The driver runs the same loop as `dblog dump` (`run_dump`: planning, controls, progress, retries,
up to `parallelism` windows in flight, each in its own driver thread and so its own Spark job).
For each chunk it registers the window, writes lw, splits the chunk into key sub-ranges with
split keys the database finds through the primary-key index (a key chunk: its key list in
slices), and runs one Spark job of one task per sub-range. Each task opens its own source
connection, reads its sub-range and appends the rows straight into Redis: rows never pass
through the driver, only counts come back. Then the driver writes hw, waits for the tailer to
close the window and stores progress. A run of the same request after a kill resumes from the
last completed chunk; a window the killed run left open expires in the tailer. A task that finds
the source gone (a restart, a failover) says so instead of failing: the driver retries the chunk
with new watermarks until the source is back, for up to `--source-patience` seconds.

A direct dump (`mode = "direct"`) runs each chunk as two Spark jobs on the same sub-ranges: the
tasks read and keep their rows in Spark's cache, only the read's transactions go to Redis; after
hw and the tailer's record, the tasks drop the recorded keys and write the rest into the target
themselves, and the driver commits the chunk (`airflow_provider_dblog/dump/spark_direct.py`).

Credentials never travel in argv or Spark properties: each task reads the passwords from the
environment variables the TOML names (`password_env`). Local executors inherit the driver's
environment; on a cluster, set those variables on the workers (their spark-env.sh, or the
container's secrets), never with `spark.executorEnv.*`, which the UI shows.

On a cluster the workers need a Python of the driver's version with `redis` and the source's
driver installed (`psycopg[binary]` for PostgreSQL, PyMySQL for MySQL/MariaDB: nothing here
names a source type, each task reads through `source.chunk_source()`), named by
`spark.pyspark.python` (or PYSPARK_PYTHON) when it is not their `python3`, and the password
variables in their environment. This package need not be
installed there: the application ships it to the executors itself, as a zip
(`airflow_provider_dblog.spark_package`), unless given `--no-ship-package` or the zip is
already among its `--py-files`.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pyspark import SparkContext
from pyspark.sql import SparkSession

from airflow_provider_dblog.config import Config, load_config
from airflow_provider_dblog.core.direct import DumpMode
from airflow_provider_dblog.core.dump_plan import Chunk
from airflow_provider_dblog.core.event import Key, key_of
from airflow_provider_dblog.dump.chunk import StoredChunk
from airflow_provider_dblog.dump.retry import SOURCE_PATIENCE_S
from airflow_provider_dblog.dump.runner import DumpFailed, run_dump
from airflow_provider_dblog.dump.spark_chunk import ChunkJobFailed, sub_ranges
from airflow_provider_dblog.dump.spark_direct import SparkDirectReader
from airflow_provider_dblog.dump.task_connections import task_connections
from airflow_provider_dblog.sources.base import ChunkSource, SourceUnavailable
from airflow_provider_dblog.sources.factory import source_for
from airflow_provider_dblog.spark_package import ship_package
from airflow_provider_dblog.state import DumpState, StateStore
from airflow_provider_dblog.targets import direct_target_for

log = logging.getLogger("dblog.spark_dump")

PartResult = tuple[int, int | None, Key | None, str | None]
"""What a task sends back: part index, rows stored (None: the window ended), last key read, and
why the source could not be read (None: it was)."""


def read_parts(
    config: Config,
    window_id: str,
    key_columns: tuple[str, ...],
    parts: Iterable[tuple[int, Chunk]],
) -> list[PartResult]:
    """One Spark task: read its parts on the worker's connections (`task_connections`) and
    append the rows to the window in Redis. Runs on an executor; reads passwords from its
    environment. A source that went away ends the task with that news rather than an error:
    Spark retrying the task at once would only find it gone again, while the driver retries the
    chunk once it is back."""
    results: list[PartResult] = []
    with task_connections(config) as connections:
        for index, part in parts:
            try:
                read = connections.source.read_chunk(part)
            except SourceUnavailable as exc:
                connections.healthy = False
                results.append((index, None, None, str(exc)))
                break
            stored = connections.windows.append_rows(
                window_id, index, read.rows, key_columns, read.invisible_txids
            )
            last = key_of(read.rows[-1], key_columns) if read.rows else None
            results.append((index, stored, last, None))
    return results


@dataclass(frozen=True)
class SparkChunkReader:
    """The `ChunkReader` of the Spark dump: each chunk one Spark job, one task per sub-range."""

    sc: SparkContext
    config: Config
    dump_id: str
    tasks: int
    default_chunk_size: int

    def __call__(
        self,
        store: StateStore,
        source: ChunkSource,
        window_id: str,
        chunk: Chunk,
        key_columns: tuple[str, ...],
    ) -> StoredChunk | None:
        controls = store.dumps.controls(self.dump_id)
        chunk_size = controls.chunk_size if controls else self.default_chunk_size
        parts = sub_ranges(source, chunk, self.tasks, chunk_size)
        task = functools.partial(read_parts, self.config, window_id, key_columns)
        self.sc.setJobDescription(f"dblog dump {self.dump_id}: {chunk.table} chunk {chunk.seq}")
        try:
            results = (
                self.sc.parallelize(list(enumerate(parts)), len(parts))
                .mapPartitions(task)
                .collect()
            )
        except Exception as exc:  # py4j's error for a failed job: the chunk is retried
            raise ChunkJobFailed(f"the Spark job of chunk {chunk.seq} failed: {exc}") from exc
        return _combine(results)


def _combine(results: Sequence[PartResult]) -> StoredChunk | None:
    """The chunk's outcome from its parts' (None if any part found the window ended); raises
    SourceUnavailable if a part could not reach the source."""
    for _, _, _, unavailable in results:
        if unavailable is not None:
            raise SourceUnavailable(f"a Spark task could not read the source: {unavailable}")
    if any(stored is None for _, stored, _, _ in results):
        return None
    ordered = sorted(results, key=lambda r: r[0])
    last_keys = [last for _, _, last, _ in ordered if last is not None]
    return StoredChunk(
        sum(stored or 0 for _, stored, _, _ in ordered), last_keys[-1] if last_keys else None
    )


def run_spark_dump(
    sc: SparkContext,
    config: Config,
    dump_id: str,
    *,
    tasks: int | None = None,
    window_timeout_s: float = 60.0,
    source_patience_s: float = SOURCE_PATIENCE_S,
) -> DumpState:
    """Run one stored dump request in this Spark application; returns its final state."""
    store = StateStore(config.redis_client(), config.source.name)
    stored = store.dumps.get(dump_id)
    if stored is None:
        raise DumpFailed(f"no dump request {dump_id!r} in the store")
    reader = SparkChunkReader(
        sc, config, dump_id, tasks or sc.defaultParallelism, stored.request.chunk_size
    )
    direct = None
    if stored.request.mode is DumpMode.DIRECT:  # rows written by the tasks: direct_dump.py
        direct = SparkDirectReader(
            sc,
            config,
            dump_id,
            reader.tasks,
            stored.request.chunk_size,
            direct_target_for(config),
            direct_target_for,
        )
    try:
        return run_dump(
            store,
            source_for(config.source).chunk_source,
            dump_id,
            window_timeout_s=window_timeout_s,
            source_patience_s=source_patience_s,
            read=reader,
            direct=direct,
            bounded_chunks=True,
        )
    finally:
        if direct is not None:
            direct.target.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dump-id", required=True, help="a dump request stored in Redis")
    parser.add_argument("--config", required=True, help="the dblog TOML file")
    parser.add_argument("--tasks", type=int, help="tasks per chunk (default: Spark's parallelism)")
    parser.add_argument("--window-timeout", type=float, default=60.0, help="seconds")
    parser.add_argument(
        "--source-patience",
        type=float,
        default=SOURCE_PATIENCE_S,
        help="seconds to wait for a source or Redis that went away before failing",
    )
    parser.add_argument("--master", help="when run with python, not spark-submit: e.g. local[2]")
    parser.add_argument(
        "--no-ship-package",
        dest="ship_package",
        action="store_false",
        help="the workers have airflow_provider_dblog installed: do not send it to them",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    config = load_config(args.config)
    builder = SparkSession.builder.appName(f"dblog-dump-{args.dump_id}")
    if args.master:
        builder = builder.master(args.master)
        if args.master.startswith("local"):
            # Local executors run this interpreter, which has the dependencies installed.
            os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = builder.getOrCreate()
    try:
        if args.ship_package:
            ship_package(spark.sparkContext)
        state = run_spark_dump(
            spark.sparkContext,
            config,
            args.dump_id,
            tasks=args.tasks,
            window_timeout_s=args.window_timeout,
            source_patience_s=args.source_patience,
        )
    except DumpFailed as exc:
        log.error("dump %s failed: %s", args.dump_id, exc)
        return 1
    finally:
        spark.stop()
    log.info("dump %s ended %s", args.dump_id, state)
    return 0 if state is DumpState.DONE else 3


if __name__ == "__main__":
    sys.exit(main())
