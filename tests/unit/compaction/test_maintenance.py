"""The lake's maintenance on real Delta tables in a temp dir (delta-rs, no server), each read
back by DuckDB from the Parquet files the Delta log lists: an optimize leaves fewer files and
the same rows; a vacuum removes the files no version within the retention lists and nothing a
running writer, reader or direct dump still needs; a retention below the floor is refused; a
checkpoint lets the table open without the commits before it; an optimize and a direct commit
or a fold that race lose no row; the maintenance waits for a running compaction's lock."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import duckdb
import pytest
from deltalake import CommitProperties, DeltaTable
from deltalake.table import TableOptimizer

from airflow_provider_dblog.cli import lake as lake_cli
from airflow_provider_dblog.cli import main
from airflow_provider_dblog.compaction import maintenance
from airflow_provider_dblog.compaction.maintenance import (
    MaintenanceOptions,
    RetentionTooShort,
    maintain_lake,
    maintain_table,
)
from airflow_provider_dblog.compaction.run import CompactionLocked, output_lock
from airflow_provider_dblog.core.direct import DirectRecord
from airflow_provider_dblog.core.event import TableRef
from airflow_provider_dblog.core.position import Position
from airflow_provider_dblog.core.schema import Column, TableSchema
from airflow_provider_dblog.lake.direct import commit_staged, stage_rows
from airflow_provider_dblog.lake.schema import LakeRow, LakeSchemaError, lake_schema
from airflow_provider_dblog.lake.table import LakeTable, table_uri

pytestmark = pytest.mark.unit

TABLE = TableRef("app", "users")
SCHEMA = lake_schema(
    "postgres",
    TABLE,
    TableSchema(
        (
            Column("id", "bigint", False, None),
            Column("name", "text", True, None),
            Column("seen", "timestamp without time zone", True, None),  # protocol 3/7
        ),
        ("id",),
    ),
)
KEY = ("id",)
ONLY_OPTIMIZE = MaintenanceOptions(vacuum=False, checkpoint=False)


def lake_with_small_files(root: Path, table: TableRef = TABLE, commits: int = 12) -> LakeTable:
    """A table written by `commits` merges (inserts, updates of earlier keys, a delete), each
    leaving a file or more; the last one records the compaction's progress."""
    lake = LakeTable.open_or_create(root, table, SCHEMA)
    for n in range(commits):
        rows = [LakeRow({"id": n, "name": f"n{n}", "seen": "2026-01-02T03:04:05"}, 10 + n, 0, "c")]
        if n % 3 == 2:
            rows.append(LakeRow({"id": n - 2, "name": f"u{n}"}, 10 + n, 1, "u"))
        if n == commits - 1:
            rows.append(LakeRow({"id": 1}, 10 + n, 2, "d", deleted=True))
        progress = Position(10 + n, 2) if n == commits - 1 else None
        lake.merge(SCHEMA.to_arrow(rows), progress=progress)
    return lake


def read(root: Path, table: TableRef = TABLE) -> list[tuple[Any, ...]]:
    """Every stored row, tombstones included, as DuckDB reads the files the log lists."""
    files = LakeTable.open(root, table).delta.file_uris()
    query = (
        "SELECT id, name, _dblog_commit, _dblog_seq, _dblog_deleted "
        "FROM read_parquet($files, union_by_name = true) ORDER BY id"
    )
    return duckdb.sql(query, params={"files": files}).fetchall()


def parquet_on_disk(root: Path, table: TableRef = TABLE) -> set[str]:
    return {p.name for p in Path(table_uri(root, table)).glob("*.parquet")}


def listed(root: Path, table: TableRef = TABLE) -> set[str]:
    return {Path(u).name for u in LakeTable.open(root, table).delta.file_uris()}


