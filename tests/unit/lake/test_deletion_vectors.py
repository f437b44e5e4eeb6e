"""Deletion vectors on real Delta tables in a temp dir (delta-rs, Polars, DuckDB; no server):
the vectors written here are the ones delta-rs and Polars read, a write into a table with
them enabled marks rows instead of rewriting files, an optimize folds the marks away, and the
maintenance keeps every vector file a version within the retention needs."""

from __future__ import annotations

import json
import os
import shutil
import struct
import time
import warnings
from pathlib import Path
from typing import Any

import duckdb
import numpy
import polars
import pyarrow as pa
import pytest
from deltalake import CommitProperties, DeltaTable, TableFeatures, write_deltalake

from airflow_provider_dblog.compaction.maintenance import MaintenanceOptions, maintain_table
from airflow_provider_dblog.compaction.run import CompactOptions, compact
from airflow_provider_dblog.core.event import Op, Origin, PlainEvent, SourceInfo, TableRef
from airflow_provider_dblog.core.position import Position
from airflow_provider_dblog.core.schema import Column, TableSchema
from airflow_provider_dblog.lake import delta_log
from airflow_provider_dblog.lake import marking as marking_module
from airflow_provider_dblog.lake import table as table_module
from airflow_provider_dblog.lake.deletion_vectors import (
    VectorFile,
    deserialized,
    serialized,
    stored_rows,
    z85,
    z85_decoded,
)
from airflow_provider_dblog.lake.schema import LakeRow, lake_schema
from airflow_provider_dblog.lake.table import UNMERGED_TAG, LakeTable
from airflow_provider_dblog.outputs.ndjson import NdjsonOutput
from tests.unit.lake.test_clustered import four_ranges

pytestmark = pytest.mark.unit

TABLE = TableRef("app", "users")
SCHEMA_COLUMNS = (Column("id", "bigint", False, None), Column("name", "text", True, None))
SCHEMA = lake_schema("postgres", TABLE, TableSchema(SCHEMA_COLUMNS, ("id",)))


def test_z85_spells_the_specifications_example_and_back() -> None:
    data = bytes([0x86, 0x4F, 0xD2, 0x6F, 0xB5, 0x59, 0xF7, 0x5B])
    assert z85(data) == "HelloWorld"
    assert z85_decoded("HelloWorld") == data


@pytest.mark.parametrize(
    "deleted",
    [
        [0],
        [5, 65535, 65536, 69999],  # two containers, the last row of the file
        [*range(1000, 6000), 66000],  # a bitset container, then an array
    ],
    ids=["one row", "two containers", "a bitset"],
)
def test_a_vector_written_here_is_the_one_delta_rs_and_polars_read(
    tmp_path: Path, deleted: list[int]
) -> None:
    rows = 70_000
    write_deltalake(tmp_path, pa.table({"id": pa.array(numpy.arange(rows))}))
    table = DeltaTable(tmp_path)
    table.alter.add_feature([TableFeatures.DeletionVectors], allow_protocol_versions_increase=True)
    version = table.version()
    [(path, add)] = delta_log.active_adds(tmp_path, version).items()
    vectors = VectorFile()
    descriptor = vectors.add(deleted)
    (tmp_path / vectors.name).write_bytes(vectors.data)
    remove = {"path": path, "deletionTimestamp": 1, "dataChange": True, "size": add["size"]}
    marked = {"add": {**add, "deletionVector": descriptor}}
    delta_log.commit(tmp_path, version + 1, [{"remove": remove}, marked])
    with pytest.raises(delta_log.LostCommit):
        delta_log.commit(tmp_path, version + 1, [{"remove": remove}, marked])
    table.update_incremental()
    assert stored_rows(tmp_path, descriptor).tolist() == deleted
    [keep] = pa.table(table.deletion_vectors())["selection_vector"].to_pylist()
    assert [i for i, kept in enumerate(keep) if not kept] == deleted
    expected = sorted(set(range(rows)) - set(deleted))
    assert sorted(polars.read_delta(str(tmp_path))["id"].to_list()) == expected
    assert delta_log.vectors_in_use(tmp_path, version + 1, 0) == {vectors.name}


