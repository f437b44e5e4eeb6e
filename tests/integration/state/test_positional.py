"""PositionalWindowStore on a real Redis: a read-only window is listed until it ends, armed once
under the tailer's fence (waking the dump), marked ready with the highest hw and lowest
snapshot end of its reads, and the seqs handed out at a commit are never handed out twice."""

from __future__ import annotations

import threading

import pytest

from airflow_provider_dblog.core.reconciler import ChunkRows
from airflow_provider_dblog.state import FencedOut, StateStore, WindowState
from tests.integration.state.support import new_window

pytestmark = pytest.mark.integration
BIG = (1 << 62) + 7
"""A position past a Lua number's 53 bits: compared as digits, not as a float."""


def test_a_window_is_pending_until_it_ends(store: StateStore) -> None:
    window, _, _ = new_window(store)
    store.positional.add(window.window_id)
    (pending,) = store.positional.pending()
    assert pending.window == window
    assert (pending.state, pending.ready, pending.hw) == (WindowState.REGISTERED, False, None)
    assert store.windows.abandon(window.window_id)
    assert store.positional.pending() == []


def test_arming_is_fenced_happens_once_and_wakes_the_dump(store: StateStore) -> None:
    token = store.tailer.acquire_lease("tailer-a", 10_000)
    assert token is not None
    window, _, _ = new_window(store)
    store.positional.add(window.window_id)
    woken: list[WindowState] = []
    waiter = threading.Thread(
        target=lambda: woken.append(
            store.positional.wait_armed(store.windows, window.window_id, 30).state
        )
    )
    waiter.start()
    with pytest.raises(FencedOut):
        store.positional.arm(window.window_id, token - 1, 100)
    assert store.positional.arm(window.window_id, token, 100)
    assert not store.positional.arm(window.window_id, token, 200), "armed once"
    waiter.join(30)
    assert woken == [WindowState.OPEN]
    (pending,) = store.positional.pending()
    assert pending.state is WindowState.OPEN and not pending.ready


def test_ready_carries_the_reads_highest_hw_and_lowest_snapshot_end(store: StateStore) -> None:
    token = store.tailer.acquire_lease("tailer-a", 10_000)
    assert token is not None
    window, _, _ = new_window(store)
    store.positional.add(window.window_id)
    assert not store.positional.ready(window.window_id), "not armed: nothing to close yet"
    assert store.positional.arm(window.window_id, token, 100)
    for part, (hw, end) in enumerate(((BIG, BIG), (BIG + 10, BIG + 10), (BIG - 5, BIG + 3))):
        rows = [{"id": part}]
        stored = store.windows.append_rows(
            window.window_id, part, rows, ("id",), frozenset(), hw=hw, snapshot_end=end
        )
        assert stored == 1
    assert store.positional.ready(window.window_id)
    (pending,) = store.positional.pending()
    assert (pending.ready, pending.hw, pending.snapshot_end) == (True, BIG + 10, BIG)
    stored_rows = store.windows.stored_rows(window.window_id)
    assert stored_rows is not None and stored_rows.snapshot_end == BIG


def test_put_rows_stores_hw_for_the_tailer(store: StateStore) -> None:
    token = store.tailer.acquire_lease("tailer-a", 10_000)
    assert token is not None
    window, _, _ = new_window(store)
    store.positional.add(window.window_id)
    assert store.positional.arm(window.window_id, token, 100)
    chunk = ChunkRows(window.window_id, ("id",), [{"id": 1}], 0, hw=150)
    assert store.windows.put_rows(window.window_id, chunk)
    assert store.positional.ready(window.window_id)
    (pending,) = store.positional.pending()
    assert (pending.hw, pending.snapshot_end) == (150, None)


def test_seqs_at_a_commit_are_handed_out_once_even_to_the_next_tailer(store: StateStore) -> None:
    token = store.tailer.acquire_lease("tailer-a", 1)
    assert token is not None
    assert store.positional.reserve(BIG, 10, token) == 0
    assert store.positional.reserve(BIG, 5, token) == 11
    next_token = None
    while next_token is None:
        next_token = store.tailer.acquire_lease("tailer-b", 10_000)
    with pytest.raises(FencedOut):
        store.positional.reserve(BIG, 1, token)
    assert store.positional.reserve(BIG, 1, next_token) == 17
    assert store.positional.reserve(BIG + 1, 3, next_token) == 0, "a new commit starts afresh"
