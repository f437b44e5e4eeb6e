"""The key index of a table keyed by one integer or text column: the array stands for a file's
keys exactly or is not built, a binary search finds exactly the stored keys, and a table with
deletion vectors written through it (real Delta tables in a temp dir, read back by Polars and
DuckDB) holds what a model of the rule holds; a missing or mismatched index is rebuilt, a gone
file's is vacuumed."""

from __future__ import annotations

import random
from collections.abc import Callable
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
from airflow_provider_dblog.lake.clustered import Key, key_array
from airflow_provider_dblog.lake.schema import LakeRow, LakeSchema, lake_schema
from airflow_provider_dblog.lake.table import LakeTable
from tests.unit.lake.test_deletion_vectors import TABLE, data_files, readers_see

pytestmark = pytest.mark.unit


def schema(kind: str) -> LakeSchema:
    columns = (Column("id", kind, False, None), Column("name", "text", True, None))
    return lake_schema("postgres", TABLE, TableSchema(columns, ("id",)))


KEYS: dict[str, Callable[[int], Key]] = {"text": lambda n: f"k{n:05d}", "bigint": lambda n: n}
"""How key number n is spelled, by the key column's type."""


def test_an_index_finds_exactly_the_stored_keys() -> None:
    stored = ["", "a", "a\0b", "ab", "zz", "é"]  # code point order: UTF-8's byte order
    index = key_index.built(pa.array(stored))
    assert index is not None and len(index) == len(stored)
    probes = sorted(["a", "a\0", "ab", "abc", "b", "é", "zzz", ""])
    at = key_index.rows_of(index, numpy.array(probes, dtype=object))
    assert at.tolist() == [0, 1, 3, 5], "'a\\0' is not 'a', 'abc' is wider than every key"
    assert key_index.keys_at(index, at, pa.string()).to_pylist() == ["", "a", "ab", "é"]


def test_an_integer_index_finds_exactly_the_stored_keys() -> None:
    index = key_index.built(pa.array([-5, 0, 7, 2**40], pa.int64()))
    assert index is not None and index.dtype == numpy.int64
    at = key_index.rows_of(index, numpy.array([-6, -5, 7, 8, 2**40, 2**41]))
    assert at.tolist() == [0, 2, 3]
    assert key_index.keys_at(index, at, pa.int64()).to_pylist() == [-5, 7, 2**40]
    high = key_index.built(pa.array([2**63, 2**63 + 5], pa.uint64()))  # BIGINT UNSIGNED
    assert high is not None
    at = key_index.rows_of(high, key_array([2**63 + 5]))
    assert key_index.keys_at(high, at, pa.uint64()).to_pylist() == [2**63 + 5]
    narrow = key_index.built(pa.array([1, 2, 3], pa.int32()))
    assert narrow is not None and narrow.dtype == numpy.int64
    assert key_index.keys_at(narrow, numpy.array([2]), pa.int32()) == pa.array([3], pa.int32())


@pytest.mark.parametrize(
    "keys",
    [["b", "a"], ["a", "a"], [None, "a"], ["a\0", "b"], ["a", "b", "c", "d", "e", "f" * 100]],
    ids=["unsorted", "a duplicate", "a null", "a trailing NUL", "padding past 4x"],
)
def test_no_index_where_the_array_would_not_stand_for_the_keys(keys: list[str | None]) -> None:
    assert key_index.built(pa.array(keys, pa.string())) is None


@pytest.mark.parametrize(
    "keys", [pa.array([2, 1]), pa.array([1, 1]), pa.array([None, 1], pa.int64()), pa.array([0.5])]
)
def test_no_index_of_integers_out_of_order_or_null_or_of_another_type(keys: pa.Array) -> None:
    assert key_index.built(keys) is None


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
    at = key_index.rows_of(index, numpy.array(wanted, dtype=object))
    assert at.tolist() == [keys.index(k) for k in wanted if k in stored]
    found = key_index.keys_at(index, at, pa.string()).to_pylist()
    assert found == [k for k in wanted if k in stored]


def keyed(root: Path, kind: str = "text") -> LakeTable:
    """Four commits of 1000 keys, in four files of a range each, with deletion vectors on
    first: every file is written here, and indexed as it is."""
    table = LakeTable.open_or_create(root, TABLE, schema(kind))
    assert table.enable_deletion_vectors()
    key = KEYS[kind]
    for chunk in range(4):
        rows = [
            LakeRow({"id": key(k), "name": f"n{k}"}, 100 + chunk, 0, "r")
            for k in range(chunk * 1000, chunk * 1000 + 1000)
        ]
        table.merge(schema(kind).to_arrow(rows))
    return LakeTable.open(root, TABLE)


