"""The lake tables' upkeep: small files compacted, files no version needs removed, the Delta log
checkpointed. `dblog lake maintain` and the `dblog_lake_maintenance` DAG run it.

Why. Every merge rewrites the files holding the keys it matched and adds one for the keys it
inserted, so a table that the compaction and direct dumps write all day collects small files,
and files that no current version lists stay on disk; and a reader finds a table's state by
replaying the log from its last checkpoint. Per table, in order:

1. **optimize** (`LakeTable.optimize`): the small files rewritten into few large ones. A table
   kept in key ranges (`lake/clustered.py`) keeps them: each run of neighbouring small files
   becomes one range, a commit replacing its rows with the same rows sorted by key; other
   tables use delta-rs's `optimize.compact`, one commit that changes no row (`dataChange`
   false). Either conflicts with a commit that removed a file it read: a merge of the
   compaction or of a direct dump's driver that lands between its read and its commit makes
   it fail (`CommitFailedError`), and it runs again on the new version; a merge that read a
   file it removed fails the same way and the merge runs again (`LakeTable.merge`). Either
   way no row is lost, and a key never gets a second row. A table in key ranges with
   deletion vectors merges its small files (each write's, those mostly marked deleted)
   among themselves instead, in commits written here (`delta_log.LostCommit` when another
   commit came first: it runs again), leaving the files they overlap.
2. **vacuum** (delta-rs `vacuum`, full mode): the files removed from the table more than the
   retention ago, and the files no version lists (a merge that died before its commit) that
   were written more than the retention ago. A file a writer wrote and has not committed yet is
   younger than any allowed retention, so it stays; so does every file of a version that was
   current within the retention, which is what a reader that opened it may still read. Then
   the key indexes (`lake/key_index.py`) of the data files gone.
3. **checkpoint**: a checkpoint of the log at the current version, so that opening the table
   reads it and the commits after it rather than every commit since the table was made (delta-rs
   writers also write one every 100 commits); then the log entries older than the table's
   `delta.logRetentionDuration` (30 days) that the checkpoint covers are removed.

Retention. Vacuum ends time travel to the versions whose files it removes: a version stays
readable while it is less than the retention past being the latest (7 days by default). Below
`MIN_RETENTION_HOURS` a vacuum could remove a file a running merge wrote and has not committed
yet, leaving the table listing a file that is gone, so a shorter retention is refused
(`RetentionTooShort`); there is no override outside the tests' `min_retention_hours`. The
table's `delta.deletedFileRetentionDuration` (7 days) is not the floor, but a checkpoint forgets
removals older than it, and the vacuum then judges those files by when they were written: a
retention above it keeps them only if the property is raised too.

Each table is maintained holding the lake's compaction lock (`run.output_lock`): a compaction
run and the maintenance of a table never overlap, so an optimize does not lose its commit to
every merge of a long run (a run started meanwhile is refused and retried, as for two runs).
The maintenance waits for a running compaction for up to `lock_timeout_s`. Direct dumps commit
beside it; Delta's conflict checks keep them apart, as above.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

from deltalake import CommitProperties, DeltaTable
from deltalake.exceptions import CommitFailedError

from airflow_provider_dblog.compaction.run import CompactionLocked, output_lock
from airflow_provider_dblog.core.errors import DBLogError
from airflow_provider_dblog.core.event import TableRef
from airflow_provider_dblog.lake import delta_log, key_index
from airflow_provider_dblog.lake.schema import LakeSchemaError
from airflow_provider_dblog.lake.table import LakeTable, give_new_tables_deletion_vectors

DEFAULT_RETENTION_HOURS = 7 * 24
MIN_RETENTION_HOURS = 1
"""The shortest retention a vacuum may have: longer than any merge takes between writing its
files and committing them, and than a reader takes to read a version it opened."""
DEFAULT_LOCK_TIMEOUT_S = 900.0
ATTEMPTS = 10
OPERATION = {"dblog.operation": "maintenance"}
T = TypeVar("T")


class RetentionTooShort(DBLogError, ValueError):
    """A vacuum retention below the floor: files a running writer or reader needs could go."""


@dataclass(frozen=True)
class MaintenanceOptions:
    """Which steps run, and the vacuum's retention (hours, at least `min_retention_hours`).
    `dry_run`: change nothing, list what the vacuum would remove."""

    optimize: bool = True
    vacuum: bool = True
    checkpoint: bool = True
    retention_hours: int = DEFAULT_RETENTION_HOURS
    dry_run: bool = False
    lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S
    min_retention_hours: int = MIN_RETENTION_HOURS

    def __post_init__(self) -> None:
        if self.retention_hours < self.min_retention_hours:
            raise RetentionTooShort(
                f"a vacuum retention of {self.retention_hours} hours is below the floor of "
                f"{self.min_retention_hours}: a shorter one could remove files a running merge "
                "has written and not committed yet, or a reader is still reading; give "
                f"--retention-hours {self.min_retention_hours} or more (default "
                f"{DEFAULT_RETENTION_HOURS})"
            )


@dataclass
class TableMaintenance:
    """What the maintenance did to one table, None for a step that did not run: files the
    optimize rewrote (`compacted`) into `written` ones, files the vacuum removed (or would
    remove, in a dry run), the version of the checkpoint written; and the table's version and
    data files after."""

    table: str
    version: int
    files: int
    compacted: int | None = None
    written: int | None = None
    vacuumed: list[str] | None = None
    checkpoint: int | None = None
    dry_run: bool = False

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self, retention_hours: int) -> str:
        """One line for a person: what each step did."""
        parts = []
        if self.compacted is not None:
            parts.append(f"optimize rewrote {_files(self.compacted)} into {self.written}")
        if self.vacuumed is not None:
            removed = "would remove" if self.dry_run else "removed"
            retention = f"{retention_hours} h retention"
            parts.append(f"vacuum {removed} {_files(len(self.vacuumed))} ({retention})")
        if self.checkpoint is not None:
            parts.append(f"checkpoint at version {self.checkpoint}")
        parts.append(f"{_files(self.files, 'data ')}, version {self.version}")
        dry = " dry run:" if self.dry_run else ""
        return f"{self.table}:{dry} {'; '.join(parts)}"


def _files(count: int, kind: str = "") -> str:
    return f"{count} {kind}file{'' if count == 1 else 's'}"


def maintain_lake(
    root: str | Path,
    tables: Sequence[TableRef] | None = None,
    options: MaintenanceOptions = MaintenanceOptions(),
    *,
    done: Callable[[TableMaintenance], None] | None = None,
) -> list[TableMaintenance]:
    """Maintain `tables` of the lake under `root` (default: every lake table there), one at a
    time, each under the lake's compaction lock; `done` is called with each table's report as
    it ends."""
    root = Path(root)
    reports = []
    for table in chosen_tables(root, tables):
        with compaction_lock(root, options.lock_timeout_s):
            report = maintain_table(root, table, options)
        if done is not None:
            done(report)
        reports.append(report)
    return reports


def chosen_tables(root: Path, tables: Sequence[TableRef] | None) -> list[TableRef]:
    """`tables`, each of which the lake under `root` must hold (`LakeSchemaError` names
    those it lacks), or every lake table there."""
    if tables is None:
        return lake_table_refs(root)
    missing = [str(t) for t in tables if not LakeTable.exists(root, t)]
    if missing:
        raise LakeSchemaError(f"no lake table of {', '.join(missing)} under {root}")
    return list(tables)


def enable_deletion_vectors(
    root: str | Path, tables: Sequence[TableRef] | None = None
) -> list[tuple[TableRef, bool]]:
    """Turn on deletion vectors in `tables` of the lake under `root` (default: every lake
    table there, and the tables created there later: `give_new_tables_deletion_vectors`;
    `LakeTable.enable_deletion_vectors`): each table, and whether this turned them on
    (False: they were on)."""
    root = Path(root)
    chosen = chosen_tables(root, tables)
    if tables is None:
        give_new_tables_deletion_vectors(root)
    return [(table, LakeTable.open(root, table).enable_deletion_vectors()) for table in chosen]


def lake_table_refs(root: Path) -> list[TableRef]:
    """The lake tables under `root`: its `schema.table` directories that hold a Delta table
    (not `_dblog_staged`, the lock or the read cursor)."""
    found = []
    for path in sorted(root.iterdir()) if root.is_dir() else ():
        try:
            table = TableRef.parse(path.name)
        except ValueError:
            continue
        if path.is_dir() and path.name[0] not in "._" and LakeTable.exists(root, table):
            found.append(table)
    return found


def maintain_table(
    root: str | Path, table: TableRef, options: MaintenanceOptions = MaintenanceOptions()
) -> TableMaintenance:
    """Optimize, vacuum and checkpoint one table, as `options` says (the caller holds the
    lock, or knows no compaction runs)."""
    lake = LakeTable.open(root, table)
    delta = lake.delta
    report = TableMaintenance(str(table), delta.version(), 0, dry_run=options.dry_run)
    if options.optimize and not options.dry_run:
        report.compacted, report.written = lake.optimize(_commit())
    if options.vacuum and lake.deletion_vectors:
        report.vacuumed = _vacuum_keeping_vectors(lake, options)
    elif options.vacuum:
        report.vacuumed = _retried(
            delta,
            lambda: delta.vacuum(
                retention_hours=options.retention_hours,
                dry_run=options.dry_run,
                enforce_retention_duration=False,  # the floor above is the rule here
                full=True,
                commit_properties=_commit(),
            ),
        )
    if options.vacuum and not options.dry_run:
        since = time.time() - options.retention_hours * 3600
        orphans = key_index.remove_orphans(lake.directory, since)
        indexes = [f"{key_index.DIRECTORY}/{name}" for name in orphans]
        report.vacuumed = [*(report.vacuumed or ()), *indexes]
    if options.checkpoint and not options.dry_run:
        delta.update_incremental()
        delta.create_checkpoint()
        delta.cleanup_metadata()
        report.checkpoint = delta.version()
    delta.update_incremental()
    report.version = delta.version()
    report.files = len(delta.file_uris())
    return report


def _vacuum_keeping_vectors(lake: LakeTable, options: MaintenanceOptions) -> list[str]:
    """The vacuum of a table with deletion vectors. delta-rs's full vacuum takes their files
    for files no version lists and removes them, those in use too: here the files its dry
    run lists less the deletion vector files, and the deletion vector files no version
    within the retention refers to, written more than the retention ago (as a data file, one
    written for a commit yet to come is younger)."""
    delta, directory = lake.delta, Path(lake.directory)
    listed = delta.vacuum(
        retention_hours=options.retention_hours,
        dry_run=True,
        enforce_retention_duration=False,
        full=True,
    )
    found = {directory / Path(p).name for p in listed if not _vector_file(Path(p))}
    since_ms = (time.time() - options.retention_hours * 3600) * 1000
    in_use = delta_log.vectors_in_use(directory, delta.version(), int(since_ms))
    if in_use is not None:
        found |= {
            path
            for path in directory.glob("deletion_vector_*.bin")
            if path.name not in in_use and path.stat().st_mtime * 1000 < since_ms
        }
    if not options.dry_run:
        for path in found:
            path.unlink(missing_ok=True)
    return sorted(path.name for path in found)


def _vector_file(path: Path) -> bool:
    return path.name.startswith("deletion_vector_") and path.suffix == ".bin"


@contextmanager
def compaction_lock(root: Path, timeout_s: float) -> Iterator[None]:
    """Hold the lake's compaction lock (`run.output_lock`), waiting up to `timeout_s` for a
    running compaction to end; `CompactionLocked` if it does not."""
    deadline = time.monotonic() + timeout_s
    while True:
        stack = ExitStack()
        try:
            stack.enter_context(output_lock(root))
        except CompactionLocked:
            if time.monotonic() >= deadline:
                raise CompactionLocked(
                    f"a compaction of {root} held its lock for the {timeout_s:g} s the "
                    "maintenance waits: run it again when the compaction has ended"
                ) from None
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
            continue
        with stack:
            yield
        return


def _commit() -> CommitProperties:
    return CommitProperties(custom_metadata=OPERATION)


def _retried(delta: DeltaTable, step: Callable[[], T]) -> T:
    """Run a step on the latest version, again each time another writer's commit won; a lost
    optimize leaves the files it wrote unlisted, for a later vacuum."""
    for attempt in range(ATTEMPTS):
        delta.update_incremental()
        try:
            return step()
        except CommitFailedError:
            if attempt == ATTEMPTS - 1:
                raise
            time.sleep(random.uniform(0, min(2.0, 0.05 * 2**attempt)))
    raise AssertionError("unreachable")
