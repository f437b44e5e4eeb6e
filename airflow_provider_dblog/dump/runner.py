"""Runs one stored dump request to the end: chunk after chunk, obeying its controls.

Progress is saved after each chunk, so a dump killed at any moment resumes from its last
completed chunk when run again. Between chunks it reads the controls in Redis (pause, resume,
cancel, chunk size, delay, rows/s), so they can be changed while it runs. Used by `dblog dump`
(chunks read in this process) and by the Spark application (`spark_jobs/dump.py`: the same
loop, each chunk read by Spark tasks through another `ChunkReader`).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from functools import partial
from typing import TypeVar

from airflow_provider_dblog.core.dump_plan import Chunk, TablePlanner, TableProgress
from airflow_provider_dblog.core.errors import DBLogError
from airflow_provider_dblog.dump.chunk import (
    ChunkOutcome,
    ChunkReader,
    read_in_process,
    run_chunk,
)
from airflow_provider_dblog.sources.base import ChunkSource, SourceUnavailable
from airflow_provider_dblog.state import (
    DumpControls,
    DumpState,
    StateStore,
    StateStoreUnavailable,
    UnknownWindow,
)

log = logging.getLogger(__name__)

ProgressCallback = Callable[[str, TableProgress], None]
PAUSE_POLL_S = 0.5
UNAVAILABLE_BACKOFF_S = 0.25
STORE_PATIENCE_S = 60.0
DRIVER_TTL_MS = 15_000
"""A dump whose process has not beaten for this long is taken for dead (see `beat_dump`)."""
T = TypeVar("T")


class DumpFailed(DBLogError):
    pass


def run_dump(
    store: StateStore,
    open_source: Callable[[], ChunkSource],
    dump_id: str,
    *,
    window_timeout_s: float = 60.0,
    max_attempts: int = 5,
    on_progress: ProgressCallback | None = None,
    stop: threading.Event | None = None,
    read: ChunkReader = read_in_process,
    bounded_chunks: bool = False,
) -> DumpState:
    """Run the dump until done, cancelled or failed; returns the final status. `read` reads
    each chunk into Redis; `bounded_chunks` plans range chunks with an upper bound always
    (see `TablePlanner.bounded`), as a reader that splits a chunk needs."""
    stored = store.dumps.get(dump_id)
    if stored is None:
        raise DumpFailed(f"no dump request {dump_id!r} in the store")
    request = stored.request
    progress = store.dumps.load_progress(dump_id)
    parallelism = request.parallelism
    if not store.dumps.mark(dump_id, DumpState.RUNNING):
        # Finished already (cancelled before it started, or ended by another run).
        status = store.dumps.status(dump_id)
        assert status is not None
        log.info("dump %s is %s: nothing to run", dump_id, status.state)
        return status.state
    sources = [open_source() for _ in range(parallelism)]
    try:
        with (
            _beating(store, dump_id),
            ThreadPoolExecutor(parallelism, thread_name_prefix="dblog-chunk") as pool,
        ):
            for table in request.tables:
                key_columns = sources[0].key_columns(table)
                planner = TablePlanner(
                    progress.get(table) or TableProgress(table),
                    request.chunk_size,
                    request.keys if request.keys else None,
                    bounded=bounded_chunks,
                )
                if planner.needs_max_key:
                    planner.begin(sources[0].max_key(table))
                    store.dumps.save_progress(dump_id, planner.progress)
                while not planner.done:
                    controls = _patiently(partial(store.dumps.controls, dump_id))
                    if stop is not None and stop.is_set():
                        return DumpState.RUNNING
                    if controls is None or controls.cancelled:
                        store.dumps.mark(dump_id, DumpState.CANCELLED)
                        return DumpState.CANCELLED
                    if controls.paused:
                        store.dumps.mark(dump_id, DumpState.PAUSED)
                        (stop or threading.Event()).wait(PAUSE_POLL_S)
                        continue
                    _patiently(partial(store.dumps.mark, dump_id, DumpState.RUNNING))
                    planner.chunk_size = controls.chunk_size
                    chunks = _plan(planner, sources[0], parallelism)
                    started = time.monotonic()
                    runs = [
                        pool.submit(
                            _run_with_retries,
                            store,
                            source,
                            dump_id,
                            chunk,
                            key_columns,
                            window_timeout_s,
                            max_attempts,
                            read,
                        )
                        for chunk, source in zip(chunks, sources, strict=False)
                    ]
                    outcomes = [run.result() for run in runs]
                    rows = 0
                    for chunk, outcome in zip(chunks, outcomes, strict=True):
                        planner.complete(chunk, outcome.rows, outcome.last_key)
                        rows += outcome.rows
                    _patiently(partial(store.dumps.save_progress, dump_id, planner.progress))
                    _patiently(partial(store.dumps.count, dump_id, chunks=len(chunks), rows=rows))
                    if on_progress is not None:
                        on_progress(dump_id, planner.progress)
                    _throttle(controls, rows, time.monotonic() - started, stop)
        store.dumps.mark(dump_id, DumpState.DONE)
        return DumpState.DONE
    except DumpFailed as exc:
        store.dumps.mark(dump_id, DumpState.FAILED, reason=str(exc))
        raise
    except Exception as exc:
        # Whatever stopped the dump is its reason: nobody waits on a "running" dump forever.
        try:
            store.dumps.mark(dump_id, DumpState.FAILED, reason=f"{type(exc).__name__}: {exc}")
        except StateStoreUnavailable:
            log.warning("could not mark dump %s failed: the state store is away", dump_id)
        raise
    finally:
        for source in sources:
            source.close()


@contextmanager
def _beating(store: StateStore, dump_id: str) -> Iterator[None]:
    """Beat for the dump while it runs, from a thread, so a long chunk still beats."""
    owner = f"{socket.gethostname()}:{os.getpid()}"
    done = threading.Event()

    def beat() -> None:
        while not done.is_set():
            try:
                store.dumps.beat(dump_id, owner, DRIVER_TTL_MS)
            except StateStoreUnavailable as exc:
                log.warning("could not beat for dump %s: %s", dump_id, exc)
            done.wait(DRIVER_TTL_MS / 5000)

    thread = threading.Thread(target=beat, name="dblog-dump-beat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def _patiently(call: Callable[[], T]) -> T:
    """A store call between chunks rides out a Redis restart instead of ending the dump."""
    delay, deadline = UNAVAILABLE_BACKOFF_S, time.monotonic() + STORE_PATIENCE_S
    while True:
        try:
            return call()
        except StateStoreUnavailable as exc:
            if time.monotonic() + delay > deadline:
                raise
            log.warning("state store unavailable (%s); retrying in %.2fs", exc, delay)
            time.sleep(delay)
            delay = min(delay * 2, 5.0)


def _plan(planner: TablePlanner, source: ChunkSource, parallelism: int) -> list[Chunk]:
    wanted = planner.split_keys_wanted(parallelism)
    splits = []
    if wanted:
        assert planner.progress.max_key is not None
        splits = source.split_keys(
            planner.table,
            planner.cursor_after,
            planner.progress.max_key,
            planner.chunk_size,
            wanted,
        )
    return planner.next_chunks(parallelism, splits)


def _run_with_retries(
    store: StateStore,
    source: ChunkSource,
    dump_id: str,
    chunk: Chunk,
    key_columns: tuple[str, ...],
    window_timeout_s: float,
    max_attempts: int,
    read: ChunkReader,
) -> ChunkOutcome:
    reasons = []
    for attempt in range(max_attempts):
        try:
            outcome = run_chunk(
                store,
                source,
                dump_id,
                chunk,
                key_columns,
                window_timeout_s=window_timeout_s,
                read=read,
            )
        except (StateStoreUnavailable, SourceUnavailable, UnknownWindow) as exc:
            # Redis or the source went away for a moment (a restart), or the window's keys
            # vanished (Redis lost them): the window is retried with new watermarks, like one
            # the tailer did not close.
            outcome = ChunkOutcome(False, 0, None, str(exc))
            time.sleep(min(UNAVAILABLE_BACKOFF_S * 2**attempt, 5.0))
        if outcome.completed:
            return outcome
        reasons.append(outcome.reason or "unknown")
        try:
            store.dumps.count(dump_id, windows_retried=1)
        except StateStoreUnavailable:
            log.warning("could not count a retried window of %s: the state store is away", dump_id)
        log.info("chunk %s of %s retried: %s", chunk.seq, chunk.table, outcome.reason)
    raise DumpFailed(
        f"chunk {chunk.seq} of {chunk.table} failed {max_attempts} times; last: {reasons[-1]}. "
        "Is the tailer running (dblog status)?"
    )


def _throttle(
    controls: DumpControls, rows: int, elapsed: float, stop: threading.Event | None
) -> None:
    pause = controls.delay_ms / 1000
    if controls.max_rows_per_s:
        pause = max(pause, rows / controls.max_rows_per_s - elapsed)
    if pause > 0:
        (stop or threading.Event()).wait(pause)
