"""One compaction run: the new event bytes folded into the lake tables, holding the output
directory's lock.

A run reads the bytes after the read cursor (`segments.CompactState`), parses them and folds
each key's changes of the run into one row (`changes`: on Spark's executors, or in the driver
when the new bytes are fewer than `local_below`); the driver then evolves and merges each
touched table (`table_fold.TableFold`) in one commit per table (more for a run larger than
`batch_rows` keys of a table), which carries the table's progress: the position of the last
event folded into it. So data and progress commit together, a crash leaves each table at its
last commit, and a run started again reads the same bytes and skips, per table, the events its
progress covers. The cursor, written after every table's commit, only says where to start
reading next time.

A table the lake does not hold yet is created with the lake schema of the source's catalog
(`CompactOptions.describe`), or else of the run's first schema event of the table
(`evolution.new_table`). With a `prune_before` horizon, tombstones positioned before it are
removed from every table after the run (see `LakeTable.prune_tombstones` for what it must be).
Every run also removes the direct dumps' staged files that no driver will commit.

One compaction at a time per output directory: a run holds an exclusive lock on
`<output>/_compact.lock` and a second one is refused (`CompactionLocked`). The lake's other
writers, direct dumps, commit beside it: delta-rs runs a commit that lost a race again on the
new version.
"""

from __future__ import annotations

import fcntl
import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from airflow_provider_dblog.compaction.changes import Committed, driver_changes, spark_changes
from airflow_provider_dblog.compaction.evolution import Describe, new_table
from airflow_provider_dblog.compaction.rules import TRUNCATE, floors
from airflow_provider_dblog.compaction.segments import CompactState, plan_segments
from airflow_provider_dblog.compaction.table_fold import TableFold, TableReport
from airflow_provider_dblog.config import Config, ConfigError
from airflow_provider_dblog.core.event import TableRef
from airflow_provider_dblog.core.position import Position
from airflow_provider_dblog.lake.catalog import source_lake_schema
from airflow_provider_dblog.lake.direct import remove_stale_staged
from airflow_provider_dblog.lake.schema import LakeSchemaError
from airflow_provider_dblog.lake.table import LakeTable
from airflow_provider_dblog.sources.factory import DEFAULT_TYPE
from airflow_provider_dblog.state import StateStore

LOCK = "_compact.lock"
DEFAULT_BATCH_ROWS = 200_000
DEFAULT_LOCAL_BELOW = 64 * 1024 * 1024
DEFAULT_MERGE_FILES_AT = 32
"""The files its writes added that a table with deletion vectors may gather (each run's
write adds one) before a run merges them (`TableFold`): a write reads every file whose range
may hold its keys, and a fold of random keys spans them all."""
LEGACY_VERSIONS = ".versions"
STALE_STAGED_S = 24 * 3600
"""A direct dump's staged file older than this belongs to a chunk no driver will commit (a
Spark task attempt that died after staging): a chunk commits or gives up within minutes."""


class CompactionLocked(RuntimeError):
    """Another compaction of the same output directory is running."""


@dataclass
class CompactReport:
    """What a run did: where it stopped reading, and per table rows written (inserted or
    updated, tombstones included), rows deleted (a truncate's), the version committed; the
    source's commit times (ms) of the oldest and newest event folded that carries one (a
    log event does, a dump's row does not)."""

    state: CompactState
    tables: dict[str, TableReport] = field(default_factory=dict)
    events: int = 0
    committed: Committed = None
    pruned: int = 0
    stale_staged: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "position": self.state.position,
            "events": self.events,
            "committed_ms": None if self.committed is None else list(self.committed),
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
    a run with fewer new bytes than this folds in the driver, without Spark jobs.
    `merge_files_at`: a table with deletion vectors merges the files its writes added at the
    end of a run once this many have gathered (0: never; the maintenance's optimize does)."""

    describe: Describe | None = None
    source_type: str = DEFAULT_TYPE
    prune_before: Position | None = None
    batch_rows: int = DEFAULT_BATCH_ROWS
    local_below: int = DEFAULT_LOCAL_BELOW
    merge_files_at: int = DEFAULT_MERGE_FILES_AT

    @classmethod
    def of_source(
        cls,
        config: Config,
        *,
        source_type: str | None = None,
        prune: bool = False,
        prune_before: Position | None = None,
        batch_rows: int = DEFAULT_BATCH_ROWS,
        local_below: int = DEFAULT_LOCAL_BELOW,
        merge_files_at: int = DEFAULT_MERGE_FILES_AT,
    ) -> CompactOptions:
        """The options of a run beside a configured source: new tables take its catalog's
        schema, and with `prune` the horizon is the one its state store gives
        (`DirectWindowStore.horizon`: the oldest lw of the direct windows whose rows are not
        committed yet, or the tailer's checkpoint), read now, before the run: a horizon only
        moves forward, so an older one is safe."""
        if prune:
            store = StateStore(config.redis_client(), config.source.name)
            prune_before = store.directs.horizon()
        return cls(
            lambda table: source_lake_schema(config.source, table),
            source_type or config.source.type,
            prune_before,
            batch_rows,
            local_below,
            merge_files_at,
        )


def compaction_paths(config: Config) -> tuple[Path, Path]:
    """The tailer's event directory and the lake root a deployment's TOML names: what a
    compaction beside it reads and writes. `ConfigError` if it names either not."""
    output = config.output
    if output.get("type") != "ndjson" or "directory" not in output:
        raise ConfigError(
            "the compaction reads the tailer's NDJSON files, but [output] is type "
            f'{output.get("type")!r}: give [output] type = "ndjson" and its directory'
        )
    if config.lake_root is None:
        raise ConfigError("the TOML has no [lake] root: no lake to fold into")
    return Path(output["directory"]), Path(config.lake_root)


def compact(
    spark: SparkSession | Callable[[], SparkSession] | None,
    input_dir: Path,
    output: Path,
    options: CompactOptions = CompactOptions(),
) -> CompactReport:
    """One incremental run, holding the output directory's lock. `spark` is a session, or
    what starts one when the run needs Spark (after the lock is held: a refused run starts
    none); without it, every run folds in the driver."""
    session = (lambda: spark) if isinstance(spark, SparkSession) else spark
    with output_lock(output):
        return _compact(session, input_dir, output, options)


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
                driver_changes(segments, progress)
                if spark is None or sum(x.end - x.start for x in segments) < options.local_below
                else spark_changes(spark(), segments, progress)
            )
            table_ends, events = run.ends, run.table_events
            report.events, report.committed = run.count, run.committed
            truncated = floors((t, c) for t, c in events if c.op == TRUNCATE)
            folds = {}
            for table in sorted(table_ends):
                ref = TableRef.parse(table)
                changes = [c for t, c in events if t == table]
                lake = existing.get(table) or new_table(
                    output, ref, changes, options.describe, options.source_type
                )
                floor = Position(*truncated[table]) if table in truncated else None
                end = Position(*table_ends[table])
                folds[table] = TableFold(
                    lake, changes, floor, end, options.batch_rows, options.merge_files_at
                )
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
