"""A chunk's rows summed by the server, as `dblog verify` compares two PostgreSQL tables of the
same columns without reading their rows (`core.verify.ChunkSum`).

Each row is hashed by the server as the MD5 of its text (`ROW(c1, c2, ...)::text`, the
columns in the order of their names), and the chunk is summed as its row count and two sums of
60 bits of each hash (the first and the next 15 hex digits, as bigints, summed in `numeric`: no
overflow). Two tables whose columns have the same names and types print equal values alike on
connections with the same session settings (`config.SESSION_OPTIONS`: time zone, date style,
float digits, bytea output), so equal chunks sum equal. Rows are summed, not XORed: a row
counted twice does not cancel out. A chunk whose sums differ holds a different row, or the same
values printed differently (a `json` column's spacing): either way its rows are read and
compared.
"""

from __future__ import annotations

import psycopg
from psycopg import sql
from psycopg.rows import TupleRow

from airflow_provider_dblog.core.dump_plan import Chunk
from airflow_provider_dblog.core.verify import ChunkSum
from airflow_provider_dblog.sources.keyset import TableShape
from airflow_provider_dblog.sources.postgres.catalog import ColumnInfo
from airflow_provider_dblog.sources.postgres.keyset import KEYSET

_SUMS = sql.SQL(
    "SELECT count(*), coalesce(sum(('x' || substr(h, 1, 15))::bit(60)::bigint), 0)::text, "
    "coalesce(sum(('x' || substr(h, 16, 15))::bit(60)::bigint), 0)::text "
    "FROM ({}) AS chunk (h)"
)


def sum_chunk(
    conn: psycopg.Connection[TupleRow], shape: TableShape[ColumnInfo], chunk: Chunk
) -> ChunkSum:
    """The rows of `chunk` (its range or key list, and its filter) of the table `shape`
    describes, on `conn`, summed over its columns in the order of their names: two tables whose
    columns differ only in their order sum alike."""
    columns = tuple(sorted((c.name, c.sql_type) for c in shape.columns))
    row = sql.SQL("md5(ROW({})::text)").format(
        sql.SQL(", ").join(sql.Identifier(name) for name, _ in columns)
    )
    query, params = KEYSET.chunk(shape, chunk, sql.Composed([row]))
    found = conn.execute(_SUMS.format(query), params).fetchone()
    assert found is not None
    count, first, second = found
    return ChunkSum(int(count), columns, f"{first}:{second}")
