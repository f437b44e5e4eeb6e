"""The lake as a verified target reads exactly a chunk's rows: a key range of a composite text
and integer key (multibyte text among them), a key list, and a table a commit changed between
two chunks, against the rows picked in Python (real Delta tables in a temp dir)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from airflow_provider_dblog.core.dump_plan import Chunk
from airflow_provider_dblog.core.errors import InvalidRequest
from airflow_provider_dblog.core.event import Key, Row, TableRef
from airflow_provider_dblog.core.schema import Column, TableSchema
from airflow_provider_dblog.lake.schema import LakeRow, lake_schema
from airflow_provider_dblog.lake.table import LakeTable, give_new_tables_deletion_vectors
from airflow_provider_dblog.lake.target_rows import LakeRows

pytestmark = pytest.mark.unit

TABLE = TableRef("app", "orders")
KEY = ("region", "id")
SCHEMA = lake_schema(
    "postgres",
    TABLE,
    TableSchema(
        (
            Column("region", "text", False, None),
            Column("id", "bigint", False, None),
            Column("note", "text", True, None),
        ),
        KEY,
    ),
)
REGIONS = ("ap", "eu", "eé", "e€", "us", "z")


def source_rows() -> list[Row]:
    return [
        {"region": region, "id": i, "note": f"{region}-{i}"} for region in REGIONS for i in range(5)
    ]


def write(root: Path, rows: list[Row], commit: int) -> None:
    lake = LakeTable.open_or_create(root, TABLE, SCHEMA)
    lake.merge(SCHEMA.to_arrow([LakeRow(r, commit, n, "c") for n, r in enumerate(rows)]))


def expected(reader: LakeRows, rows: list[Row], chunk: Chunk) -> dict[Key, str]:
    def inside(key: Key) -> bool:
        if chunk.keys is not None:
            return key in chunk.keys
        above = chunk.after is None or key > chunk.after  # type: ignore[operator]
        return above and (chunk.upto is None or key <= chunk.upto)  # type: ignore[operator]

    picked = [r for r in rows if inside((r["region"], r["id"]))]
    return reader.hash_rows(TABLE, KEY, picked)


@pytest.mark.parametrize(
    "chunk",
    [
        Chunk(TABLE, 1, after=("eu", 2), upto=("e€", 1)),
        Chunk(TABLE, 2, after=("eé", 4), upto=("us", 0)),
        Chunk(TABLE, 3, upto=("ap", 3)),
        Chunk(TABLE, 4, after=("us", 4)),
        Chunk(TABLE, 5, keys=(("eé", 0), ("z", 4), ("eu", 9))),
    ],
)
def test_a_chunk_reads_exactly_its_rows(tmp_path: Path, chunk: Chunk) -> None:
    rows = source_rows()
    write(tmp_path, rows, 10)
    reader = LakeRows(tmp_path, dict)
    reader.check_table(TABLE, KEY)
    found = reader.read_hashes(chunk)
    assert found == expected(reader, rows, chunk)
    assert found


def test_a_commit_between_two_chunks_is_read(tmp_path: Path) -> None:
    rows = source_rows()
    write(tmp_path, rows, 10)
    reader = LakeRows(tmp_path, dict)
    chunk = Chunk(TABLE, 1, after=("ap", 4), upto=("eu", 4))
    before = reader.read_hashes(chunk)
    changed = {"region": "eu", "id": 2, "note": "changed"}
    write(tmp_path, [changed], 11)
    after = reader.read_hashes(chunk)
    assert after[("eu", 2)] != before[("eu", 2)]
    assert after == expected(
        reader, [changed if r["id"] == 2 and r["region"] == "eu" else r for r in rows], chunk
    )


@pytest.mark.parametrize(
    ("where", "refusal"),
    [
        ("nope = 1", "No field named nope"),
        ("only_here(id)", "Invalid function 'only_here'"),
        ("id > 'abc'", "Cannot cast string 'abc'"),
    ],
)
def test_a_filter_the_lake_cannot_run_is_refused_in_one_line(
    tmp_path: Path, where: str, refusal: str
) -> None:
    write(tmp_path, source_rows(), 10)
    reader = LakeRows(tmp_path, dict)
    with pytest.raises(InvalidRequest) as refused:
        reader.check_filter(TABLE, where)
    message = str(refused.value)
    assert message.startswith("the lake cannot run the filter on app.orders: ")
    assert refusal in message and "\n" not in message


def test_a_filter_the_lake_can_run_passes_its_check_and_narrows_the_chunk(tmp_path: Path) -> None:
    rows = source_rows()
    write(tmp_path, rows, 10)
    reader = LakeRows(tmp_path, dict)
    reader.check_filter(TABLE, "id >= 3 AND region <> 'z'")
    found = reader.read_hashes(Chunk(TABLE, 1, where="id >= 3 AND region <> 'z'"))
    picked = [r for r in rows if r["id"] >= 3 and r["region"] != "z"]
    assert found == reader.hash_rows(TABLE, KEY, picked)


def test_a_lake_table_keyed_by_a_timestamp_is_refused(tmp_path: Path) -> None:
    table = TableRef("app", "events")
    described = TableSchema(
        (Column("at", "timestamp with time zone", False, None), Column("n", "text", True, None)),
        ("at",),
    )
    LakeTable.open_or_create(tmp_path, table, lake_schema("postgres", table, described))
    with pytest.raises(InvalidRequest, match="a timestamptz key column at: verify reads"):
        LakeRows(tmp_path, dict).check_table(table, ("at",))
    with pytest.raises(InvalidRequest, match=r"the lake holds no table of app\.nope"):
        LakeRows(tmp_path, dict).check_table(TableRef("app", "nope"), ("id",))


def write_by_region(root: Path, rows: list[Row]) -> dict[str, Path]:
    """`rows` written a region a commit, so each region is one data file whose statistics
    bound it (a merge of keys beyond every file's range adds a file), and those files by
    region."""
    for commit, region in enumerate(REGIONS, start=10):
        write(root, [r for r in rows if r["region"] == region], commit)
    lake = LakeTable.open(root, TABLE)
    files = {f.low: Path(lake.directory) / f.path for f in lake._data_files()}
    assert sorted(files) == sorted(REGIONS) and all(f.low == f.high for f in lake._data_files())
    return files


@pytest.mark.parametrize(
    "chunk",
    [
        Chunk(TABLE, 1, after=("e€", 1), upto=("us", 3)),
        Chunk(TABLE, 2, after=("e€", 2), upto=("us", 0)),
        Chunk(TABLE, 3, keys=(("e€", 0), ("us", 4), ("us", 9))),
        Chunk(TABLE, 4, after=("e€", 0), upto=("us", 4), where="id <> 2"),
    ],
)
def test_a_chunk_reads_only_the_files_its_key_range_meets(tmp_path: Path, chunk: Chunk) -> None:
    """The files of every region but e€ and us are gone from the disk: a read of one of them
    would fail, so a chunk of those two regions' keys (a composite key: its range's bounds
    are cut in the first column) reads neither, nor does its filter's query."""
    rows = source_rows()
    files = write_by_region(tmp_path, rows)
    for region in ("ap", "eu", "eé", "z"):
        files[region].unlink()
    reader = LakeRows(tmp_path, dict)
    found = reader.read_hashes(chunk)
    picked = [r for r in rows if chunk.where is None or r["id"] != 2]
    assert found == expected(reader, picked, chunk)
    assert found
    with pytest.raises(FileNotFoundError):  # the files are gone indeed
        reader.read_hashes(Chunk(TABLE, 5, after=("eu", 4), upto=("us", 0)))


