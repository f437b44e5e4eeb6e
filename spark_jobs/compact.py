"""Fold the change stream (the tailer's NDJSON files) into the lake: one Delta Lake table per
source table, holding per key the row with the highest position (`airflow_provider_dblog.lake`).

    python spark_jobs/compact.py --input EVENTS_DIR --output LAKE_DIR --config dblog.toml
        [--master local[2]] [--prune | --prune-before COMMIT,SEQ]

Spark reads and parses the new event bytes in parallel and folds each key's changes of the run
into one row (`airflow_provider_dblog.compaction`); the driver merges each touched table's rows
into its Delta table with delta-rs, in one commit per table (more for a run larger than
`--batch-rows` keys of a table), which carries the table's progress: the position of the last
event folded into it. So data and progress commit together, a crash leaves each table at its
last commit, and a run started again reads the same bytes and skips, per table, the events its
progress covers. `LAKE_DIR/_compact_state.json`, written after every table's commit, only says
where to start reading next time.

A table the lake does not hold yet is created with the lake schema of the source's catalog
(`--config`), or else of the run's first schema event of the table (`--source-type` names the
type mapping then). With `--prune`, tombstones positioned before the horizon the state store
gives (the oldest lw of the direct windows whose rows are not committed yet, or the tailer's
checkpoint) are removed from every table after the run; `--prune-before` names a horizon
instead (see `LakeTable.prune_tombstones` for what it must be).

On a cluster the workers need no more than a Python that PySpark can use: the application
ships this package to the executors itself (`airflow_provider_dblog.spark_package`) unless
given `--no-ship-package`. The input directory must have the same path on the driver and on
every worker (a shared file system); only the driver writes the lake.

One compaction at a time per output directory: a run holds an exclusive lock on
`LAKE_DIR/_compact.lock` and a second one is refused (exit status 75, try again later). The
lake's other writers, direct dumps, commit beside it: delta-rs runs a commit that lost a race
again on the new version.
"""

from __future__ import annotations

import argparse
import fcntl
import gc
import json
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from airflow_provider_dblog.compaction import (
    DEFAULT_SEGMENT_BYTES,
    TABLE_KEY,
    TRUNCATE,
    AddedColumn,
    Change,
    CompactState,
    Folded,
    Segment,
    constant_default,
    floors,
    fold,
    key_row,
    lake_row,
    parse_line,
    plan_segments,
    read_segment,
    schema_changes,
)
from airflow_provider_dblog.config import Config, load_config
from airflow_provider_dblog.core.event import TableRef
from airflow_provider_dblog.core.position import Position
from airflow_provider_dblog.core.schema import TableSchema
from airflow_provider_dblog.lake.catalog import source_lake_schema
from airflow_provider_dblog.lake.direct import remove_stale_staged
from airflow_provider_dblog.lake.schema import LakeSchema, LakeSchemaError, lake_column, lake_schema
from airflow_provider_dblog.lake.table import LakeTable, Written
from airflow_provider_dblog.spark_package import ship_package
from airflow_provider_dblog.state import StateStore

LOCK = "_compact.lock"
EXIT_LOCKED = 75  # EX_TEMPFAIL: another compaction runs, try again later
EXIT_USAGE = 2
DEFAULT_BATCH_ROWS = 200_000
DEFAULT_LOCAL_BELOW = 64 * 1024 * 1024
LEGACY_VERSIONS = ".versions"
STALE_STAGED_S = 24 * 3600
"""A direct dump's staged file older than this belongs to a chunk no driver will commit (a
Spark task attempt that died after staging): a chunk commits or gives up within minutes."""

Describe = Callable[[TableRef], LakeSchema]


class CompactionLocked(RuntimeError):
    """Another compaction of the same output directory is running."""


