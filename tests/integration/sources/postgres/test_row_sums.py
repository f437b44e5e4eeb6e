"""A chunk summed by the server (`row_sums.py`): a copy of a table of every type, its columns in
another order, sums as the source does, over the whole table and over a key range; a changed
value, a missing row and a column of another type make the sums differ."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from airflow_provider_dblog.core.dump_plan import Chunk
from airflow_provider_dblog.core.event import TableRef
from airflow_provider_dblog.sources.postgres import PostgresChunkSource
from airflow_provider_dblog.sources.postgres.target_rows import TargetRows
from tests.integration.sources.postgres.test_chunk_values import (
    AllTypes,
    all_types,  # noqa: F401 (the fixture)
    column_types,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def copy(all_types: AllTypes) -> Iterator[TableRef]:  # noqa: F811 (the fixture imported above)
    """The table's copy in a schema of its own, its columns declared in the reverse order."""
    schema = f"copy_{uuid.uuid4().hex[:10]}"
    copied = TableRef(schema, "t")
    types = {"k": "text", "n": "int", **column_types(all_types.table.schema)}
    columns = list(reversed(types))
    definitions = ", ".join(f"{name} {types[name]}" for name in columns)
    names = sql.SQL(", ").join(sql.Identifier(name) for name in columns)
    with psycopg.connect(all_types.info.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
        conn.execute(
            f"CREATE TABLE {copied} ({definitions}, "
            "twice int GENERATED ALWAYS AS (n * 2) STORED, PRIMARY KEY (k, n))"
        )
        conn.execute(
            sql.SQL("INSERT INTO {} ({}) SELECT {} FROM {}").format(
                sql.Identifier(schema, "t"),
                names,
                names,
                sql.Identifier(all_types.table.schema, all_types.table.name),
            )
        )
    yield copied
    with psycopg.connect(all_types.info.dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA {schema} CASCADE")


def test_a_copy_sums_as_its_source_until_a_row_or_a_type_differs(
    all_types: AllTypes,  # noqa: F811
    copy: TableRef,
) -> None:
    source = PostgresChunkSource(all_types.config)
    target = TargetRows(all_types.info.dsn, lambda _: copy)
    table = all_types.table
    whole = Chunk(table, 0)
    inner = Chunk(table, 1, after=("a", 1), upto=("b", 2))
    try:
        summed = source.sum_chunk(whole).sum
        assert summed.rows == 5
        assert target.sum_rows(whole) == summed
        assert source.sum_chunk(inner).sum.rows == 3
        assert target.sum_rows(inner) == source.sum_chunk(inner).sum

        with psycopg.connect(all_types.info.dsn, autocommit=True) as conn:
            conn.execute(f"UPDATE {copy} SET t = t || '.' WHERE k = 'b' AND n = 1")
            changed = target.sum_rows(inner)
            assert changed is not None and changed.rows == 3
            assert changed != source.sum_chunk(inner).sum
            assert (
                target.sum_rows(Chunk(table, 2, upto=("a", 2)))
                == source.sum_chunk(Chunk(table, 2, upto=("a", 2))).sum
            ), "the rows outside the change still sum alike"

            conn.execute(f"UPDATE {copy} SET t = rtrim(t, '.') WHERE k = 'b' AND n = 1")
            assert target.sum_rows(inner) == source.sum_chunk(inner).sum
            conn.execute(f"DELETE FROM {copy} WHERE k = 'a' AND n = 2")
            missing = target.sum_rows(inner)
            assert missing is not None and missing.rows == 2

            conn.execute(f"ALTER TABLE {copy} ALTER COLUMN vc TYPE text")
        retyped = TargetRows(all_types.info.dsn, lambda _: copy)
        try:
            last = Chunk(table, 3, after=("b", 2))
            other = retyped.sum_rows(last)
            assert other is not None
            assert other.rows == 1 and other != source.sum_chunk(last).sum
        finally:
            retyped.close()
    finally:
        target.close()
        source.close()
