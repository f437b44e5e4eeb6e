"""The lake table's rules on real Delta tables in a temp dir (delta-rs, no server): the highest
position per key wins, tombstones refuse older rows until pruned, a truncate's floor refuses
rows below it, a writer whose commit loses a race runs again, direct dumps stage and commit,
and a second engine (DuckDB, reading the Parquet files the Delta log lists) sees the same."""

from __future__ import annotations

import os
from pathlib import Path

import duckdb
import pytest

from airflow_provider_dblog.core.direct import DirectRecord
from airflow_provider_dblog.core.event import Key, TableRef
from airflow_provider_dblog.core.position import Position
from airflow_provider_dblog.core.schema import Column, TableSchema
from airflow_provider_dblog.direct_target import DirectTarget
from airflow_provider_dblog.lake.direct import (
    LakeDirectTarget,
    commit_staged,
    remove_stale_staged,
    stage_rows,
    staging_dir,
)
from airflow_provider_dblog.lake.schema import LakeRow, lake_schema
from airflow_provider_dblog.lake.table import LakeTable

pytestmark = pytest.mark.unit

TABLE = TableRef("app", "users")
SCHEMA = lake_schema(
    "postgres",
    TABLE,
    TableSchema(
        (
            Column("id", "bigint", False, None),
            Column("name", "text", True, None),
            Column("big", "text", True, None),
        ),
        ("id",),
    ),
)