def test_a_vector_with_run_containers_and_one_stored_inline_read_back() -> None:
    """What Spark writes after its run optimization: run containers (cookie 12347, the
    count in its high half, a bit per container saying it holds runs), here rows 3-6 and
    70000-70001 of one 32-bit bitmap; and a vector stored inline, in Z85."""
    runs = struct.pack("<IB", 12347 | (2 - 1) << 16, 0b11)  # two containers, both runs
    runs += struct.pack("<HHHH", 0, 3, 1, 1)  # key 0: 4 rows; key 1: 2 rows
    runs += struct.pack("<HHH", 1, 3, 3) + struct.pack("<HHH", 1, 70000 - 65536, 1)
    data = struct.pack("<iqI", 1681511377, 1, 0) + runs
    assert deserialized(data).tolist() == [3, 4, 5, 6, 70000, 70001]
    last = struct.pack("<IBHH", 12347, 1, 0, 1) + struct.pack("<HHH", 1, 65534, 1)
    with warnings.catch_warnings():  # a run to 65535 summed in uint16 overflows
        warnings.simplefilter("error")
        found = deserialized(struct.pack("<iqI", 1681511377, 1, 0) + last)
    assert found.tolist() == [65534, 65535]
    inline = serialized(numpy.array([7, 9, 100_000]))
    padded = inline + b"\0" * (-len(inline) % 4)
    descriptor = {"storageType": "i", "pathOrInlineDv": z85(padded), "sizeInBytes": len(inline)}
    assert stored_rows("/nowhere", descriptor).tolist() == [7, 9, 100_000]


def readers_see(lake: LakeTable) -> dict[int, Any]:
    """The current rows (id to name) as Polars and DuckDB (over delta-rs's engine: a read of
    the Parquet files alone would see the rows the vectors delete) read them."""
    lake.refresh()
    frame = polars.read_delta(lake.directory).filter(~polars.col("_dblog_deleted"))
    by_polars = dict(zip(frame["id"].to_list(), frame["name"].to_list(), strict=True))
    scan = lake.delta.scan(columns=["id", "name", "_dblog_deleted"])  # noqa: F841 (DuckDB's)
    query = "SELECT id, name FROM scan WHERE NOT _dblog_deleted"
    by_duckdb = dict(duckdb.execute(query).fetchall())
    assert by_polars == by_duckdb == {r["id"]: r["name"] for r in lake.rows().to_pylist()}
    return by_polars


def filled(root: Path) -> LakeTable:
    """Four direct chunks of 1000 keys (four files, a range each), then vectors turned on."""
    lake = four_ranges(root, SCHEMA)
    assert lake.enable_deletion_vectors() and not lake.enable_deletion_vectors()
    assert lake.deletion_vectors
    return lake


def data_files(lake: LakeTable) -> set[str]:
    lake.refresh()
    return set(pa.table(lake.delta.get_add_actions(flatten=True))["path"].to_pylist())


def test_a_write_of_keys_over_every_file_marks_rows_and_rewrites_none(tmp_path: Path) -> None:
    lake = filled(tmp_path)
    before = data_files(lake)
    rows = [
        LakeRow({"id": 5, "name": "five"}, 500, 1, "u"),
        LakeRow({"id": 1500, "name": "stale"}, 50, 1, "u"),  # older than the stored row
        LakeRow({"id": 2500}, 500, 2, "d", deleted=True),
        LakeRow({"id": 3999, "name": "last"}, 500, 3, "u"),
        LakeRow({"id": 7000, "name": "new"}, 500, 4, "c"),
    ]
    written = lake.merge(SCHEMA.to_arrow(rows), progress=Position(500, 4))
    assert (written.inserted, written.updated) == (1, 3)
    after = data_files(lake)
    assert before < after and len(after - before) == 1, "every file kept, one added"
    marked = pa.table(lake.delta.deletion_vectors())
    assert sum(keep.count(False) for keep in marked["selection_vector"].to_pylist()) == 3
    assert lake.progress == Position(500, 4)
    seen = readers_see(lake)
    assert len(seen) == 4000 and 2500 not in seen
    assert (seen[5], seen[1500], seen[3999], seen[7000]) == ("five", "n1500", "last", "new")

    lake.merge(SCHEMA.to_arrow([LakeRow({"id": 5, "name": "again"}, 600, 0, "u")]))
    assert readers_see(lake)[5] == "again", "a marked file's vector grows"
    assert len(data_files(lake)) == len(after) + 1


def test_an_optimize_that_loses_to_a_marking_write_runs_again_and_loses_no_row(
    tmp_path: Path,
) -> None:
    """An optimize planned on the version before a write that marked rows in the files it
    merges loses its commit and merges them again on the new version, marks applied (the
    write's own file was not planned: it stays); a marking write planned on a stale version
    loses its commit and runs again too."""
    lake = filled(tmp_path)
    stale = LakeTable.open(tmp_path, TABLE)
    lake.merge(SCHEMA.to_arrow([LakeRow({"id": 5, "name": "marked"}, 500, 0, "u")]))
    assert stale.optimize(CommitProperties()) == (4, 1)
    seen = readers_see(lake)
    assert len(seen) == 4000 and seen[5] == "marked"
    stale = LakeTable.open(tmp_path, TABLE, lake.version - 1)
    stale.merge(SCHEMA.to_arrow([LakeRow({"id": 6, "name": "late"}, 501, 0, "u")]))
    seen = readers_see(LakeTable.open(tmp_path, TABLE))
    assert len(seen) == 4000 and (seen[5], seen[6]) == ("marked", "late")


