"""Fold the change stream (NDJSON files) into Parquet tables holding the latest row per key.

    python spark_jobs/compact.py --input EVENTS_DIR --output LAKE_DIR [--master local[2]]

Each table is `LAKE_DIR/<schema>.<table>`, a symlink to an immutable version directory under
`LAKE_DIR/.versions/`, with the columns `key`, `row` (JSON strings), `commit` and `seq`; the
rules are in `airflow_provider_dblog.compaction`. A run reads only the event bytes after those
recorded in `LAKE_DIR/_compact_state.json`, cogroups their changes with the rows of the tables
they touch, and writes each such table as a new version. The state file, replaced atomically, is
the commit point; the symlinks are then swapped (an atomic rename) and the old versions removed.
A crash before that leaves the previous tables and state, and the next run redoes the work; a
crash after it is finished by the next run, which first points the links at the state's versions
and removes versions the state does not name.

On a cluster the workers need no more than a Python that PySpark can use: the application
ships this package to the executors itself (`airflow_provider_dblog.spark_package`) unless
given `--no-ship-package`. The input and output directories must have the same path on the
driver and on every worker (a shared file system).

One compaction at a time per output directory: a run holds an exclusive lock on
`LAKE_DIR/_compact.lock` and a second one is refused (exit status 75, try again later).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from decimal import Decimal
from pathlib import Path

from pyspark import RDD
from pyspark.sql import SparkSession
from pyspark.sql.types import (
    DecimalType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from airflow_provider_dblog.compaction import (
    DEFAULT_SEGMENT_BYTES,
    TRUNCATE,
    CompactState,
    Delta,
    Segment,
    Stored,
    floors,
    fold,
    parse_line,
    plan_segments,
    read_segment,
)
from airflow_provider_dblog.spark_package import ship_package

VERSIONS = ".versions"
LOCK = "_compact.lock"
EXIT_LOCKED = 75  # EX_TEMPFAIL: another compaction runs, try again later
_SCHEMA = StructType(
    [
        StructField("table", IntegerType(), False),
        StructField("key", StringType(), False),
        StructField("row", StringType(), False),
        StructField("commit", DecimalType(20, 0), False),  # an unsigned 64-bit LSN
        StructField("seq", LongType(), False),
    ]
)


def _link(output: Path, table: str, version: str) -> None:
    """Point `output/table` at its version directory, atomically."""
    tmp = output / f".{table}.link"
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(Path(VERSIONS) / table / version, target_is_directory=True)
    os.replace(tmp, output / table)


def _settle(output: Path, state: CompactState) -> None:
    """Make the directory match the state: links to its versions, no other versions."""
    for table, version in state.tables.items():
        link = output / table
        if not link.is_symlink() or link.readlink() != Path(VERSIONS) / table / version:
            _link(output, table, version)
    versions = output / VERSIONS
    for table_dir in versions.iterdir() if versions.exists() else ():
        for version_dir in table_dir.iterdir():
            if state.tables.get(table_dir.name) != version_dir.name:
                shutil.rmtree(version_dir)


def _stored_rows(spark: SparkSession, output: Path, table: str, version: str) -> RDD:
    rows = spark.read.parquet(str(output / VERSIONS / table / version)).rdd
    return rows.map(lambda r: ((table, r.key), Stored(int(r.commit), r.seq, json.loads(r.row))))


def _slices(parallelism: int, segments: list[Segment]) -> int:
    """Enough tasks to keep every core busy, more only for more data: a task per small file
    would cost more in scheduling than in reading."""
    total = sum(s.end - s.start for s in segments)
    return min(len(segments), max(parallelism, total // DEFAULT_SEGMENT_BYTES + 1))


class CompactionLocked(RuntimeError):
    """Another compaction of the same output directory is running."""


@contextmanager
def output_lock(output: Path) -> Iterator[None]:
    """Hold the output directory's lock: two runs at once would each commit a state the other
    does not know and remove the other's new versions. Released when the holder ends, even
    killed (the kernel drops the lock with the file)."""
    output.mkdir(parents=True, exist_ok=True)
    with (output / LOCK).open("a") as lock_file:
        try:
            fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise CompactionLocked(
                f"another compaction of {output} is running (it holds {output / LOCK}); "
                "try again when it has ended"
            ) from None
        yield


def compact(spark: SparkSession, input_dir: Path, output: Path) -> CompactState:
    """One incremental run, holding the output directory's lock; returns the state it committed."""
    with output_lock(output):
        return _compact(spark, input_dir, output)


