"""P2 direct: the target the bench's direct dumps write into (the lake, or SQL apply in
monotonic mode into a database of its own), emptied before each dump, and the dumps."""

from __future__ import annotations

import dataclasses
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import psycopg
from pyspark import SparkContext
from support import Env, RunningTailer

from airflow_provider_dblog.config import Config
from airflow_provider_dblog.core.direct import DumpMode
from airflow_provider_dblog.outputs.sql_apply.statements import POSITIONS_TABLE
from airflow_provider_dblog.state import StateStore
from spark_dump_bench.cpu_meter import CpuMeter
from spark_dump_bench.fixture import TABLE, Sizes
from spark_dump_bench.report import cpu_line
from spark_dump_bench.results import DumpRun
from spark_dump_bench.throughput import spark_dump

DIRECT_TARGET_DB = "bench_direct_target"
DIRECT_TARGET_ENV = "BENCH_DIRECT_TARGET_DSN"


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
