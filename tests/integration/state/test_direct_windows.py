"""DirectWindowStore on a real Redis: the record at hw closes the window in the same move, races
the dump's abandon, and the tombstone horizon follows the windows whose rows are pending."""

from __future__ import annotations

import uuid

import pytest

from airflow_provider_dblog.core.direct import DirectRecord, DumpMode
from airflow_provider_dblog.core.position import Position
from airflow_provider_dblog.core.reconciler import ChunkRows, Window
from airflow_provider_dblog.state import FencedOut, StateStore, WindowState
from tests.integration.state.support import T, wait_for

pytestmark = pytest.mark.integration


def direct_window(store: StateStore, ttl_s: float = 600.0) -> tuple[Window, str, str]:
    window = Window(uuid.uuid4().hex, "dump-1", T, DumpMode.DIRECT)
    lw, hw = str(uuid.uuid4()), str(uuid.uuid4())
    store.windows.register(window, lw, hw, {"seq": 1}, ttl_s)
    return window, lw, hw


def record_of(window: Window, lw: int, hw: int, *keys: tuple[object, ...]) -> DirectRecord:
    return DirectRecord(window.window_id, Position(lw, 0), Position(hw, 0), frozenset(keys))


def test_a_direct_window_is_recorded_and_closed_in_one_move(store: StateStore) -> None:
    token = store.tailer.acquire_lease("tailer-a", 10_000)
    assert token is not None
    window, _, hw = direct_window(store)
    assert store.windows.lookup_watermark(hw) == (window, "hw"), "the mode travels with it"
    rows = ChunkRows(window.window_id, ("id",), [], 0, frozenset({7}))
    assert store.windows.put_rows(window.window_id, rows)
    assert store.directs.record_of(window.window_id) is None
    assert store.windows.open(window.window_id, token)

    record = record_of(window, 100, 200, (1,), ("a", (2, 3)))
    assert store.directs.record(record, token)
    assert not store.directs.record(record, token), "recorded once"
    assert not store.windows.abandon(window.window_id), "recorded: too late to abandon"
    assert store.windows.wait(window.window_id, 5).state is WindowState.CLOSED
    assert store.directs.record_of(window.window_id) == record
    assert store.windows.stored_rows(window.window_id) is None, "the reads' metadata is gone"
    assert store.directs.pending() == {window.window_id: Position(100, 0)}

    store.directs.committed(window.window_id)
    assert store.directs.pending() == {}


def test_a_stale_leader_cannot_record(store: StateStore) -> None:
    token = store.tailer.acquire_lease("tailer-a", 1)
    assert token is not None
    tokens: list[int | None] = []
    wait_for(
        lambda: tokens.append(store.tailer.acquire_lease("b", 10_000)) or bool(tokens[-1]), 5, "b"
    )
    newer = tokens[-1]
    assert newer is not None
    other, _, _ = direct_window(store)
    assert store.windows.open(other.window_id, newer)
    with pytest.raises(FencedOut):
        store.directs.record(record_of(other, 1, 2), token)


def test_record_and_abandon_race_has_exactly_one_winner(store: StateStore) -> None:
    token = store.tailer.acquire_lease("tailer-a", 60_000)
    assert token is not None
    for _ in range(50):
        window, _, _ = direct_window(store)
        assert store.windows.open(window.window_id, token)
        abandoned = store.windows.abandon(window.window_id)
        recorded = store.directs.record(record_of(window, 1, 2), token)
        assert abandoned != recorded
        assert (store.directs.record_of(window.window_id) is None) == abandoned


def test_the_horizon_is_the_oldest_pending_lw_or_the_checkpoint(store: StateStore) -> None:
    token = store.tailer.acquire_lease("tailer-a", 60_000)
    assert token is not None
    assert store.directs.horizon() is None, "no checkpoint yet: prune nothing"
    store.tailer.save_checkpoint(500, token)
    assert store.directs.horizon() == Position(500, 0)

    old, _, _ = direct_window(store)
    young, _, _ = direct_window(store)
    for window, lw in ((old, 120), (young, 300)):
        assert store.windows.open(window.window_id, token)
        assert store.directs.record(record_of(window, lw, lw + 10), token)
    assert store.directs.horizon() == Position(120, 0)
    store.directs.committed(old.window_id)
    assert store.directs.horizon() == Position(300, 0)

    # A window whose dump died after the record: once its keys expire it holds nothing back.
    dead, _, _ = direct_window(store, ttl_s=0.2)
    assert store.windows.open(dead.window_id, token)
    assert store.directs.record(record_of(dead, 50, 60), token)
    assert store.directs.horizon() == Position(50, 0)
    store.directs.committed(young.window_id)
    wait_for(lambda: store.directs.horizon() == Position(500, 0), 5, "the dead window expires")
    assert store.directs.pending() == {}
