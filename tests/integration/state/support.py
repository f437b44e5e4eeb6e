"""Helpers of the state tests: a registered window, its chunk rows, a bounded wait."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import pytest

from airflow_provider_dblog.core.event import TableRef
from airflow_provider_dblog.core.reconciler import ChunkRows, Window
from airflow_provider_dblog.state import StateStore

T = TableRef("public", "orders")
TTL_S = 600.0


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout}s")
        time.sleep(0.02)


def new_window(store: StateStore, ttl_s: float = TTL_S) -> tuple[Window, str, str]:
    window = Window(uuid.uuid4().hex, "dump-1", T)
    lw, hw = str(uuid.uuid4()), str(uuid.uuid4())
    store.windows.register(window, lw, hw, {"after": [41], "upto": [99], "seq": 3}, ttl_s)
    return window, lw, hw


def chunk_of(window: Window, rows: list[dict[str, object]]) -> ChunkRows:
    return ChunkRows(window.window_id, ("id",), rows, schema_version=2)
