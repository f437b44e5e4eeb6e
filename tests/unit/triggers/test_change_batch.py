"""The change trigger's batching, pure: a batch closes at `max_changes` entries or
`max_wait_s` after its first watched change, entries of other tables or ops are acknowledged
at once and never fired, and each batch is summarised per table with counts and positions."""

from __future__ import annotations

import json

import pytest

from airflow_provider_dblog.core.position import Position
from airflow_provider_dblog.triggers.change_batch import ChangeBatcher, StreamEntry, Watch

WATCH = Watch.of("shop", ["public.orders"], ["c", "u", "d"])


def entry(n: int, table: str = "public.orders", op: str = "u", stream: str = "s") -> StreamEntry:
    fields = {"table": table, "op": op, "position": json.dumps([100 + n, n])}
    return StreamEntry.from_fields(stream, f"{n}-0", fields)


def test_a_batch_closes_at_max_changes_entries() -> None:
    batcher = ChangeBatcher(WATCH, max_changes=3, max_wait_s=60)
    batcher.add([entry(1), entry(2)], now=0)
    assert not batcher.due(0) and batcher.room() == 1
    with pytest.raises(ValueError, match="do not fit"):
        batcher.add([entry(3), entry(4)], now=0)
    batcher.add([entry(3)], now=0)
    assert batcher.due(0) and batcher.room() == 0
    batch = batcher.take()
    assert [e.entry_id for e in batch.entries] == ["1-0", "2-0", "3-0"]
    assert batcher.room() == 3 and not batcher.due(1000)


def test_a_batch_closes_max_wait_after_its_first_watched_change() -> None:
    batcher = ChangeBatcher(WATCH, max_changes=100, max_wait_s=2)
    assert batcher.wait_s(0) is None  # nothing open: block as long as you like
    batcher.add([entry(1)], now=10)
    assert batcher.wait_s(10.5) == 1.5
    batcher.add([entry(2)], now=11.5)  # a later change does not push the deadline
    assert not batcher.due(11.9)
    assert batcher.due(12) and batcher.wait_s(13) == 0
    assert len(batcher.take().watched) == 2
    assert batcher.wait_s(13) is None


def test_unwatched_entries_close_their_batch_at_once_and_fire_nothing() -> None:
    batcher = ChangeBatcher(WATCH, max_changes=100, max_wait_s=60)
    batcher.add([entry(1, table="public.items"), entry(2, op="r")], now=0)
    assert batcher.due(0)
    batch = batcher.take()
    assert batch.watched == [] and batch.summaries("shop") == []
    assert batch.ids_by_stream() == {"s": ["1-0", "2-0"]}  # acknowledged all the same


def test_unwatched_entries_ride_along_with_a_watched_batch() -> None:
    batcher = ChangeBatcher(WATCH, max_changes=100, max_wait_s=5)
    batcher.add([entry(1), entry(2, table="public.items")], now=0)
    assert not batcher.due(1)
    batch = batcher.take()
    assert len(batch.entries) == 2 and len(batch.watched) == 1


def test_a_batch_is_summarised_per_table_with_counts_and_positions() -> None:
    watch = Watch.of("shop", ["public.orders", "public.items"], ["c", "d"])
    batcher = ChangeBatcher(watch, max_changes=10, max_wait_s=1)
    batcher.add(
        [
            entry(1, op="c"),
            entry(2, table="public.items", op="d"),
            entry(3, op="u"),  # not a watched op
            entry(4, op="d", stream="t"),
            entry(5, op="d"),
        ],
        now=0,
    )
    batch = batcher.take()
    assert batch.ids_by_stream() == {"s": ["1-0", "2-0", "3-0", "5-0"], "t": ["4-0"]}
    items, orders = (s.to_payload() for s in batch.summaries("shop"))
    assert items == {
        "source": "shop",
        "table": "public.items",
        "ops": {"d": 1},
        "count": 1,
        "first_position": [102, 2],
        "last_position": [102, 2],
    }
    assert orders["ops"] == {"c": 1, "d": 2} and orders["count"] == 3
    assert orders["first_position"] == [101, 1] and orders["last_position"] == [105, 5]


def test_a_trimmed_entry_is_acknowledged_and_never_fired() -> None:
    trimmed = StreamEntry.from_fields("s", "7-0", {})
    assert trimmed.table is None and trimmed.position is None
    batcher = ChangeBatcher(WATCH, max_changes=10, max_wait_s=1)
    batcher.add([trimmed], now=0)
    assert batcher.due(0)
    batch = batcher.take()
    assert batch.ids_by_stream() == {"s": ["7-0"]} and batch.summaries("shop") == []


def test_a_watch_and_bounds_refuse_what_cannot_work_by_name() -> None:
    with pytest.raises(ValueError, match="'orders'"):
        Watch.of("shop", ["orders"], ["c"])
    with pytest.raises(ValueError, match="got x"):
        Watch.of("shop", ["public.orders"], ["x"])
    with pytest.raises(ValueError, match="at least one table"):
        Watch.of("shop", [], ["c"])
    with pytest.raises(ValueError, match="max_changes"):
        ChangeBatcher(WATCH, max_changes=0, max_wait_s=1)
    with pytest.raises(ValueError, match="max_wait_s"):
        ChangeBatcher(WATCH, max_changes=1, max_wait_s=-1)


def test_positions_compare_as_the_stream_orders_them() -> None:
    assert entry(2).position == Position(102, 2)
