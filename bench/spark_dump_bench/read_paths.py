"""The read path: our read (`read_chunk` in `mapPartitions`) against Spark's JDBC source
reading the same table, into the `noop` sink and into Python workers.

`read_parts_count` and `consume_rows` run in Spark's Python workers, which cannot import this
module (the bench's directory is on the driver's path only), so cloudpickle is told to ship
this module's functions by value, as it does for those of a script's `__main__`."""

from __future__ import annotations

import functools
import math
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from pyspark import cloudpickle
from pyspark.sql import SparkSession
from support import Env

from airflow_provider_dblog.core.dump_plan import Chunk
from airflow_provider_dblog.core.event import TableRef
from airflow_provider_dblog.sources.base import Source
from spark_dump_bench.fixture import TABLE, Sizes, key_chunks
from spark_dump_bench.results import ReadPath

# pyspark's cloudpickle carries no annotations.
cloudpickle.register_pickle_by_value(sys.modules[__name__])  # type: ignore[no-untyped-call]


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
