"""One chunk between watermarks: the runner calls it for every chunk, read here or by Spark.

Register the window, write lw, read the chunk (a non-stale read), put the rows into Redis,
write hw, then wait for the tailer to close the window. The rows are in Redis before hw is in
the log, so the tailer never waits for the dump. If the window does not close in time the dump
abandons it; the tailer and the dump race on that transition in Redis and exactly one wins.

A read-only source (`ChunkSource.read_only`) writes nothing: the tailer arms the window at its
read position instead of meeting lw, and closes it once it has read past the hw the read stored
with the rows (`state/positional.py`).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol, TypeVar

from airflow_provider_dblog.core.dump_plan import Chunk
from airflow_provider_dblog.core.errors import DBLogError
from airflow_provider_dblog.core.event import Key, key_of
from airflow_provider_dblog.core.reconciler import ChunkRows, Window
from airflow_provider_dblog.sources.base import ChunkSource
from airflow_provider_dblog.state import StateStore, WindowState

WINDOW_KEYS_MIN_TTL_S = 600.0
"""A window's Redis keys live at least this long: their TTL only collects garbage, and must
outlast a slow read (a Spark application still starting its executors) by far."""


class ChunkReadFailed(DBLogError):
    """A reader could not read the chunk for a reason other than its source going away (a
    Spark job failed): the chunk is retried with new watermarks, as a failed window."""


@dataclass(frozen=True, slots=True)
class StoredChunk:
    """What a chunk reader put into Redis: how many rows, and the last key read (for a LIMIT
    chunk, where the next one starts; None when no row was read or the reader does not know)."""

    rows: int
    last_key: Key | None


ReadT = TypeVar("ReadT")


class ChunkReader(Protocol):
    """Reads a chunk and stores its rows for the window, after lw and before hw. Returns None if
    the window is already past open (the tailer ended it): the chunk is then retried. Raises
    `SourceUnavailable` if the source went away, `ChunkReadFailed` if the read failed otherwise
    and may succeed again."""

    def __call__(
        self,
        store: StateStore,
        source: ChunkSource,
        window_id: str,
        chunk: Chunk,
        key_columns: tuple[str, ...],
    ) -> StoredChunk | None: ...


def read_in_process(
    store: StateStore,
    source: ChunkSource,
    window_id: str,
    chunk: Chunk,
    key_columns: tuple[str, ...],
) -> StoredChunk | None:
    """The `ChunkReader` of `dblog dump`: one query on this process's connection."""
    read = source.read_chunk(chunk)
    rows = ChunkRows(window_id, key_columns, read.rows, 0, read.invisible_txids)
    if read.snapshot is not None:
        end = read.snapshot.hw if read.snapshot.exact else None
        rows = replace(rows, hw=read.snapshot.hw, snapshot_end=end)
    if not store.windows.put_rows(window_id, rows):
        return None
    last_key = key_of(read.rows[-1], key_columns) if read.rows else None
    return StoredChunk(len(read.rows), last_key)


@dataclass(frozen=True, slots=True)
class ChunkOutcome:
    completed: bool
    rows: int
    last_key: Key | None
    reason: str | None = None
    written: int = 0
    """Rows the dump wrote into a direct target (a sequenced chunk's go through the tailer)."""


def chunk_to_json(chunk: Chunk) -> dict[str, object]:
    return {
        "table": str(chunk.table),
        "seq": chunk.seq,
        "after": None if chunk.after is None else list(chunk.after),
        "upto": None if chunk.upto is None else list(chunk.upto),
        "limit": chunk.limit,
        "keys": None if chunk.keys is None else len(chunk.keys),
    }


def run_chunk(
    store: StateStore,
    source: ChunkSource,
    dump_id: str,
    chunk: Chunk,
    key_columns: tuple[str, ...],
    *,
    window_timeout_s: float = 60.0,
    read: ChunkReader = read_in_process,
) -> ChunkOutcome:
    """Read one chunk between a fresh lw and hw (with `read`: in this process, or by Spark
    tasks) and wait until the tailer has emitted it."""
    window = Window(uuid.uuid4().hex, dump_id, chunk.table)
    stored = between_watermarks(
        store,
        source,
        window,
        chunk,
        lambda window_id: read(store, source, window_id, chunk, key_columns),
        window_timeout_s=window_timeout_s,
        ended="closed",
    )
    if isinstance(stored, ChunkOutcome):
        return stored
    return ChunkOutcome(True, stored.rows, stored.last_key)


def between_watermarks(
    store: StateStore,
    source: ChunkSource,
    window: Window,
    chunk: Chunk,
    read: Callable[[str], ReadT | None],
    *,
    window_timeout_s: float,
    ended: str,
) -> ReadT | ChunkOutcome:
    """Steps 1-3 of the paper's Algorithm 1 for one window, sequenced or direct: register it,
    write lw, `read` the chunk (None: the tailer already ended the window), write hw and wait
    until the tailer has `ended` it. What `read` returned once the window closed, else the
    outcome of a chunk to retry."""
    lw, hw = str(uuid.uuid4()), str(uuid.uuid4())
    ttl_s = max(window_timeout_s * 10, WINDOW_KEYS_MIN_TTL_S)
    store.windows.register(window, lw, hw, chunk_to_json(chunk), ttl_s=ttl_s)
    try:
        if source.read_only:
            not_armed = _armed(store, window, window_timeout_s)
            if not_armed is not None:
                return not_armed
        else:
            source.write_watermark(lw)
        result = read(window.window_id)
        if result is None:
            # The tailer already ended this window (it expired, or hw came before lw):
            # writing hw would only be ignored.
            return _ended(store, window)
        if source.read_only:
            if not store.positional.ready(window.window_id):
                return _ended(store, window)
        else:
            source.write_watermark(hw)
    except BaseException:
        store.windows.abandon(window.window_id)
        raise
    status = store.windows.wait(window.window_id, window_timeout_s)
    if not status.state.ended:
        if store.windows.abandon(window.window_id, f"not {ended} in {window_timeout_s}s"):
            return ChunkOutcome(False, 0, None, f"window not {ended} in {window_timeout_s}s")
        # The tailer claimed it first: it is finishing the window.
        status = store.windows.wait(window.window_id, window_timeout_s)
    if status.state is not WindowState.CLOSED:
        return ChunkOutcome(False, 0, None, status.reason or f"window {status.state}")
    return result


def _armed(store: StateStore, window: Window, timeout_s: float) -> ChunkOutcome | None:
    """Add a read-only window for the tailer to arm and wait until it has: None once armed,
    else the outcome of a chunk to retry."""
    store.positional.add(window.window_id)
    status = store.positional.wait_armed(store.windows, window.window_id, timeout_s)
    if status.state is WindowState.OPEN:
        return None
    reason = f"window not armed by the tailer in {timeout_s}s (is dblog tail running?)"
    if status.state is WindowState.REGISTERED and store.windows.abandon(window.window_id, reason):
        return ChunkOutcome(False, 0, None, reason)
    return _ended(store, window)


def _ended(store: StateStore, window: Window) -> ChunkOutcome:
    """The outcome of a window the tailer ended before the dump was done with it."""
    status = store.windows.state(window.window_id)
    reason = status.reason if status else "window vanished"
    return ChunkOutcome(False, 0, None, reason)