def test_a_file_without_statistics_is_read_by_every_chunk(tmp_path: Path) -> None:
    """The Delta log's add action of the us file loses its statistics: any key may be in it,
    so a chunk of us keys reads it (and still skips the files whose statistics miss it)."""
    rows = source_rows()
    files = write_by_region(tmp_path, rows)
    log = files["us"].parent / "_delta_log"
    for commit in log.glob("*.json"):
        actions = [json.loads(line) for line in commit.read_text().splitlines()]
        for action in actions:
            if files["us"].name in action.get("add", {}).get("path", ""):
                del action["add"]["stats"]
        commit.write_text("".join(json.dumps(a) + "\n" for a in actions))
    lake = LakeTable.open(tmp_path, TABLE)
    assert [f.low for f in lake._data_files() if f.path == files["us"].name] == [None]
    files["ap"].unlink()
    reader = LakeRows(tmp_path, dict)
    for chunk in (
        Chunk(TABLE, 1, after=("eu", 4), upto=("us", 2)),
        Chunk(TABLE, 2, keys=(("us", 1), ("z", 3))),
    ):
        found = reader.read_hashes(chunk)
        assert found == expected(reader, rows, chunk)
        assert any(key[0] == "us" for key in found)


def test_rows_deleted_by_a_deletion_vector_of_a_file_read_before_are_gone(tmp_path: Path) -> None:
    """With deletion vectors a write marks the rows it replaces deleted in their file: a chunk
    read after it, by the reader that kept the file decoded, holds the new row of a changed
    key alone, and nothing of a deleted one (its tombstone and its marked row)."""
    give_new_tables_deletion_vectors(tmp_path)
    rows = source_rows()
    write(tmp_path, rows, 10)
    assert LakeTable.open(tmp_path, TABLE).deletion_vectors
    reader = LakeRows(tmp_path, dict)
    chunk = Chunk(TABLE, 1, after=("ap", 4), upto=("eu", 4))
    before = reader.read_hashes(chunk)
    assert ("eu", 3) in before
    changed = {"region": "eu", "id": 2, "note": "changed"}
    lake = LakeTable.open(tmp_path, TABLE)
    lake.merge(
        SCHEMA.to_arrow(
            [
                LakeRow(changed, 11, 0, "u"),
                LakeRow({"region": "eu", "id": 3}, 11, 1, "d", deleted=True),
            ]
        )
    )
    after = reader.read_hashes(chunk)
    assert after[("eu", 2)] != before[("eu", 2)] and ("eu", 3) not in after
    now = [changed if r["id"] == 2 and r["region"] == "eu" else r for r in rows]
    assert after == expected(reader, [r for r in now if (r["region"], r["id"]) != ("eu", 3)], chunk)