def test_optimize_leaves_fewer_files_and_the_same_rows(tmp_path: Path) -> None:
    lake = lake_with_small_files(tmp_path)
    before, files, version = read(tmp_path), len(listed(tmp_path)), lake.version
    assert files >= 5
    report = maintain_table(tmp_path, TABLE, ONLY_OPTIMIZE)
    assert (report.compacted, report.written, report.files) == (files, 1, 1)
    assert report.version == version + 1 and report.vacuumed is None
    assert read(tmp_path) == before
    after = LakeTable.open(tmp_path, TABLE)
    assert (after.key, after.progress, after.arrow_schema) == (
        KEY,
        lake.progress,
        lake.arrow_schema,
    )
    old = LakeTable.open(tmp_path, TABLE, version)  # time travel: its files are kept
    assert old.rows(include_tombstones=True).num_rows == len(before)
    assert maintain_table(tmp_path, TABLE, ONLY_OPTIMIZE).compacted == 0  # nothing left to do


def test_vacuum_removes_the_files_no_version_lists_and_the_table_reads_the_same(
    tmp_path: Path,
) -> None:
    lake_with_small_files(tmp_path)
    version, before = LakeTable.open(tmp_path, TABLE).version, read(tmp_path)
    maintain_table(tmp_path, TABLE, ONLY_OPTIMIZE)
    unlisted = parquet_on_disk(tmp_path) - listed(tmp_path)
    assert len(unlisted) >= 5
    # A retention of 0, below the floor: the tests alone lower it.
    dry = MaintenanceOptions(retention_hours=0, dry_run=True, min_retention_hours=0)
    report = maintain_table(tmp_path, TABLE, dry)
    assert report.vacuumed is not None and set(report.vacuumed) == unlisted
    assert report.compacted is None and report.checkpoint is None
    assert parquet_on_disk(tmp_path) >= unlisted, "a dry run removes nothing"
    now = MaintenanceOptions(
        optimize=False, checkpoint=False, retention_hours=0, min_retention_hours=0
    )
    report = maintain_table(tmp_path, TABLE, now)
    assert report.vacuumed is not None and set(report.vacuumed) == unlisted
    assert parquet_on_disk(tmp_path) == listed(tmp_path)
    assert read(tmp_path) == before
    with pytest.raises(Exception, match="not found"):  # what time travel past it loses
        LakeTable.open(tmp_path, TABLE, version).rows()


