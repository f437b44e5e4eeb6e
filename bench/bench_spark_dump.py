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

The parts live in `bench/spark_dump_bench/`, one idea a module; this script runs them in
order. No figure is checked against a threshold: this measures, it does not test.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from spark_dump_bench.chunk_cost import bench_breakdown, bench_overhead
from spark_dump_bench.cpu_meter import CpuMeter
from spark_dump_bench.direct import direct_dumps, direct_target
from spark_dump_bench.fixture import (
    JDBC_JAR,
    OVERHEAD_TABLE,
    SOURCE,
    TABLE,
    CountingNdjson,
    Sizes,
    fill_table,
    start_spark,
)
from spark_dump_bench.read_paths import bench_read_paths
from spark_dump_bench.report import print_direct_summary, print_report
from spark_dump_bench.results import Report
from spark_dump_bench.throughput import measure_copy, process_dump, spark_dump
from support import Env, RunningTailer, load_average, step

from airflow_provider_dblog.config import load_config
from airflow_provider_dblog.devservices.postgres import PostgresServer
from airflow_provider_dblog.devservices.redis import RedisServer
from airflow_provider_dblog.tailer import tune_gc


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