def test_delta_rs_updates_deletes_and_truncates_keep_the_marks(tmp_path: Path) -> None:
    """The writes that stay delta-rs's (a column's default filled in, tombstones pruned, a
    truncate's merge) on a table with marked rows: no marked row comes back."""
    lake = filled(tmp_path)
    lake.merge(
        SCHEMA.to_arrow(
            [
                LakeRow({"id": 5, "name": "five"}, 500, 0, "u"),
                LakeRow({"id": 6}, 500, 1, "d", deleted=True),
            ]
        )
    )
    wider = lake_schema(
        "postgres",
        TABLE,
        TableSchema((*SCHEMA_COLUMNS, Column("tier", "text", True, None)), ("id",)),
    )
    lake.add_columns(wider.columns)
    tier = wider.column("tier")
    assert tier is not None
    lake.fill(tier, "basic", Position(400, 0))
    assert lake.prune_tombstones(Position(600, 0)) == 1
    rows = {r["id"]: (r["name"], r["tier"]) for r in lake.rows().to_pylist()}
    assert len(rows) == 3999 and 6 not in rows
    assert rows[5] == ("five", None) and rows[7] == ("n7", "basic")
    assert len(readers_see(lake)) == 3999
    lake.merge(
        SCHEMA.to_arrow([LakeRow({"id": 1, "name": "after"}, 700, 0, "c")]),
        truncate=Position(650, 0),
    )
    assert readers_see(lake) == {1: "after"}


def test_an_optimize_merges_the_writes_files_and_leaves_the_ranges_they_overlap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two writes of keys in every range add two files spanning them all; with a target
    under twice a range's size, an optimize merges those two into one, in a commit that
    changes no data, and rewrites no range (re-clustering would take them all)."""
    lake = filled(tmp_path)
    ranges = data_files(lake)
    size = min(pa.table(lake.delta.get_add_actions(flatten=True))["size_bytes"].to_pylist())
    for module in (table_module, marking_module):  # the files grouped, and the file written
        monkeypatch.setattr(module, "FILE_BYTES", size * 3 // 2)
    for commit in (500, 501):
        rows = [LakeRow({"id": k + commit, "name": str(commit)}, commit, 0, "u") for k in KEYS]
        lake.merge(SCHEMA.to_arrow(rows))
    expected = readers_see(lake)
    assert len(data_files(lake)) == 6
    assert lake.optimize(CommitProperties()) == (2, 1)
    after = data_files(lake)
    assert ranges < after and len(after) == 5, "the ranges stay, marked; one merged file"
    assert readers_see(lake) == expected
    log = Path(lake.directory) / "_delta_log" / f"{lake.version:020d}.json"
    actions = [json.loads(line) for line in log.read_text().splitlines()]
    changes = [a.get("add") or a.get("remove") for a in actions if "add" in a or "remove" in a]
    assert len(changes) == 3 and not any(c["dataChange"] for c in changes)
    assert next(a["commitInfo"]["operation"] for a in actions if "commitInfo" in a) == "OPTIMIZE"


def test_a_compaction_run_merges_the_files_writes_added_once_enough_gathered(
    tmp_path: Path,
) -> None:
    """Each write adds a file tagged unmerged, its keys spread over every range; a run's
    upkeep (`merge_files_at` 3) leaves two alone, then merges the three, and them alone (the
    ranges stay, small as they are), into an untagged file; the rows read the same."""
    root, events = tmp_path / "lake", tmp_path / "events"
    lake = filled(root)
    ranges = data_files(lake)

    def source(commit: int, seq: int) -> SourceInfo:
        return SourceInfo("src", "db", "app", "users", Position(commit, seq), Origin.LOG)

    merged = []
    for commit in (500, 501, 502):
        changes = [
            PlainEvent(
                Op.UPDATE, {"id": k}, None, {"id": k, "name": str(commit)}, source(commit, seq), 1
            )
            for seq, k in enumerate(key + commit for key in KEYS)
        ]
        with NdjsonOutput(events) as out:
            out.write(changes, 1)
        options = CompactOptions(describe=lambda table: SCHEMA, merge_files_at=3)
        merged.append(compact(None, events, root, options).tables[str(TABLE)].merged)
    assert merged == [0, 0, 3]
    after = data_files(lake)
    assert ranges < after and len(after) == 5, "the ranges, marked, and one merged file"
    assert unmerged(lake) == 0
    seen = readers_see(lake)
    assert len(seen) == 4000 and [seen[k + 502] for k in KEYS] == ["502"] * 4
    assert seen[500] == "500" and seen[1501] == "501"


def test_a_write_tags_its_file_unmerged_only_over_another_files_range(tmp_path: Path) -> None:
    """New keys past every range (a direct chunk of new rows) make a range of their own; a
    key inside a range makes a file a later write must read too: that one is tagged."""
    lake = filled(tmp_path)
    new = [LakeRow({"id": 9000 + k, "name": "new"}, 500, k, "c") for k in range(3)]
    lake.merge(SCHEMA.to_arrow(new))
    assert unmerged(lake) == 0
    lake.merge(SCHEMA.to_arrow([LakeRow({"id": 5, "name": "five"}, 501, 0, "u")]))
    assert unmerged(lake) == 1


def unmerged(lake: LakeTable) -> int:
    adds = delta_log.active_adds(lake.directory, lake.version).values()
    return sum(1 for a in adds if (a.get("tags") or {}).get(UNMERGED_TAG))


def test_a_replay_after_an_earlier_one_reads_the_log_of_the_table_there_now(
    tmp_path: Path,
) -> None:
    """The add actions replayed from the version replayed before are the log's; a table
    removed and made again at the same path, up to the same version, is replayed afresh."""

    def replay_matches(lake: LakeTable) -> dict[str, Any]:
        adds = delta_log.active_adds(lake.directory, lake.version)
        assert set(adds) == data_files(lake)
        return adds

    lake = filled(tmp_path)
    replay_matches(lake)
    for commit in (500, 501):  # keys 0 and 1, both in the first range's file
        lake.merge(SCHEMA.to_arrow([LakeRow({"id": commit - 500}, commit, 0, "u")]))
    marked = [a for a in replay_matches(lake).values() if a.get("deletionVector")]
    assert [a["deletionVector"]["cardinality"] for a in marked] == [2]
    version = lake.version
    shutil.rmtree(lake.directory)
    lake = four_ranges(tmp_path, SCHEMA)  # without vectors: its writes replay nothing here
    while lake.version < version:
        lake.merge(SCHEMA.to_arrow([LakeRow({"id": 7000 + lake.version}, 600, 0, "c")]))
    assert lake.version == version
    assert not any(a.get("deletionVector") for a in replay_matches(lake).values())


KEYS = (0, 1000, 2000, 3000)
"""A key in each of `filled`'s ranges."""


