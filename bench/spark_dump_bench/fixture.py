"""What every part of the Spark dump bench runs on: the sizes, the tables and their keyset
chunks, the tailer's output (timing its writes) and the Spark session."""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import SparkSession
from support import Env, TimedNdjson

from airflow_provider_dblog.core.dump_plan import Chunk
from airflow_provider_dblog.core.event import Event, Key, TableRef
from airflow_provider_dblog.core.lines import Lines
from airflow_provider_dblog.sources.base import ChunkSource

JDBC_JAR = Path("/usr/share/java/postgresql.jar")
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

    def write_items(self, items: Sequence[Event | Lines], token: int) -> None:
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
