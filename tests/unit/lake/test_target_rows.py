"""The lake as a verified target reads exactly a chunk's rows: a key range of a composite text
and integer key (multibyte text among them), a key list, and a table a commit changed between
two chunks, against the rows picked in Python (real Delta tables in a temp dir)."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_provider_dblog.core.dump_plan import Chunk
from airflow_provider_dblog.core.errors import InvalidRequest
from airflow_provider_dblog.core.event import Key, Row, TableRef
from airflow_provider_dblog.core.schema import Column, TableSchema
from airflow_provider_dblog.lake.schema import LakeRow, lake_schema
from airflow_provider_dblog.lake.table import LakeTable
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