def test_a_commit_written_here_checkpoints_at_the_interval_and_reads_back(
    tmp_path: Path,
) -> None:
    lake = filled(tmp_path)
    lake.delta.alter.set_table_properties({"delta.checkpointInterval": "2"})
    lake.refresh()
    assert lake.deletion_vectors
    for commit in range(500, 504):  # the first two checkpoint; the next read one
        lake.merge(SCHEMA.to_arrow([LakeRow({"id": 5, "name": str(commit)}, commit, 0, "u")]))
    log = Path(lake.directory) / "_delta_log"
    written = [
        v for v in range(lake.version + 1) if (log / f"{v:020d}.checkpoint.parquet").exists()
    ]
    assert len(written) >= 2 and all(v % 2 == 0 for v in written)
    seen = readers_see(LakeTable.open(tmp_path, TABLE))
    assert len(seen) == 4000 and seen[5] == "503"


def test_an_optimize_folds_the_marks_into_ranges_and_the_vacuum_keeps_vectors_in_use(
    tmp_path: Path,
) -> None:
    lake = filled(tmp_path)
    lake.merge(SCHEMA.to_arrow([LakeRow({"id": k, "name": "x"}, 500, 0, "u") for k in (1, 2001)]))
    expected = readers_see(lake)
    old_vectors = {p.name for p in tmp_path.joinpath(str(TABLE)).glob("deletion_vector_*")}
    assert len(old_vectors) == 1
    dry = maintain_table(
        tmp_path, TABLE, MaintenanceOptions(retention_hours=0, dry_run=True, min_retention_hours=0)
    )
    assert dry.vacuumed == [], "the vector in use is no file to remove"

    # a vector file no version refers to, older than the retention: a write that died
    orphan = Path(lake.directory) / VectorFile().name
    orphan.write_bytes(b"\x01")
    os.utime(orphan, (time.time() - 7200, time.time() - 7200))
    report = maintain_table(  # optimize, vacuum, checkpoint
        tmp_path, TABLE, MaintenanceOptions(retention_hours=1, min_retention_hours=0)
    )
    assert report.compacted == 5, "four ranges and the file the write added, one range now"
    assert report.vacuumed == [orphan.name]
    lake = LakeTable.open(tmp_path, TABLE)
    assert pa.table(lake.delta.deletion_vectors()).num_rows == 0, "no file keeps a mark"
    assert readers_see(lake) == expected
    report = maintain_table(
        tmp_path, TABLE, MaintenanceOptions(retention_hours=0, min_retention_hours=0)
    )
    assert set(report.vacuumed or ()) >= old_vectors, "the old vector went with its files"
    assert readers_see(LakeTable.open(tmp_path, TABLE)) == expected
