"""The keyset chunk query with a filter: the filter narrows the chunk's key range inside
parentheses of its own, and a `%` in it reaches the server as written (drivers read `%s`).
Split keys probed on a read replica, the primary confirming where the range ends."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pymysql.converters

from airflow_provider_dblog.core.dump_plan import Chunk
from airflow_provider_dblog.core.event import Key, TableRef
from airflow_provider_dblog.sources.keyset import TableShape, split_keys
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


def probe_over(keys: list[int], asked: list[int]) -> Callable[[str, list[Any]], Key | None]:
    """A split probe answered from `keys` (a table's ids), as the server would; each call is
    recorded in `asked`."""

    def probe(query: str, params: list[Any]) -> Key | None:
        *after, upto = params
        offset = int(query.rsplit("OFFSET ", 1)[1])
        inside = [k for k in keys if (not after or k > after[0]) and k <= upto]
        asked.append(offset)
        return (inside[offset],) if offset < len(inside) else None

    return probe


def test_split_keys_on_a_replica_that_has_every_row_spare_the_primary() -> None:
    primary: list[int] = []
    replica: list[int] = []
    ids = list(range(1, 101))
    keys = split_keys(
        KEYSET, SHAPE, (5,), (100,), 10, 4, probe_over(ids, primary), probe_over(ids, replica)
    )
    assert keys == [(15,), (25,), (35,), (45,)]
    assert (len(replica), primary) == (4, [])


def test_the_primary_goes_on_where_a_replica_behind_runs_out_of_rows() -> None:
    """The replica has applied ids up to 50 of the primary's 100: its keys are boundaries as
    good as any, and the primary finds the rest (without it, the planner would read 51..100 as
    one last chunk)."""
    primary: list[int] = []
    replica: list[int] = []
    keys = split_keys(
        KEYSET,
        SHAPE,
        None,
        (100,),
        10,
        8,
        probe_over(list(range(1, 101)), primary),
        probe_over(list(range(1, 51)), replica),
    )
    assert keys == [(k,) for k in range(10, 81, 10)]
    assert (len(replica), len(primary)) == (6, 3)  # the replica's sixth probe found nothing


def test_without_a_replica_the_primary_is_probed_until_the_range_ends() -> None:
    asked: list[int] = []
    keys = split_keys(KEYSET, SHAPE, None, (25,), 10, 5, probe_over(list(range(1, 101)), asked))
    assert keys == [(10,), (20,)] and len(asked) == 3
