"""The progress lines a dump task's log shows while the dump runs: rows, rate, share and time
left per table that moved, measured from what the watcher saw."""

from __future__ import annotations

from dataclasses import replace

import pytest

from airflow_provider_dblog.core.dump_plan import TableProgress
from airflow_provider_dblog.core.event import TableRef
from airflow_provider_dblog.triggers.dump_progress import ProgressLines

pytestmark = pytest.mark.unit
ORDERS = TableRef("public", "orders")
ITEMS = TableRef("public", "items")


def test_a_dump_of_keys_shows_its_rate_share_and_time_left() -> None:
    lines = ProgressLines(keys_requested=10)
    start = TableProgress(ORDERS, started=True)
    assert lines.moved({ORDERS: start}, now_s=100.0) == ["public.orders: 0 rows, 0%"]
    assert lines.moved({ORDERS: start}, now_s=105.0) == []  # nothing moved, nothing logged
    later = replace(start, key_index=4, rows_done=4, chunks_done=2)
    assert lines.moved({ORDERS: later}, now_s=110.0) == [
        "public.orders: 4 rows, 0.4 rows/s, 40%, ETA 0:15"
    ]
    done = replace(later, key_index=10, rows_done=10, done=True)
    assert lines.moved({ORDERS: done}, now_s=120.0) == ["public.orders: done, 10 rows"]


def test_a_table_by_integer_key_is_estimated_and_rows_read_before_do_not_count() -> None:
    lines = ProgressLines(keys_requested=0)
    resumed = TableProgress(ORDERS, started=True, max_key=(1000,), after=(100,), rows_done=100)
    waiting = TableProgress(ITEMS)
    assert lines.moved({ORDERS: resumed, ITEMS: waiting}, now_s=0.0) == [
        "public.orders: 100 rows",
        "public.items: waiting",
    ]
    moved = replace(resumed, after=(200,), rows_done=200)
    # 100 rows in 5 s; a row per key over 800 keys left: 20% done, 800 rows at 20 rows/s.
    assert lines.moved({ORDERS: moved, ITEMS: waiting}, now_s=5.0) == [
        "public.orders: 200 rows, 20 rows/s, 20%, ETA 0:40"
    ]


def test_a_table_by_composite_key_shows_no_share_and_no_eta() -> None:
    """Its share cannot be told, so neither can the time left: the line says nothing of it."""
    lines = ProgressLines(keys_requested=0)
    start = TableProgress(ORDERS, started=True, max_key=("us", 500), after=("eu", 10))
    assert lines.moved({ORDERS: start}, now_s=0.0) == ["public.orders: 0 rows"]
    moved = replace(start, after=("eu", 110), rows_done=100, chunks_done=1)
    (line,) = lines.moved({ORDERS: moved}, now_s=5.0)
    assert line == "public.orders: 100 rows, 20 rows/s"
    assert "ETA" not in line and "?" not in line
