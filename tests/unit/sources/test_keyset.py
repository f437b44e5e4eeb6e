"""The keyset chunk query with a filter: the filter narrows the chunk's key range inside
parentheses of its own, and a `%` in it reaches the server as written (drivers read `%s`)."""

from __future__ import annotations

import pymysql.converters

from airflow_provider_dblog.core.dump_plan import Chunk
from airflow_provider_dblog.core.event import TableRef
from airflow_provider_dblog.sources.keyset import TableShape
from airflow_provider_dblog.sources.mysql.catalog import ColumnInfo
from airflow_provider_dblog.sources.mysql.keyset import KEYSET

T = TableRef("shop", "accounts")
ID = ColumnInfo("id", "bigint", "bigint(20)")
OWNER = ColumnInfo("owner", "varchar", "varchar(100)", "utf8mb4", "utf8mb4_general_ci")
SHAPE = TableShape(T, (ID, OWNER), (ID,))


def test_a_filter_narrows_the_range_and_keeps_its_percent_signs() -> None:
    chunk = Chunk(T, 0, after=(10,), upto=(20,), where="owner LIKE '%7%' OR id = 1")
    query, params = KEYSET.chunk(SHAPE, chunk, "*")
    sent = query % tuple(pymysql.converters.escape_item(p, "utf8") for p in params)
    assert sent == (
        "SELECT * FROM `shop`.`accounts` WHERE (`id`) > (10) AND (`id`) <= (20) AND "
        "(owner LIKE '%7%' OR id = 1) ORDER BY `id`"
    )


def test_a_key_chunk_is_narrowed_too() -> None:
    query, params = KEYSET.chunk(SHAPE, Chunk(T, 0, keys=((1,), (2,)), where="id > 1"), "*")
    assert query.endswith("IN ((%s), (%s)) AND (id > 1) ORDER BY `id`") and params == [1, 2]
