"""The key index of a table keyed by text: the array stands for a file's keys exactly or is not
built, a binary search finds exactly the stored keys, and a table with deletion vectors written
through it (real Delta tables in a temp dir, read back by Polars and DuckDB) holds what a model
of the rule holds; a missing or mismatched index is rebuilt, a gone file's is vacuumed."""

from __future__ import annotations

import random
from pathlib import Path

import numpy
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_dblog.compaction.maintenance import MaintenanceOptions, maintain_table
from airflow_provider_dblog.core.schema import Column, TableSchema
from airflow_provider_dblog.lake import key_index
from airflow_provider_dblog.lake.schema import LakeRow, lake_schema
from airflow_provider_dblog.lake.table import LakeTable
from tests.unit.lake.test_deletion_vectors import TABLE, data_files, readers_see

pytestmark = pytest.mark.unit

SCHEMA = lake_schema(
    "postgres",
    TABLE,
    TableSchema((Column("id", "text", False, None), Column("name", "text", True, None)), ("id",)),
)


def test_an_index_finds_exactly_the_stored_keys() -> None:
    stored = ["", "a", "a\0b", "ab", "zz", "é"]  # code point order: UTF-8's byte order
    index = key_index.built(pa.array(stored))
    assert index is not None and len(index) == len(stored)
    probes = sorted(["a", "a\0", "ab", "abc", "b", "é", "zzz", ""])
    at = key_index.rows_of(index, probes)
    assert at.tolist() == [0, 1, 3, 5], "'a\\0' is not 'a', 'abc' is wider than every key"
    assert key_index.keys_at(index, at) == ["", "a", "ab", "é"]


@pytest.mark.parametrize(
    "keys",
    [["b", "a"], ["a", "a"], [None, "a"], ["a\0", "b"], ["a", "b", "c", "d", "e", "f" * 100]],
    ids=["unsorted", "a duplicate", "a null", "a trailing NUL", "padding past 4x"],
)
def test_no_index_where_the_array_would_not_stand_for_the_keys(keys: list[str | None]) -> None:
    assert key_index.built(pa.array(keys, pa.string())) is None


@settings(max_examples=200, deadline=None)
@given(
    st.sets(st.text(max_size=6), max_size=40),
    st.lists(st.text(max_size=7), max_size=20),
)
def test_a_search_finds_what_a_lookup_finds(stored: set[str], probes: list[str]) -> None:
    keys = sorted(stored)
    index = key_index.built(pa.array(keys, pa.string()))
    if index is None:  # a key with a trailing NUL, or too uneven: the Parquet column is probed
        assert any(k.endswith("\0") for k in keys) or len(keys) > 1
        return
    wanted = sorted(set(probes) | set(random.Random(len(keys)).sample(keys, min(3, len(keys)))))
    at = key_index.rows_of(index, wanted)
    assert at.tolist() == [keys.index(k) for k in wanted if k in stored]
    assert key_index.keys_at(index, at) == [k for k in wanted if k in stored]


def key(n: int) -> str:
    return f"k{n:05d}"


def text_keyed(root: Path) -> LakeTable:
    """Four commits of 1000 keys, in four files of a range each, with deletion vectors on
    first: every file is written here, and indexed as it is."""
    table = LakeTable.open_or_create(root, TABLE, SCHEMA)
    assert table.enable_deletion_vectors()
    for chunk in range(4):
        rows = [
            LakeRow({"id": key(k), "name": f"n{k}"}, 100 + chunk, 0, "r")
            for k in range(chunk * 1000, chunk * 1000 + 1000)
        ]
        table.merge(SCHEMA.to_arrow(rows))
    return LakeTable.open(root, TABLE)


def indexes(lake: LakeTable) -> set[str]:
    return {p.name for p in (Path(lake.directory) / key_index.DIRECTORY).glob("*.npy")}


def test_a_text_keyed_table_with_deletion_vectors_writes_through_its_key_index(
    tmp_path: Path,
) -> None:
    lake = text_keyed(tmp_path)
    model = {key(k): f"n{k}" for k in range(4000)}
    assert indexes(lake) == {f"{p}.npy" for p in data_files(lake)}, "each file indexed"
    rng = random.Random(7)
    for commit in range(500, 506):
        rows = []
        for number in rng.sample(range(4200), 300):  # updates, deletes and new keys
            if rng.random() < 0.3:
                rows.append(LakeRow({"id": key(number)}, commit, number, "d", deleted=True))
                model.pop(key(number), None)
            else:
                rows.append(LakeRow({"id": key(number), "name": f"c{commit}"}, commit, number, "u"))
                model[key(number)] = f"c{commit}"
        stale = [LakeRow({"id": key(1), "name": "stale"}, 50, 0, "u")]  # loses to the stored
        lake.merge(SCHEMA.to_arrow(rows + stale))
        if commit == 502:  # a lost index is rebuilt by the next write that reads its file
            lost = sorted(indexes(lake))[0]
            (Path(lake.directory) / key_index.DIRECTORY / lost).unlink()
        if commit == 503:
            assert lost in indexes(lake)
        assert readers_see(lake) == model
    assert indexes(lake) == {f"{p}.npy" for p in data_files(lake)}


def test_an_index_of_another_length_is_not_used_and_is_rebuilt(tmp_path: Path) -> None:
    lake = text_keyed(tmp_path)
    wrong = numpy.array([key(k).encode() for k in range(1, 1001, 2)], dtype="S6")
    for path in data_files(lake):
        key_index.save(lake.directory, path, wrong)
        assert key_index.load(lake.directory, path, 1000) is None
    lake.merge(SCHEMA.to_arrow([LakeRow({"id": key(3), "name": "three"}, 500, 0, "u")]))
    seen = readers_see(lake)
    assert seen[key(3)] == "three" and len(seen) == 4000
    columns = {
        p: pq.read_table(Path(lake.directory) / p)["id"].to_pylist() for p in data_files(lake)
    }
    [holder] = [p for p, keys in columns.items() if key(3) in keys and len(keys) == 1000]
    rebuilt = key_index.load(lake.directory, holder, 1000)
    assert rebuilt is not None and key_index.keys_at(rebuilt, numpy.arange(1000)) == columns[holder]
    unread = [
        p for p, keys in columns.items() if key_index.load(lake.directory, p, len(keys)) is None
    ]
    assert len(unread) == 3, "the ranges the write did not read keep the wrong index, unused"


def test_the_vacuum_removes_the_indexes_of_files_gone_and_keeps_the_others(
    tmp_path: Path,
) -> None:
    lake = text_keyed(tmp_path)
    lake.merge(
        SCHEMA.to_arrow([LakeRow({"id": key(k), "name": "x"}, 500, 0, "u") for k in (1, 2001)])
    )
    before = indexes(lake)
    assert len(before) == 5
    partial = Path(lake.directory) / key_index.DIRECTORY / ".dead.npy.0a1b"
    partial.write_bytes(b"")  # a writer that died: older than the retention of 0 h
    report = maintain_table(
        tmp_path, TABLE, MaintenanceOptions(retention_hours=0, min_retention_hours=0)
    )
    assert report.compacted == 5
    lake = LakeTable.open(tmp_path, TABLE)
    kept = indexes(lake)
    assert kept == {f"{p}.npy" for p in data_files(lake)} and not kept & before
    gone = {f"{key_index.DIRECTORY}/{name}" for name in [*before, partial.name]}
    assert gone <= set(report.vacuumed or ())
    assert not partial.exists()
    assert len(readers_see(lake)) == 4000
