"""The lake as a verified target, alone: how fast `LakeRows.read_hashes` reads a table's chunks.

No database, no tailer: a lake table of `--rows` rows (bigint key, text, int, numeric,
timestamptz, as bench_verify.py's `vrows`) is filled by merges, then read in key-range chunks of
`--chunk` rows from the first key to the last, as `dblog verify --target lake` reads them:

Q   quiet: no commit between chunks;
W   under writes: before every chunk a merge of `--changes` updates at random keys over the
    whole table commits, as the compaction's fold does every 0.2 s while a source takes writes.

Each line prints rows/s (rows read into hashes, over the time of the chunk reads alone, the
merges left out), seconds, and the load average (1, 5, 15 min). `--deletion-vectors` creates
the table with deletion vectors (writes mark rows deleted instead of rewriting files).

    nice -n 10 .venv/bin/python bench/bench_lake_verify.py [--rows 200000] [--chunk 5000]
        [--changes 100] [--deletion-vectors]
    .venv/bin/python bench/bench_lake_verify.py --quick     # 20k rows, chunks of 2,000

No figure is checked against a threshold: this measures, it does not test.
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile
import time
from pathlib import Path

from airflow_provider_dblog.core.dump_plan import Chunk
from airflow_provider_dblog.core.event import Row, TableRef
from airflow_provider_dblog.core.schema import Column, TableSchema
from airflow_provider_dblog.lake.schema import LakeRow, LakeSchema, lake_schema
from airflow_provider_dblog.lake.table import (
    LakeTable,
    give_new_tables_deletion_vectors,
)
from airflow_provider_dblog.lake.target_rows import LakeRows

TABLE = TableRef("public", "vrows")
SCHEMA = lake_schema(
    "postgres",
    TABLE,
    TableSchema(
        (
            Column("id", "bigint", False, None),
            Column("note", "text", True, None),
            Column("n", "integer", True, None),
            Column("amount", "numeric(14,4)", True, None),
            Column("at", "timestamp with time zone", True, None),
        ),
        ("id",),
    ),
)


def row(key: int, version: int) -> Row:
    return {
        "id": key,
        "note": f"row {key} version {version} " + "x" * 40,
        "n": key % 1000 + version,
        "amount": f"{key % 100000}.{version % 10000:04d}",
        "at": "2026-01-02T03:04:05.123456Z",
    }


def merge(lake: LakeTable, schema: LakeSchema, rows: list[Row], commit: int) -> None:
    lake.merge(schema.to_arrow([LakeRow(r, commit, n, "u") for n, r in enumerate(rows)]))


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load {one:.1f} {five:.1f} {fifteen:.1f}"


def read_all(
    root: Path, lake: LakeTable, rows: int, chunk: int, changes: int, commit: int
) -> tuple[float, int, int]:
    """Seconds spent in the chunk reads, rows read, the next commit number."""
    reader = LakeRows(root, dict)
    reader.check_table(TABLE, ("id",))
    spent, found, after = 0.0, 0, None
    for upto in range(chunk, rows + chunk, chunk):
        if changes:
            keys = random.sample(range(1, rows + 1), changes)
            merge(lake, SCHEMA, [row(k, commit) for k in keys], commit)
            commit += 1
        start = time.perf_counter()
        found += len(reader.read_hashes(Chunk(TABLE, upto, after=after, upto=(upto,))))
        spent += time.perf_counter() - start
        after = (upto,)
    reader.close()
    return spent, found, commit


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--chunk", type=int, default=5000)
    parser.add_argument("--changes", type=int, default=100)
    parser.add_argument("--deletion-vectors", action="store_true")
    parser.add_argument("--quick", action="store_true", help="20k rows, chunks of 2,000")
    args = parser.parse_args()
    if args.quick:
        args.rows, args.chunk = 20_000, 2000
    with tempfile.TemporaryDirectory(prefix="bench-lake-verify-") as directory:
        root = Path(directory)
        if args.deletion_vectors:
            give_new_tables_deletion_vectors(root)
        lake = LakeTable.open_or_create(root, TABLE, SCHEMA)
        for low in range(1, args.rows + 1, 100_000):
            high = min(low + 100_000, args.rows + 1)
            merge(lake, SCHEMA, [row(k, 1) for k in range(low, high)], 1)
        files = len(lake.delta.file_uris())
        dv = "on" if args.deletion_vectors else "off"
        print(
            f"{args.rows} rows in {files} data files, chunks of {args.chunk}, deletion vectors {dv}"
        )
        commit = 2
        for label, changes in (("Q quiet", 0), ("W under writes", args.changes)):
            seconds, found, commit = read_all(root, lake, args.rows, args.chunk, changes, commit)
            print(
                f"{label}: {found / seconds:,.0f} rows/s ({seconds:.1f} s, {found} rows"
                f"{f', a merge of {changes} keys before each chunk' if changes else ''}), "
                f"{load()}",
                flush=True,
            )


if __name__ == "__main__":
    main()
