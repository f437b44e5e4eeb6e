"""Lake benchmark: the compaction's events/s into the Delta lake tables, and the lake side of a
direct dump (stage a chunk's rows, commit them in one merge).

Writes a synthetic change stream (NDJSON as the tailer writes it: two tables, one keyed by a
bigint, one by (text, int); creates, updates without the TOASTed column, deletes, dump reads)
into a temp dir, starts one local[2] SparkSession and prints:

C1  the first compaction of N events into new tables (create + fold), events/s;
C2  a second, incremental run over N new events into the tables C1 made, events/s (most
    keys already stored: merges update rows rather than insert them);
C3  a third such run folded in the driver alone (no Spark job: what a run below
    `--local-below` bytes does);
D1  the lake side of a direct dump: `stage_rows` of a chunk's rows in two parts (the tasks'
    share) and `commit_staged` of both (the driver's one merge), rows/s, into a table already
    holding the same keys (each row compared by position).

Each line ends with the load average (1, 5, 15 min) at its end (2 cores here, shared).

    .venv/bin/python bench/bench_lake.py [--quick] [--events N]

No figure is checked against a threshold: this measures, it does not test.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from pyspark.sql import SparkSession
from support import load_average

from airflow_provider_dblog.compaction.run import CompactOptions, compact
from airflow_provider_dblog.core.direct import DirectRecord
from airflow_provider_dblog.core.event import (
    Event,
    Op,
    Origin,
    PlainEvent,
    SourceInfo,
    TableRef,
    table_event,
)
from airflow_provider_dblog.core.position import Position
from airflow_provider_dblog.core.schema import Column, TableSchema
from airflow_provider_dblog.lake.direct import commit_staged, stage_rows
from airflow_provider_dblog.lake.schema import lake_schema
from airflow_provider_dblog.outputs.ndjson import NdjsonOutput

TABLES = {
    "accounts": TableSchema(
        (
            Column("id", "bigint", False, None),
            Column("owner", "text", True, None),
            Column("balance", "numeric(12,2)", True, None),
            Column("active", "boolean", True, None),
            Column("updated", "timestamp with time zone", True, None),
            Column("note", "text", True, None),
        ),
        ("id",),
    ),
    "orders": TableSchema(
        (
            Column("region", "text", False, None),
            Column("n", "integer", False, None),
            Column("amount", "numeric", True, None),
            Column("tags", "text[]", True, None),
        ),
        ("region", "n"),
    ),
}


class Stream:
    """Random events over `keys` keys per table, positions increasing."""

    def __init__(self, keys: int, seed: int = 1) -> None:
        self.rng = random.Random(seed)
        self.keys = keys
        self.commit = 1000
        self.opened = False

    def row(self, table: str, key: int) -> tuple[dict, dict]:
        rng = self.rng
        if table == "accounts":
            row = {
                "id": key,
                "owner": f"owner-{key}",
                "balance": f"{rng.randrange(10**6)}.{rng.randrange(100):02d}",
                "active": rng.random() < 0.5,
                "updated": "2026-11-23 12:00:00.123456+00",
                "note": "x" * rng.randrange(20, 200),
            }
            return {"id": key}, row
        region = ("eu", "us", "ap", "sa")[key % 4]
        row = {"region": region, "n": key, "amount": str(rng.random()), "tags": ["a", "b"]}
        return {"region": region, "n": key}, row

    def events(self, count: int) -> list[Event]:
        found: list[Event] = []
        if not self.opened:
            for table, schema in TABLES.items():
                self.commit += 1
                source = SourceInfo("src", "db", "app", table, Position(self.commit, 0), Origin.LOG)
                found.append(table_event(Op.SCHEMA, source, 1, schema))
            self.opened = True
        while len(found) < count:
            self.commit += 1
            for seq in range(1, 5):
                table = self.rng.choice(list(TABLES))
                key, row = self.row(table, self.rng.randrange(self.keys))
                roll = self.rng.random()
                op, after = Op.CREATE, row
                if roll < 0.1:
                    op, after = Op.DELETE, None
                elif roll < 0.6:
                    op = Op.UPDATE
                    after = {k: v for k, v in row.items() if k != "note"}  # TOASTed, unchanged
                elif roll < 0.8:
                    op = Op.READ
                source = SourceInfo(
                    "src", "db", "app", table, Position(self.commit, seq), Origin.LOG
                )
                found.append(PlainEvent(op, key, None, after, source, 1))
        return found


def load() -> str:
    return f"load {load_average()}"


def run_compaction(
    spark: SparkSession | None, label: str, events: Path, lake: Path, count: int
) -> None:
    start = time.perf_counter()
    report = compact(spark, events, lake, CompactOptions(local_below=0))
    elapsed = time.perf_counter() - start
    rows = sum(t.rows for t in report.tables.values())
    print(
        f"{label} compaction {report.events / elapsed:.0f} events/s "
        f"({report.events} events, {rows} rows written, {elapsed:.1f} s), {load()}",
        flush=True,
    )
    assert report.events >= count


def run_direct(lake: Path, rows: int) -> None:
    table = next(iter(TABLES))
    schema = lake_schema("postgres", TableRef("app", table), TABLES[table])
    stream = Stream(rows, seed=9)
    values = [stream.row(table, k)[1] for k in range(rows)]
    hw = Position(stream.commit + 10**9, 0)
    record = DirectRecord("bench", Position(hw.commit - 1, 0), hw, frozenset())
    start = time.perf_counter()
    handles = [
        stage_rows(lake, schema.table, schema, values[: rows // 2]),
        stage_rows(lake, schema.table, schema, values[rows // 2 :]),
    ]
    staged = time.perf_counter() - start
    written = commit_staged(lake, schema.table, handles, schema, record, schema.key)
    elapsed = time.perf_counter() - start
    print(
        f"D1 direct {rows / elapsed:.0f} rows/s ({written} rows written; stage "
        f"{staged * 1000:.0f} ms, commit {(elapsed - staged) * 1000:.0f} ms), {load()}",
        flush=True,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (well under a minute)")
    parser.add_argument("--events", type=int, help="events per compaction run")
    args = parser.parse_args(argv)
    count = args.events or (20_000 if args.quick else 400_000)
    keys = max(1000, count // 4)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("bench-lake")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.memory", "2g")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    try:
        with tempfile.TemporaryDirectory(prefix="bench-lake-") as work:
            events, lake = Path(work) / "events", Path(work) / "lake"
            stream = Stream(keys)
            print(f"{count} events per run over {keys} keys per table, local[2], {load()}")
            for label, session in (("C1", spark), ("C2", spark), ("C3", None)):
                with NdjsonOutput(events) as out:
                    out.write(stream.events(count), 1)
                run_compaction(session, label, events, lake, count)
            run_direct(lake, keys)
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
