"""Helpers of the state tests: a registered window, its chunk rows, a bounded wait."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable

import pytest

from airflow_provider_dblog.core.event import TableRef, key_of
from airflow_provider_dblog.core.reconciler import ChunkRows, Window
from airflow_provider_dblog.state import StateStore
from tests.deadlines import deadline_s

T = TableRef("public", "orders")
TTL_S = 600.0


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + deadline_s(timeout)
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {deadline_s(timeout)}s")
        time.sleep(0.02)


def new_window(store: StateStore, ttl_s: float = TTL_S) -> tuple[Window, str, str]:
    window = Window(uuid.uuid4().hex, "dump-1", T)
    lw, hw = str(uuid.uuid4()), str(uuid.uuid4())
    store.windows.register(window, lw, hw, {"after": [41], "upto": [99], "seq": 3}, ttl_s)
    return window, lw, hw


def chunk_of(window: Window, rows: list[dict[str, object]]) -> ChunkRows:
    return ChunkRows(window.window_id, ("id",), rows, schema_version=2)


def stored_chunk(store: StateStore, window_id: str) -> ChunkRows | None:
    """The chunk rows stored for a window, decoded back (their `schema_version` is the
    tailer's to give: 0 here); each row's stored key must be its key."""
    stored = store.windows.stored_rows(window_id)
    if stored is None:
        return None
    rows = []
    for page in store.windows.row_slices(stored):
        for key, values in zip(page.keys, page.values, strict=True):
            row = json.loads(values)
            assert key_of(json.loads(key), stored.key_columns) == key_of(row, stored.key_columns)
            rows.append(row)
    assert len(rows) == stored.rows
    return ChunkRows(window_id, stored.key_columns, rows, 0, stored.invisible_txids)


def as_stored(chunk: ChunkRows) -> ChunkRows:
    """`chunk` as `stored_chunk` gives it back."""
    return ChunkRows(chunk.window_id, chunk.key_columns, chunk.rows, 0, chunk.invisible_txids)