@pytest.fixture(autouse=True, params=["rewrite", "deletion vectors"])
def layout(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every rule holds whether a write rewrites the files its keys fall in or marks the rows
    it replaces deleted in deletion vectors (tables created with them enabled)."""
    if request.param == "deletion vectors":
        created = LakeTable.open_or_create.__func__  # type: ignore[attr-defined]

        def with_vectors(cls: type[LakeTable], *args: object, **kwargs: object) -> LakeTable:
            found: LakeTable = created(cls, *args, **kwargs)
            found.enable_deletion_vectors()
            return found

        monkeypatch.setattr(LakeTable, "open_or_create", classmethod(with_vectors))
    return str(request.param)


def row(key: int, commit: int, name: str | None = None, op: str = "c", **extra: object) -> LakeRow:
    values = {"id": key} if name is None else {"id": key, "name": name}
    return LakeRow(values, commit, 0, op, **extra)  # type: ignore[arg-type]


def tombstone(key: int, commit: int) -> LakeRow:
    return LakeRow({"id": key}, commit, 0, "d", deleted=True)


KEY = ("id",)


def record(hw: Position, changed: frozenset[Key] = frozenset()) -> DirectRecord:
    """The tailer's record of a direct window closed at `hw` (lw just before it)."""
    return DirectRecord("w", Position(hw.commit - 1, 0), hw, changed)


def current(lake: LakeTable) -> dict[int, str | None]:
    lake.refresh()
    return {r["id"]: r["name"] for r in lake.rows().to_pylist()}


def merge(lake: LakeTable, *rows: LakeRow, **options: object) -> None:
    lake.merge(SCHEMA.to_arrow(list(rows)), **options)  # type: ignore[arg-type]


def test_the_highest_position_per_key_wins_and_a_replay_changes_nothing(tmp_path: Path) -> None:
    lake = LakeTable.open_or_create(tmp_path, TABLE, SCHEMA)
    merge(lake, row(1, 10, "a"), row(2, 10, "b"))
    merge(lake, row(1, 12, "a2", "u"), row(2, 9, "stale", "r"))
    assert current(lake) == {1: "a2", 2: "b"}
    version = lake.version
    merge(lake, row(1, 12, "a2", "u"), row(2, 10, "b"))  # the same rows again
    assert current(lake) == {1: "a2", 2: "b"}
    assert LakeTable.open(tmp_path, TABLE, version).rows().num_rows == 2  # time travel


def test_within_one_commit_the_higher_seq_wins(tmp_path: Path) -> None:
    """A write whose rows all come after the stored rows' newest commit may take the log's
    statistics for their positions; one sharing that commit must compare the seq."""
    lake = LakeTable.open_or_create(tmp_path, TABLE, SCHEMA)
    merge(
        lake,
        LakeRow({"id": 1, "name": "a"}, 10, 5, "c"),
        LakeRow({"id": 2, "name": "b"}, 10, 5, "c"),
    )
    merge(
        lake,
        LakeRow({"id": 1, "name": "x"}, 10, 4, "u"),
        LakeRow({"id": 2, "name": "b2"}, 10, 6, "u"),
    )
    assert current(lake) == {1: "a", 2: "b2"}
    merge(lake, LakeRow({"id": 1, "name": "a3"}, 11, 0, "u"))
    assert current(lake) == {1: "a3", 2: "b2"}


def test_a_delete_folded_before_an_older_direct_row_keeps_the_key_deleted(
    tmp_path: Path,
) -> None:
    """A race: a delete after hw reaches the lake before the dump's row
    positioned at hw; its tombstone refuses the row."""
    lake = LakeTable.open_or_create(tmp_path, TABLE, SCHEMA)
    merge(lake, tombstone(1, 20))
    handle = stage_rows(tmp_path, TABLE, SCHEMA, [{"id": 1, "name": "dumped"}])
    assert commit_staged(tmp_path, TABLE, [handle], SCHEMA, record(Position(15, 3)), KEY) == 0
    assert current(lake) == {}
    [stored] = lake.rows(include_tombstones=True).to_pylist()
    assert stored["_dblog_deleted"] and stored["_dblog_commit"] == 20


def test_pruning_tombstones_too_early_lets_an_older_row_back(tmp_path: Path) -> None:
    """Why the horizon matters: pruned past a row still on its way, the deleted key returns;
    pruned only up to the oldest uncommitted row's position, it does not."""
    lake = LakeTable.open_or_create(tmp_path, TABLE, SCHEMA)
    merge(lake, tombstone(1, 20), tombstone(2, 20))
    assert lake.prune_tombstones(Position(15, 0)) == 0  # horizon before the tombstones
    merge(lake, row(1, 15, "late", "r"))
    assert current(lake) == {}
    assert lake.prune_tombstones(Position(21, 0)) == 2  # too early: a row at 15 still comes
    merge(lake, row(2, 15, "late", "r"))
    assert current(lake) == {2: "late"}


def test_a_truncate_removes_older_rows_and_refuses_later_older_ones(tmp_path: Path) -> None:
    lake = LakeTable.open_or_create(tmp_path, TABLE, SCHEMA)
    merge(lake, row(1, 10, "a"), row(2, 10, "b"), tombstone(3, 10))
    merge(lake, row(4, 31, "after"), truncate=Position(30, 0), progress=Position(31, 0))
    assert current(lake) == {4: "after"}
    assert lake.rows(include_tombstones=True).num_rows == 1
    assert lake.floor == Position(30, 0) and lake.progress == Position(31, 0)
    merge(lake, row(5, 29, "before the truncate", "r"))  # a direct chunk read before it
    assert current(lake) == {4: "after"}


def test_a_kept_column_holds_the_stored_value(tmp_path: Path) -> None:
    lake = LakeTable.open_or_create(tmp_path, TABLE, SCHEMA)
    merge(lake, LakeRow({"id": 1, "name": "a", "big": "toasted"}, 10, 0, "c"))
    merge(lake, LakeRow({"id": 1, "name": "b"}, 11, 0, "u", keep=frozenset({"big"})))
    [stored] = lake.rows().to_pylist()
    assert (stored["name"], stored["big"]) == ("b", "toasted")


def test_a_writer_whose_commit_lost_the_race_runs_again(tmp_path: Path) -> None:
    """Two handles on one table (the compaction and a direct dump's driver): the second
    merges on a stale version, its commit conflicts, and it runs again on the new one."""
    first = LakeTable.open_or_create(tmp_path, TABLE, SCHEMA)
    second = LakeTable.open(tmp_path, TABLE)
    merge(first, tombstone(1, 20), row(2, 20, "log"))
    merge(second, row(1, 15, "dump", "r"), row(2, 15, "dump", "r"), row(3, 15, "dump", "r"))
    assert second.version == first.version + 1
    assert current(first) == {2: "log", 3: "dump"}
    assert first.rows(include_tombstones=True).num_rows == 3  # one row per key


def test_direct_commit_is_one_commit_per_chunk_and_a_retry_is_harmless(tmp_path: Path) -> None:
    hw = record(Position(40, 1), frozenset({(2,), (9,)}))
    handles = [
        stage_rows(tmp_path, TABLE, SCHEMA, [{"id": k, "name": f"n{k}"} for k in keys])
        for keys in ([1, 2], [3], [])
    ]
    assert commit_staged(tmp_path, TABLE, handles, SCHEMA, hw, KEY) == 2
    lake = LakeTable.open(tmp_path, TABLE)
    version = lake.version
    assert commit_staged(tmp_path, TABLE, handles, SCHEMA, hw, KEY) == 0  # committed, removed
    lake.refresh()
    assert lake.version == version and not list(staging_dir(tmp_path, TABLE).iterdir())
    assert current(lake) == {1: "n1", 3: "n3"}, "key 2 changed in the window: dropped"
    positions = {(r["_dblog_commit"], r["_dblog_seq"]) for r in lake.rows().to_pylist()}
    assert positions == {(40, 2)}, "positioned just after hw"


def test_the_changed_keys_are_dropped_whatever_the_key_types(tmp_path: Path) -> None:
    """The anti join on the driver matches keys typed as the rows are: a composite key of
    text, numeric and timestamptz values (JSON, as the converters give them), beside a list
    column (which Arrow's join cannot carry)."""
    table = TableRef("app", "events")
    schema = lake_schema(
        "postgres",
        table,
        TableSchema(
            (
                Column("tenant", "text", False, None),
                Column("amount", "numeric(12,2)", False, None),
                Column("at", "timestamp with time zone", False, None),
                Column("note", "text", True, None),
                Column("tags", "text[]", True, None),
            ),
            ("tenant", "amount", "at"),
        ),
    )
    stamps = ("2026-01-01T00:00:00+00:00", "2026-01-01T00:00:01.5+00:00")
    rows = [
        {"tenant": t, "amount": a, "at": at, "note": f"{t} {a} {at}", "tags": [t, None]}
        for t in ("a", "b")
        for a in ("1.50", "2.00")
        for at in stamps
    ]
    changed = frozenset({("a", "2.00", stamps[1]), ("b", "1.50", stamps[0])})
    key = ("tenant", "amount", "at")
    handle = stage_rows(tmp_path, table, schema, rows)
    at_hw = record(Position(7, 0), changed)
    assert commit_staged(tmp_path, table, [handle], schema, at_hw, key) == 6
    notes = {r["note"] for r in LakeTable.open(tmp_path, table).rows().to_pylist()}
    assert notes == {
        f"{t} {a} {at}" for t, a, at in {tuple(r[k] for k in key) for r in rows} - changed
    }


def test_duckdb_reads_the_files_the_delta_log_lists(tmp_path: Path) -> None:
    lake = LakeTable.open_or_create(tmp_path, TABLE, SCHEMA)
    merge(lake, row(1, 10, "a"), row(2, 10, "b"))
    merge(lake, row(1, 11, "a2", "u"), tombstone(2, 11), row(3, 11, "c"))
    lake.refresh()
    files = lake.delta.file_uris()
    found = duckdb.sql(
        "SELECT id, name FROM read_parquet($files) WHERE NOT _dblog_deleted ORDER BY id",
        params={"files": files},
    ).fetchall()
    assert found == [(1, "a2"), (3, "c")]


def test_the_lake_as_a_direct_dump_target(tmp_path: Path) -> None:
    """`LakeDirectTarget` is the dump's `DirectTarget`: parts staged where they were read,
    one commit per chunk (the table created with the source's schema), tombstones pruned."""
    target: DirectTarget = LakeDirectTarget(tmp_path, {TABLE: SCHEMA}.__getitem__)
    parts = [target.stage(TABLE, [{"id": k, "name": f"n{k}"}]) for k in (1, 2)]
    assert target.commit(TABLE, parts, record(Position(50, 1)), KEY) == 2
    dropped = [target.stage(TABLE, [{"id": 3, "name": "n3"}])]
    target.discard(TABLE, dropped)
    assert not Path(dropped[0]).exists()
    lake = LakeTable.open(tmp_path, TABLE)
    merge(lake, tombstone(2, 60))
    assert target.prune_tombstones(TABLE, Position(55, 0)) == 0
    assert target.prune_tombstones(TABLE, Position(61, 0)) == 1
    assert target.prune_tombstones(TableRef("app", "absent"), Position(61, 0)) == 0
    assert current(lake) == {1: "n1"}
    target.close()


def test_staged_files_no_driver_committed_are_removed_once_old(tmp_path: Path) -> None:
    fresh = stage_rows(tmp_path, TABLE, SCHEMA, [{"id": 1}])
    old = Path(stage_rows(tmp_path, TABLE, SCHEMA, [{"id": 2}]))
    os.utime(old, (old.stat().st_atime - 7200, old.stat().st_mtime - 7200))
    assert remove_stale_staged(tmp_path, older_than_s=3600) == 1
    assert Path(fresh).exists() and not old.exists()


def test_a_merge_on_a_key_range_leaves_the_keys_between_alone(tmp_path: Path) -> None:
    """A merge of text keys rewrites the range they fall in: the stored keys inside it that
    the batch lacks stay as they are, and a text key with a quote is spelled as a literal."""
    table = TableRef("app", "tags")
    schema = lake_schema(
        "postgres",
        table,
        TableSchema(
            (Column("tag", "text", False, None), Column("n", "integer", True, None)), ("tag",)
        ),
    )
    lake = LakeTable.open_or_create(tmp_path, table, schema)
    stored = ["a", "b'c", "d", "z"]
    lake.merge(schema.to_arrow([LakeRow({"tag": t, "n": 1}, 10, 0, "c") for t in stored]))
    lake.merge(schema.to_arrow([LakeRow({"tag": t, "n": 2}, 11, 0, "u") for t in ("a", "d")]))
    lake.merge(schema.to_arrow([LakeRow({"tag": "b'c", "n": 0}, 9, 0, "r")]))  # older: refused
    lake.refresh()
    found = {r["tag"]: r["n"] for r in lake.rows().to_pylist()}
    assert found == {"a": 2, "b'c": 1, "d": 2, "z": 1}