@dataclass
class TableReport:
    """What a run did to one lake table."""

    rows: int = 0
    deleted: int = 0
    version: int | None = None
    progress: list[int] | None = None

    def add(self, written: Written) -> None:
        self.rows += written.rows
        self.deleted += written.deleted
        self.version = written.version


@dataclass
class CompactReport:
    """What a run did: where it stopped reading, and per table rows written (inserted or
    updated, tombstones included), rows deleted (a truncate's), the version committed."""

    state: CompactState
    tables: dict[str, TableReport] = field(default_factory=dict)
    events: int = 0
    pruned: int = 0
    stale_staged: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "position": self.state.position,
            "events": self.events,
            "pruned_tombstones": self.pruned,
            "removed_stale_staged": self.stale_staged,
            "tables": {t: vars(r) for t, r in sorted(self.tables.items())},
        }


@contextmanager
def output_lock(output: Path) -> Iterator[None]:
    """Hold the output directory's lock: two runs at once would each fold the same events and
    move the read cursor past each other. Released when the holder ends, even killed (the
    kernel drops the lock with the file)."""
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


@dataclass(frozen=True)
class CompactOptions:
    """How a run creates tables, prunes, batches its merges and chooses where to fold.

    `describe` gives a new table's lake schema (the source's catalog); without it a table is
    created from the run's first schema event of it, mapped as `source_type`. `local_below`:
    a run with fewer new bytes than this folds in the driver, without Spark jobs."""

    describe: Describe | None = None
    source_type: str = "postgres"
    prune_before: Position | None = None
    batch_rows: int = DEFAULT_BATCH_ROWS
    local_below: int = DEFAULT_LOCAL_BELOW


def compact(
    spark: SparkSession | None, input_dir: Path, output: Path, **options: Any
) -> CompactReport:
    """One incremental run, holding the output directory's lock; `options` are
    `CompactOptions`' fields. Without `spark`, every run folds in the driver."""
    session = None if spark is None else (lambda: spark)
    with output_lock(output):
        return _compact(session, input_dir, output, CompactOptions(**options))


def lake_tables(output: Path) -> dict[str, LakeTable]:
    """The lake tables under `output`, by `schema.table`."""
    found = {}
    for path in sorted(output.iterdir()) if output.exists() else ():
        if (
            path.is_dir()
            and path.name[0] not in "._"
            and "." in path.name
            and LakeTable.exists(output, TableRef.parse(path.name))
        ):
            found[path.name] = LakeTable.open(output, TableRef.parse(path.name))
    return found