def test_a_retention_below_the_floor_is_refused_before_anything_changes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(RetentionTooShort, match="below the floor of 1"):
        MaintenanceOptions(retention_hours=0)
    lake_with_small_files(tmp_path / "lake")
    version = LakeTable.open(tmp_path / "lake", TABLE).version
    config = write_config(tmp_path)
    assert main(["lake", "maintain", "-c", str(config), "--retention-hours", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dblog: error: a vacuum retention of 0 hours is below the floor of 1")
    assert "--retention-hours 1 or more" in err
    assert LakeTable.open(tmp_path / "lake", TABLE).version == version


def test_deletion_vectors_are_enabled_per_table_from_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lake_with_small_files(tmp_path / "lake", commits=2)
    config = write_config(tmp_path)
    absent = ["--table", "app.absent"]
    assert main(["lake", "enable-deletion-vectors", "-c", str(config), *absent]) == 2
    assert "no lake table of app.absent under" in capsys.readouterr().err
    assert not LakeTable.open(tmp_path / "lake", TABLE).deletion_vectors
    later = TableRef("app", "later")
    assert not LakeTable.open_or_create(tmp_path / "lake", later, SCHEMA).deletion_vectors
    assert main(["lake", "enable-deletion-vectors", "-c", str(config), "--table", "app.users"]) == 0
    assert capsys.readouterr().out == "app.users: deletion vectors enabled\n"
    created = LakeTable.open_or_create(tmp_path / "lake", TableRef("app", "new"), SCHEMA)
    assert not created.deletion_vectors, "naming tables sets no default for new ones"
    for said in ("enabled", "were enabled already"):
        assert main(["lake", "enable-deletion-vectors", "-c", str(config)]) == 0
        assert capsys.readouterr().out.splitlines() == [
            f"app.later: deletion vectors {said}",
            f"app.new: deletion vectors {said}",
            "app.users: deletion vectors were enabled already",
            f"tables created under {tmp_path / 'lake'} from now on: deletion vectors enabled",
        ]
    lake = LakeTable.open(tmp_path / "lake", TABLE)
    assert lake.deletion_vectors
    assert sorted(lake.delta.protocol().reader_features or ()) == [
        "deletionVectors",
        "timestampNtz",
    ]
    newest = LakeTable.open_or_create(tmp_path / "lake", TableRef("app", "newest"), SCHEMA)
    assert newest.deletion_vectors, "a table created after it has them from the start"


def test_the_default_is_set_for_a_lake_that_has_no_table_yet(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(tmp_path)  # its root does not exist yet
    assert main(["lake", "enable-deletion-vectors", "-c", str(config)]) == 0
    root = tmp_path / "lake"
    said = f"tables created under {root} from now on: deletion vectors enabled\n"
    assert capsys.readouterr().out == said
    assert LakeTable.open_or_create(root, TABLE, SCHEMA).deletion_vectors


def test_the_vacuum_keeps_what_a_running_writer_or_reader_needs(tmp_path: Path) -> None:
    """At the floor (1 hour): the files an optimize just removed stay (a reader of the version
    before it, opened a moment ago, still reads them), and so does a file a merge has written
    and not committed yet; a file of a merge that died two hours ago goes. Staged direct-dump
    files beside the tables are not the vacuum's."""
    lake_with_small_files(tmp_path)
    reader = DeltaTable(table_uri(tmp_path, TABLE))  # opened before the optimize
    staged = Path(stage_rows(tmp_path, TABLE, SCHEMA, [{"id": 99, "name": "staged"}]))
    os.utime(staged, (time.time() - 7200, time.time() - 7200))
    maintain_table(tmp_path, TABLE, ONLY_OPTIMIZE)
    directory = Path(table_uri(tmp_path, TABLE))
    writing, died = directory / "part-00000-writing.parquet", directory / "part-00000-died.parquet"
    for orphan in (writing, died):
        orphan.write_bytes(staged.read_bytes())
    os.utime(died, (time.time() - 7200, time.time() - 7200))
    report = maintain_table(tmp_path, TABLE, MaintenanceOptions(retention_hours=1))
    assert report.vacuumed == [died.name]
    assert writing.exists() and staged.exists()
    assert reader.to_pyarrow_table().num_rows == 12  # every file of its version is there


def test_a_checkpoint_lets_the_table_open_without_the_commits_before_it(tmp_path: Path) -> None:
    lake = lake_with_small_files(tmp_path)
    before = read(tmp_path)
    report = maintain_table(tmp_path, TABLE, MaintenanceOptions(optimize=False, vacuum=False))
    log = Path(table_uri(tmp_path, TABLE)) / "_delta_log"
    assert report.checkpoint == lake.version
    assert (log / f"{report.checkpoint:020d}.checkpoint.parquet").exists()
    assert json.loads((log / "_last_checkpoint").read_text())["version"] == report.checkpoint
    for commit in log.glob("*.json"):  # the history before it, gone: the state is in it
        if int(commit.stem) < report.checkpoint:
            commit.unlink()
    reopened = LakeTable.open(tmp_path, TABLE)
    assert reopened.version == report.checkpoint and read(tmp_path) == before
    assert (reopened.key, reopened.progress) == (KEY, lake.progress)


def direct_commit(root: Path, keys: range, commit: int, name: str) -> int:
    """A direct dump's chunk of `keys`, committed by its driver, positioned just after hw."""
    handle = stage_rows(root, TABLE, SCHEMA, [{"id": k, "name": name} for k in keys])
    record = DirectRecord("w", Position(commit - 1, 0), Position(commit, 0), frozenset())
    return commit_staged(root, TABLE, [handle], SCHEMA, record, KEY)


def expected_after(before: list[tuple[Any, ...]], keys: range, name: str) -> list[str | None]:
    """The names by key once the rows of `keys` are written with `name` over `before`."""
    names = {row[0]: row[1] for row in before} | {k: name for k in keys}
    return [names[k] for k in sorted(names)]


def test_an_optimize_that_loses_to_a_direct_commit_runs_again_and_loses_no_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A direct dump's driver commits between the optimize's read and its commit, rewriting
    files the optimize read: the optimize's commit conflicts, and it runs again on the new
    version."""
    lake_with_small_files(tmp_path)
    before = read(tmp_path)
    real = LakeTable._write_ranges
    attempts = []

    def write_after_a_direct_commit(
        self: LakeTable, writes: Any, rows: Any, properties: CommitProperties
    ) -> None:
        if properties.custom_metadata == maintenance.OPERATION:  # the optimize's, not the dump's
            attempts.append(writes)
            if len(attempts) == 1:
                assert direct_commit(tmp_path, range(0, 6), 100, "direct") == 6
        real(self, writes, rows, properties)

    monkeypatch.setattr(LakeTable, "_write_ranges", write_after_a_direct_commit)
    report = maintain_table(tmp_path, TABLE, ONLY_OPTIMIZE)
    assert len(attempts) == 2 and report.written == 1
    rows = read(tmp_path)
    assert [r[1] for r in rows] == expected_after(before, range(0, 6), "direct")
    assert len({r[0] for r in rows}) == len(rows), "one row per key"


def test_a_table_of_another_key_bin_packs_with_delta_rs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A date key has no ranges to keep: delta-rs's optimize packs its small files."""
    table = TableRef("app", "days")
    schema = lake_schema(
        "postgres", table, TableSchema((Column("day", "date", False, None),), ("day",))
    )
    lake = LakeTable.open_or_create(tmp_path, table, schema)
    for n in range(6):
        lake.merge(schema.to_arrow([LakeRow({"day": f"2024-01-0{n + 1}"}, 10 + n, 0, "c")]))
    files = len(listed(tmp_path, table))
    packs = []
    real = TableOptimizer.compact

    def counted(self: TableOptimizer, **kwargs: Any) -> dict[str, Any]:
        packs.append(kwargs)
        return real(self, **kwargs)

    monkeypatch.setattr(TableOptimizer, "compact", counted)
    report = maintain_table(tmp_path, table, ONLY_OPTIMIZE)
    assert len(packs) == 1 and (report.compacted, report.written) == (files, 1)
    assert len(LakeTable.open(tmp_path, table).rows()) == 6


def test_a_fold_that_loses_to_the_optimize_runs_again_and_loses_no_row(tmp_path: Path) -> None:
    lake = lake_with_small_files(tmp_path)  # the compaction's handle, read before the optimize
    before = read(tmp_path)
    maintain_table(tmp_path, TABLE, ONLY_OPTIMIZE)
    fold = [LakeRow({"id": k, "name": "folded"}, 200, k, "u") for k in (0, 5, 11, 40)]
    written = lake.merge(SCHEMA.to_arrow(fold), progress=Position(200, 40))
    assert written.rows == 4 and written.version == lake.version
    names = {row[0]: row[1] for row in before} | {k: "folded" for k in (0, 5, 11, 40)}
    rows = read(tmp_path)
    assert {r[0]: r[1] for r in rows} == names and len(rows) == len(names)
    assert LakeTable.open(tmp_path, TABLE).progress == Position(200, 40)


def test_maintenance_beside_direct_commits_loses_nothing(tmp_path: Path) -> None:
    """Direct dumps' commits in a thread while the maintenance runs again and again (optimize,
    vacuum at the floor, checkpoint): whatever the interleaving, every chunk's rows are there."""
    lake_with_small_files(tmp_path)
    before = read(tmp_path)
    failures: list[BaseException] = []

    def dump() -> None:
        try:
            for n in range(12):
                direct_commit(tmp_path, range(n * 3, n * 3 + 5), 300 + n, f"d{n}")
        except BaseException as exc:
            failures.append(exc)

    writer = threading.Thread(target=dump)
    writer.start()
    runs = 0
    while writer.is_alive() or runs < 2:
        maintain_table(tmp_path, TABLE, MaintenanceOptions(retention_hours=1))
        runs += 1
    writer.join()
    assert not failures
    names = {row[0]: row[1] for row in before}
    for n in range(12):
        names.update({k: f"d{n}" for k in range(n * 3, n * 3 + 5)})
    rows = read(tmp_path)
    assert {r[0]: r[1] for r in rows} == names and len(rows) == len(names)


def test_the_maintenance_waits_for_a_running_compaction(tmp_path: Path) -> None:
    lake_with_small_files(tmp_path)
    version = LakeTable.open(tmp_path, TABLE).version
    reports: list[Any] = []
    with output_lock(tmp_path):  # what a compaction run holds
        waiting = threading.Thread(
            target=lambda: reports.extend(maintain_lake(tmp_path, None, ONLY_OPTIMIZE))
        )
        waiting.start()
        time.sleep(1.5)
        assert waiting.is_alive() and LakeTable.open(tmp_path, TABLE).version == version
    waiting.join(30)
    assert [r.written for r in reports] == [1]


def test_a_compaction_that_holds_the_lock_too_long_fails_the_maintenance(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lake_with_small_files(tmp_path / "lake")
    config = write_config(tmp_path)
    impatient = MaintenanceOptions(lock_timeout_s=0.3)
    with output_lock(tmp_path / "lake"):
        with pytest.raises(CompactionLocked, match=r"held its lock for the 0\.3 s"):
            maintain_lake(tmp_path / "lake", None, impatient)
        argv = ["lake", "maintain", "-c", str(config), "--lock-timeout", "0.2"]
        assert main(argv) == lake_cli.EXIT_LOCKED == 75
    assert "compaction" in capsys.readouterr().err


def test_every_lake_table_by_default_and_only_those_named(tmp_path: Path) -> None:
    other = TableRef("app", "orders")
    for table in (TABLE, other):
        lake_with_small_files(tmp_path, table, commits=4)
    (tmp_path / "not.a.table").mkdir()
    done: list[str] = []
    every = maintain_lake(tmp_path, None, ONLY_OPTIMIZE, done=lambda r: done.append(r.table))
    assert [r.table for r in every] == done == ["app.orders", "app.users"]
    assert [r.table for r in maintain_lake(tmp_path, [other], ONLY_OPTIMIZE)] == ["app.orders"]
    with pytest.raises(LakeSchemaError, match=r"no lake table of app\.absent under"):
        maintain_lake(tmp_path, [TableRef("app", "absent"), TABLE], ONLY_OPTIMIZE)
    assert maintain_lake(tmp_path / "empty") == []


def write_config(directory: Path, lake: bool = True) -> Path:
    config = directory / "dblog.toml"
    text = (
        '[source]\nname = "shop"\ndsn = "host=127.0.0.1 dbname=shop"\ntables = ["app.users"]\n'
        '[redis]\nurl = "redis://127.0.0.1:6379/0"\n'
        f'[output]\ntype = "ndjson"\ndirectory = "{directory / "events"}"\n'
    )
    if lake:
        text += f'[lake]\nroot = "{directory / "lake"}"\n'
    config.write_text(text)
    return config


def test_the_command_prints_what_each_step_did_per_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lake_with_small_files(tmp_path / "lake", commits=4)
    files = len(listed(tmp_path / "lake"))
    config = write_config(tmp_path)
    assert main(["lake", "maintain", "-c", str(config), "--dry-run"]) == 0
    dry = capsys.readouterr().out
    assert dry.startswith("app.users: dry run: vacuum would remove 0 files (168 h retention); ")
    assert main(["lake", "maintain", "-c", str(config)]) == 0
    out = capsys.readouterr().out.strip()
    version = LakeTable.open(tmp_path / "lake", TABLE).version
    assert out == (
        f"app.users: optimize rewrote {files} files into 1; "
        "vacuum removed 0 files (168 h retention); "
        f"checkpoint at version {version}; 1 data file, version {version}"
    )
    assert (
        main(["lake", "maintain", "-c", str(config), "--checkpoint", "--table", "app.users"]) == 0
    )
    assert capsys.readouterr().out.startswith(f"app.users: checkpoint at version {version}; ")
    assert main(["lake", "maintain", "-c", str(config), "--table", "app.absent"]) == 2
    assert "no lake table of app.absent" in capsys.readouterr().err
    assert main(["lake", "maintain", "-c", str(write_config(tmp_path, lake=False))]) == 2
    assert "has no [lake] root" in capsys.readouterr().err


def test_the_command_s_defaults_are_the_maintenance_s() -> None:
    assert lake_cli.DEFAULT_RETENTION_HOURS == maintenance.DEFAULT_RETENTION_HOURS
    assert lake_cli.DEFAULT_LOCK_TIMEOUT_S == maintenance.DEFAULT_LOCK_TIMEOUT_S
    assert maintenance.MIN_RETENTION_HOURS >= 1