def indexes(lake: LakeTable) -> set[str]:
    """The data files that have an index."""
    found = (Path(lake.directory) / key_index.DIRECTORY).glob("*" + key_index.SUFFIX)
    return {p.name.removesuffix(key_index.SUFFIX) for p in found}


@pytest.mark.parametrize("kind", sorted(KEYS))
def test_a_table_with_deletion_vectors_writes_through_its_key_index(
    tmp_path: Path, kind: str
) -> None:
    lake, key, arrow = keyed(tmp_path, kind), KEYS[kind], schema(kind).to_arrow
    model = {key(k): f"n{k}" for k in range(4000)}
    assert indexes(lake) == data_files(lake), "each file indexed"
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
        lake.merge(arrow(rows + stale))
        if commit == 502:  # a lost index is rebuilt by the next write that reads its file
            lost = sorted(indexes(lake))[0]
            key_index.path(lake.directory, lost).unlink()
        if commit == 503:
            assert lost in indexes(lake)
        assert readers_see(lake) == model
    assert indexes(lake) == data_files(lake)


@pytest.mark.parametrize("kind", sorted(KEYS))
def test_an_index_of_another_length_is_not_used_and_is_rebuilt(tmp_path: Path, kind: str) -> None:
    lake, key = keyed(tmp_path, kind), KEYS[kind]
    wrong = key_index.built(pa.array([key(k) for k in range(1, 1001, 2)]))
    assert wrong is not None
    for path in data_files(lake):
        key_index.save(lake.directory, path, wrong)
        assert key_index.load(lake.directory, path, 1000) is None
    index = key_index.path(lake.directory, min(data_files(lake)))
    for garbage in (b"", b"<f8".ljust(key_index.HEADER) + bytes(8000), b"\xff" * 40):
        index.write_bytes(garbage)  # empty, floats, not a type: no index
        assert key_index.load(lake.directory, min(data_files(lake)), None) is None
    lake.merge(schema(kind).to_arrow([LakeRow({"id": key(3), "name": "three"}, 500, 0, "u")]))
    seen = readers_see(lake)
    assert seen[key(3)] == "three" and len(seen) == 4000
    columns = {p: pq.read_table(Path(lake.directory) / p)["id"] for p in data_files(lake)}
    [holder] = [
        p for p, keys in columns.items() if key(3) in keys.to_pylist() and len(keys) == 1000
    ]
    rebuilt = key_index.load(lake.directory, holder, 1000)
    assert rebuilt is not None
    assert key_index.keys_at(rebuilt, numpy.arange(1000), columns[holder].type).to_pylist() == (
        columns[holder].to_pylist()
    )
    unread = [
        p for p, keys in columns.items() if key_index.load(lake.directory, p, len(keys)) is None
    ]
    assert len(unread) == 3, "the ranges the write did not read keep the wrong index, unused"


def test_the_vacuum_removes_the_indexes_of_files_gone_and_keeps_the_others(
    tmp_path: Path,
) -> None:
    lake, key = keyed(tmp_path), KEYS["text"]
    rows = [LakeRow({"id": key(k), "name": "x"}, 500, 0, "u") for k in (1, 2001)]
    lake.merge(schema("text").to_arrow(rows))
    before = indexes(lake)
    assert len(before) == 5
    partial = Path(lake.directory) / key_index.DIRECTORY / ".dead.keys.0a1b"
    partial.write_bytes(b"")  # a writer that died: older than the retention of 0 h
    report = maintain_table(
        tmp_path, TABLE, MaintenanceOptions(retention_hours=0, min_retention_hours=0)
    )
    assert report.compacted == 5
    lake = LakeTable.open(tmp_path, TABLE)
    kept = indexes(lake)
    assert kept == data_files(lake) and not kept & before
    named = [f"{name}{key_index.SUFFIX}" for name in before]
    gone = {f"{key_index.DIRECTORY}/{name}" for name in [*named, partial.name]}
    assert gone <= set(report.vacuumed or ())
    assert not partial.exists()
    assert len(readers_see(lake)) == 4000
