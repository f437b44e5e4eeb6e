"""What a QUERY event's SQL says to the binlog mapping (`statements.py`): a transaction's
boundaries, the table a TRUNCATE empties, and whether DDL names a table."""

from __future__ import annotations

import pytest

from airflow_provider_dblog.core.event import TableRef
from airflow_provider_dblog.sources.mysql import statements

pytestmark = pytest.mark.unit

ORDERS = TableRef("shop", "orders")


def test_a_transactions_boundaries() -> None:
    assert statements.is_begin(" begin ;") and not statements.is_begin("BEGIN WORK AND")
    assert statements.is_end("COMMIT") and statements.is_end("rollback;")
    assert not statements.is_end("COMMIT AND CHAIN x")


@pytest.mark.parametrize(
    ("sql", "table"),
    [
        ("TRUNCATE TABLE orders", ORDERS),
        ("truncate `shop`.`orders`;", ORDERS),
        ("TRUNCATE `we``ird`", TableRef("shop", "we`ird")),
        ("TRUNCATE other . orders", TableRef("other", "orders")),
        ("DELETE FROM orders", None),
    ],
)
def test_the_table_a_truncate_empties(sql: str, table: TableRef | None) -> None:
    assert statements.truncated(sql, "shop") == table


@pytest.mark.parametrize(
    ("sql", "named"),
    [
        ("ALTER TABLE orders ADD COLUMN x int", True),
        ("RENAME TABLE `orders` TO old", True),
        ("ALTER TABLE shop.orders DROP x", True),
        ("ALTER TABLE orders_archive ADD x int", False),
        ("CREATE TABLE $orders (id int)", False),
    ],
)
def test_ddl_names_a_table_only_as_a_whole_name(sql: str, named: bool) -> None:
    assert statements.is_ddl(sql)
    assert statements.names(sql, ORDERS) is named