def _compact(spark: SparkSession, input_dir: Path, output: Path) -> CompactState:
    state = CompactState.load(output)
    _settle(output, state)
    segments, offsets = plan_segments(input_dir, state.files)
    if not segments:
        return state
    after = tuple(state.position) if state.position is not None else None
    sc = spark.sparkContext
    changes = (
        sc.parallelize(segments, _slices(sc.defaultParallelism, segments))
        .flatMap(read_segment)
        .flatMap(lambda line: parse_line(line, after))
        .map(lambda found: ((found[0], found[1]), found[2]))
        .cache()
    )
    touched = sorted(changes.map(lambda kv: kv[0][0]).distinct().collect())
    new = CompactState(state.position, offsets, dict(state.tables))
    if touched:
        new.position = list(changes.map(lambda kv: (kv[1].commit, kv[1].seq)).max())
        truncated = floors(
            changes.filter(lambda kv: kv[1].op == TRUNCATE)
            .map(lambda kv: (kv[0][0], kv[1]))
            .collect()
        )
        rows = changes.filter(lambda kv: kv[1].op != TRUNCATE)
        _write_tables(spark, output, rows, touched, truncated, new)
    new.save(output)
    _settle(output, new)
    changes.unpersist()
    return new


def _write_tables(
    spark: SparkSession,
    output: Path,
    changes: RDD,
    touched: list[str],
    truncated: dict[str, tuple[int, int]],
    state: CompactState,
) -> None:
    """Fold the row changes into each touched table, dropping what lies before its floor (its
    last truncate, in `truncated`), and write it as a new version, recorded in `state.tables`
    (not yet committed)."""
    sc = spark.sparkContext
    existing = [
        _stored_rows(spark, output, t, state.tables[t]) for t in touched if t in state.tables
    ]
    stored = sc.union(existing) if existing else sc.emptyRDD()
    index = {table: i for i, table in enumerate(touched)}

    def latest(item: tuple[tuple[str, str], tuple[list[Delta], list[Stored]]]) -> list[tuple]:
        (table, key), (new_changes, old) = item
        row = fold(next(iter(old), None), new_changes, truncated.get(table))
        if row is None:
            return []
        text = json.dumps(row.row, separators=(",", ":"), ensure_ascii=False)
        return [(index[table], key, text, Decimal(row.commit), row.seq)]

    folded = spark.createDataFrame(changes.cogroup(stored).flatMap(latest), _SCHEMA).cache()
    version = uuid.uuid4().hex
    for table, i in index.items():
        target = output / VERSIONS / table / version
        rows = folded.where(folded.table == i).drop("table")
        rows.write.parquet(str(target))
        state.tables[table] = version
    folded.unpersist()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input", type=Path, required=True, help="directory of NDJSON events")
    parser.add_argument("--output", type=Path, required=True, help="directory of Parquet tables")
    parser.add_argument("--master", help="Spark master; spark-submit's when omitted")
    parser.add_argument(
        "--no-ship-package",
        dest="ship_package",
        action="store_false",
        help="the workers have airflow_provider_dblog installed: do not send it to them",
    )
    args = parser.parse_args(argv)
    builder = SparkSession.builder.appName("dblog-compact")
    if args.master:
        builder = builder.master(args.master)
        if args.master.startswith("local"):
            # Local executors run this interpreter, which has the package installed.
            os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    try:
        with output_lock(args.output):  # before Spark starts: a refused run costs nothing
            spark = builder.getOrCreate()
            try:
                if args.ship_package:
                    ship_package(spark.sparkContext)
                state = _compact(spark, args.input, args.output)
            finally:
                spark.stop()
    except CompactionLocked as exc:
        print(f"compact: {exc}", file=sys.stderr)
        return EXIT_LOCKED
    print(json.dumps({"position": state.position, "tables": sorted(state.tables)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