def _slices(parallelism: int, segments: list[Segment]) -> int:
    """Enough tasks to keep every core busy, more only for more data: a task per small file
    would cost more in scheduling than in reading."""
    total = sum(s.end - s.start for s in segments)
    return min(len(segments), max(parallelism, total // DEFAULT_SEGMENT_BYTES + 1))


def _compact(
    spark: Callable[[], SparkSession] | None,
    input_dir: Path,
    output: Path,
    options: CompactOptions,
) -> CompactReport:
    if (output / LEGACY_VERSIONS).exists():
        raise LakeSchemaError(
            f"{output} holds tables of the old JSON-in-Parquet layout ({LEGACY_VERSIONS}/): "
            "compact into a new directory (from the first event file), or dump the tables "
            "again into one"
        )
    state = CompactState.load(output)
    existing = lake_tables(output)
    segments, offsets = plan_segments(input_dir, state.files)
    report = CompactReport(CompactState(state.position, offsets))
    with cyclic_gc_paused():
        if segments:
            progress = {
                name: (p.commit, p.seq)
                for name, lake in existing.items()
                if (p := lake.progress) is not None
            }
            run = (
                _driver_run(segments, progress)
                if spark is None or sum(x.end - x.start for x in segments) < options.local_below
                else _spark_run(spark(), segments, progress)
            )
            table_ends, events = run.ends, run.table_events
            report.events = run.count
            truncated = floors((t, c) for t, c in events if c.op == TRUNCATE)
            folds = {}
            for table in sorted(table_ends):
                ref = TableRef.parse(table)
                changes = [c for t, c in events if t == table]
                lake = existing.get(table) or _create(
                    output, ref, changes, options.describe, options.source_type
                )
                floor = Position(*truncated[table]) if table in truncated else None
                end = Position(*table_ends[table])
                folds[table] = TableFold(lake, changes, floor, end, options.batch_rows)
            for table, item in run.folded(truncated):
                folds[table].add(item)
            for table, table_fold in folds.items():
                report.tables[table] = table_fold.finish()
            if table_ends:
                report.state.position = list(max(table_ends.values()))
            run.close()
    report.state.save(output)
    if options.prune_before is not None:
        for lake in lake_tables(output).values():
            report.pruned += lake.prune_tombstones(options.prune_before)
    report.stale_staged = remove_stale_staged(output, STALE_STAGED_S)
    return report


@contextmanager
def cyclic_gc_paused() -> Iterator[None]:
    """Python's cycle collector paused while a run parses and folds: every event makes a few
    dicts and tuples that live until their table's merge, and each collection walks all of
    them (a third of a 100k-event run's time) to find cycles they never form."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


@dataclass
class RunChanges:
    """A run's parsed events: each touched table's last position, the number of events, the
    table-level events, and the folded keys (given the run's floors)."""

    ends: dict[str, tuple[int, int]]
    count: int
    table_events: list[tuple[str, Change]]
    folded: Callable[[dict[str, tuple[int, int]]], Iterator[tuple[str, tuple[str, Folded]]]]
    close: Callable[[], None] = lambda: None


def _spark_run(
    spark: SparkSession, segments: list[Segment], progress: dict[str, tuple[int, int]]
) -> RunChanges:
    """Parse and fold on the executors, segments in parallel; the folded keys come back to
    the driver a partition at a time."""
    sc = spark.sparkContext
    parsed = (
        sc.parallelize(segments, _slices(sc.defaultParallelism, segments))
        .flatMap(read_segment)
        .flatMap(lambda line: parse_line(line, progress))
        .cache()
    )
    ends: dict[str, tuple[int, int]] = {}
    events: list[tuple[str, Change]] = []
    count = 0
    for part_ends, part_count, part_events in parsed.mapPartitions(_summary).collect():
        for table, end in part_ends.items():
            ends[table] = max(ends.get(table, end), end)
        count += part_count
        events.extend(part_events)

    def folded(
        truncated: dict[str, tuple[int, int]],
    ) -> Iterator[tuple[str, tuple[str, Folded]]]:
        rows = parsed.filter(lambda t: t[1] != TABLE_KEY).map(lambda t: ((t[0], t[1]), t[2]))
        return rows.groupByKey().flatMap(lambda kv: _folded(kv, truncated)).toLocalIterator()

    return RunChanges(ends, count, events, folded, parsed.unpersist)


def _summary(
    parsed: Iterable[tuple[str, str, Change]],
) -> Iterator[tuple[dict[str, tuple[int, int]], int, list[tuple[str, Change]]]]:
    """One partition's part of a run: each table's last position, the number of changes and
    the table-level events (one pass, no shuffle)."""
    ends: dict[str, tuple[int, int]] = {}
    events: list[tuple[str, Change]] = []
    count = 0
    for table, key, change in parsed:
        count += 1
        ends[table] = max(ends.get(table, (0, 0)), (change.commit, change.seq))
        if key == TABLE_KEY:
            events.append((table, change))
    yield ends, count, events


def _driver_run(segments: list[Segment], progress: dict[str, tuple[int, int]]) -> RunChanges:
    """Parse and fold in this process: for a run whose new bytes are few, Spark's jobs would
    cost more than the work."""
    ends: dict[str, tuple[int, int]] = {}
    events: list[tuple[str, Change]] = []
    keys: dict[tuple[str, str], list[Change]] = {}
    count = 0
    for segment in segments:
        for line in read_segment(segment):
            for table, key, change in parse_line(line, progress):
                count += 1
                ends[table] = max(ends.get(table, (0, 0)), (change.commit, change.seq))
                if key == TABLE_KEY:
                    events.append((table, change))
                else:
                    keys.setdefault((table, key), []).append(change)

    def folded(
        truncated: dict[str, tuple[int, int]],
    ) -> Iterator[tuple[str, tuple[str, Folded]]]:
        for item in keys.items():
            yield from _folded(item, truncated)

    return RunChanges(ends, count, events, folded)


def _folded(
    item: tuple[tuple[str, str], Any], truncated: dict[str, tuple[int, int]]
) -> list[tuple[str, tuple[str, Folded]]]:
    (table, key), changes = item
    found = fold(changes, truncated.get(table))
    return [] if found is None else [(table, (key, found))]


def _create(
    output: Path,
    table: TableRef,
    changes: list[Change],
    describe: Describe | None,
    source_type: str,
) -> LakeTable:
    """A new lake table: the catalog's schema, or else the run's first schema event's."""
    if describe is not None:
        schema = describe(table)
    else:
        described = schema_changes(changes)
        if not described:
            raise LakeSchemaError(
                f"no schema for {table}: the run has no schema event of it and no source "
                "catalog was given (pass --config)"
            )
        schema = lake_schema(source_type, table, described[0][1])
    return LakeTable.open_or_create(output, table, schema)


class TableFold:
    """One table's part of a run: the table evolved by the run's schema events, then its
    folded rows merged in batches, the last commit recording `end` as its progress."""

    def __init__(
        self,
        lake: LakeTable,
        changes: list[Change],
        floor: Position | None,
        end: Position,
        batch_rows: int,
    ) -> None:
        self.lake, self.end, self.batch_rows = lake, end, batch_rows
        self.report = TableReport(progress=end.to_json())
        self.truncate = floor
        self.pending: list[tuple[str, Folded]] = []
        # Every ADD folded so far, this run's too if a run that died folded it: rows of the
        # run positioned before it that lack the column hold its default.
        self.added = {
            name: AddedColumn((at.commit, at.seq), default)
            for name, (at, default) in lake.added().items()
        }
        for position, described in schema_changes(changes):
            self._fold_schema(position, described)
        self.schema = lake.schema

    def _fold_schema(self, position: Position, described: TableSchema) -> None:
        """Fold one schema event: the columns it adds get their constant default in the rows
        positioned before it. It adds the columns the last schema event folded did not list,
        and at the table's first the columns the table lacks or holds unfolded (the others
        were there before the log first described the table). An event at or before the last
        one folded was folded by a run that died before its rows' commit."""
        lake = self.lake
        last = lake.folded_schema
        if last is not None and position <= last.at:
            return
        new = [lake_column(lake.schema.source, c.name, c.type) for c in described.columns]
        lake.add_columns(new)
        unfolded = lake.unfolded
        for column in new:
            if column.name not in unfolded and (last is None or column.name in last.columns):
                continue
            described_column = described.column(column.name)
            default = constant_default(described_column.default if described_column else None)
            self.added[column.name] = AddedColumn((position.commit, position.seq), default)
            if default is not None:
                lake.fill(column, default, position)
            lake.folded(column.name, position, default)
        lake.fold_schema(position, (c.name for c in new))

    def add(self, item: tuple[str, Folded]) -> None:
        self.pending.append(item)
        if len(self.pending) >= self.batch_rows:
            self._merge(last=False)

    def finish(self) -> TableReport:
        self._merge(last=True)
        return self.report

    def _merge(self, last: bool) -> None:
        names, added = self.schema.names, self.added
        rows = [lake_row(key_row(k), f, names, added) for k, f in self.pending]
        written = self.lake.merge(
            self.schema.to_arrow(rows),
            progress=self.end if last else None,
            truncate=self.truncate,
            metadata={"dblog.operation": "compaction"},
        )
        self.truncate = None
        self.pending = []
        self.report.add(written)


class LazySpark:
    """The application's SparkSession, started only when a run needs Spark."""

    def __init__(self, master: str | None, ship: bool) -> None:
        self._master, self._ship = master, ship
        self._session: SparkSession | None = None

    def __call__(self) -> SparkSession:
        if self._session is None:
            builder = SparkSession.builder.appName("dblog-compact")
            if self._master:
                builder = builder.master(self._master)
                if self._master.startswith("local"):
                    # Local executors run this interpreter, which has the package installed.
                    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
            self._session = builder.getOrCreate()
            if self._ship:
                ship_package(self._session.sparkContext)
        return self._session

    def stop(self) -> None:
        if self._session is not None:
            self._session.stop()


def _describer(config: Config) -> Describe:
    return lambda table: source_lake_schema(config.source, table)


def _stored_horizon(config: Config) -> Position | None:
    """The tombstone horizon the state store holds (`DirectWindowStore.horizon`: the oldest lw
    of the direct windows whose rows are not committed yet, or the tailer's checkpoint)."""
    return StateStore(config.redis_client(), config.source.name).directs.horizon()


def _position(text: str) -> Position:
    commit, _, seq = text.partition(",")
    return Position(int(commit), int(seq or 0))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input", type=Path, required=True, help="directory of NDJSON events")
    parser.add_argument("--output", type=Path, required=True, help="lake root directory")
    parser.add_argument("--config", type=Path, help="dblog TOML: the source's catalog")
    parser.add_argument(
        "--source-type",
        choices=("postgres", "mysql"),
        help="type mapping of tables created from schema events (default: the config's)",
    )
    prune = parser.add_mutually_exclusive_group()
    prune.add_argument(
        "--prune-before",
        type=_position,
        metavar="COMMIT,SEQ",
        help="remove tombstones positioned before this horizon after the run",
    )
    prune.add_argument(
        "--prune",
        action="store_true",
        help="remove tombstones before the horizon the state store gives (needs --config)",
    )
    parser.add_argument(
        "--batch-rows",
        type=int,
        default=DEFAULT_BATCH_ROWS,
        help="at most this many keys of a table per merge (commit)",
    )
    parser.add_argument(
        "--local-below",
        type=int,
        default=DEFAULT_LOCAL_BELOW,
        metavar="BYTES",
        help="fold a run with fewer new bytes in the driver, starting no Spark job",
    )
    parser.add_argument("--master", help="Spark master; spark-submit's when omitted")
    parser.add_argument(
        "--no-ship-package",
        dest="ship_package",
        action="store_false",
        help="the workers have airflow_provider_dblog installed: do not send it to them",
    )
    args = parser.parse_args(argv)
    if args.prune and args.config is None:
        parser.error("--prune reads the horizon from the state store: pass --config")
    describe, source_type, horizon = None, args.source_type or "postgres", args.prune_before
    if args.config is not None:
        config = load_config(args.config)
        describe, source_type = _describer(config), args.source_type or config.source.type
        if args.prune:
            # Read before the run: a horizon only moves forward, so an older one is safe.
            horizon = _stored_horizon(config)
    options = CompactOptions(describe, source_type, horizon, args.batch_rows, args.local_below)
    spark = LazySpark(args.master, args.ship_package)
    try:
        with output_lock(args.output):  # before Spark starts: a refused run costs nothing
            try:
                report = _compact(spark, args.input, args.output, options)
            finally:
                spark.stop()
    except CompactionLocked as exc:
        print(f"compact: {exc}", file=sys.stderr)
        return EXIT_LOCKED
    except LakeSchemaError as exc:
        print(f"compact: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(json.dumps(report.to_json()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
