"""Runs one stored dump request to the end: chunk after chunk, obeying its controls.

Up to `parallelism` chunks are in flight, each on a source of its own; a chunk that ends frees
its slot for the next at once (`ChunkSlots`), so a slow chunk (its window waiting for the tailer,
its Spark job starting) holds no other back. Progress is saved after each chunk, but only past
the chunks that ended in order, so a dump killed at any moment resumes from its last completed
chunk when run again. A source or Redis restart is ridden through: the chunk it broke
is retried with new watermarks, and the calls between chunks wait, for up to
`source_patience_s` (see `retry.py`); a chunk whose read replica is behind pauses, saying so in
the dump's status, until the replica catches up or the dump is cancelled or stopped. Between
chunks it reads the controls in Redis (pause, resume, cancel, chunk size, delay, rows/s), so
they can be changed while it runs. Used by `dblog dump` (chunks read in this process) and by
the Spark application (`spark_run.run_spark_dump`: the same loop, each chunk read by Spark
tasks through another `ChunkReader`).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from functools import partial
from typing import Generic, TypeVar

from airflow_provider_dblog.core.direct import DumpMode
from airflow_provider_dblog.core.dump_plan import Chunk, TablePlanner, TableProgress
from airflow_provider_dblog.core.errors import DBLogError
from airflow_provider_dblog.core.event import TableRef
from airflow_provider_dblog.dump.chunk import (
    ChunkOutcome,
    ChunkReader,
    ChunkReadFailed,
    read_in_process,
    run_chunk,
)
from airflow_provider_dblog.dump.direct import DirectChunkReader, run_direct_chunk
from airflow_provider_dblog.dump.retry import SOURCE_PATIENCE_S, ChunkRetries, Patience
from airflow_provider_dblog.sources.base import (
    ChunkSource,
    OpenChunkSource,
    ReplicaBehind,
    SourceUnavailable,
)
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
STORE_PATIENCE_S = 60.0
DRIVER_TTL_MS = 15_000
"""A dump whose process has not beaten for this long is taken for dead (see `beat_dump`)."""
T = TypeVar("T")
S = TypeVar("S")


class DumpFailed(DBLogError):
    pass


class ChunkLeft(DBLogError):
    """A chunk left unread: the dump was cancelled or stopped while the chunk waited for its read
    replica. Its progress is not saved, so a resumed dump reads it."""


def run_dump(
    store: StateStore,
    open_source: OpenChunkSource,
    dump_id: str,
    *,
    window_timeout_s: float = 60.0,
    max_attempts: int = 5,
    source_patience_s: float = SOURCE_PATIENCE_S,
    on_progress: ProgressCallback | None = None,
    stop: threading.Event | None = None,
    read: ChunkReader = read_in_process,
    direct: DirectChunkReader | None = None,
    bounded_chunks: bool = False,
) -> DumpState:
    """Run the dump until done, cancelled or failed; returns the final status. `read` reads
    each chunk of a sequenced dump into Redis, `direct` each chunk of a direct dump (which
    needs one) and writes its rows into the target; `bounded_chunks` plans range chunks with
    an upper bound always (see `TablePlanner.bounded`), as a reader that splits a chunk
    needs. A chunk is tried `max_attempts` times when its window fails, and for up to
    `source_patience_s` while the source or Redis is away. A read-only request's sources are
    opened read-only, so a resume of it writes nothing either."""
    stored = store.dumps.get(dump_id)
    if stored is None:
        raise DumpFailed(f"no dump request {dump_id!r} in the store")
    request = stored.request
    if request.mode is DumpMode.DIRECT and direct is None:
        raise DumpFailed(f"dump {dump_id} is direct: it needs a direct target to write into")
    progress = store.dumps.load_progress(dump_id)
    parallelism = request.parallelism
    if not store.dumps.mark(dump_id, DumpState.RUNNING):
        # Finished already (cancelled before it started, or ended by another run).
        status = store.dumps.status(dump_id)
        assert status is not None
        log.info("dump %s is %s: nothing to run", dump_id, status.state)
        return status.state
    sources = [open_source(read_only=request.read_only) for _ in range(parallelism)]
    try:
        store.check_server()  # a Redis that evicts keys would lose windows and progress
        with (
            _beating(store, dump_id),
            ThreadPoolExecutor(parallelism, thread_name_prefix="dblog-chunk") as pool,
        ):
            for table in request.tables:
                key_columns = patiently(partial(sources[0].key_columns, table), source_patience_s)
                planner = TablePlanner(
                    progress.get(table) or TableProgress(table),
                    request.chunk_size,
                    request.keys if request.keys else None,
                    bounded=bounded_chunks,
                    where=request.where,
                )
                progress[table] = planner.progress
                if planner.needs_max_key:
                    planner.begin(patiently(partial(sources[0].max_key, table), source_patience_s))
                    patiently(partial(store.dumps.save_progress, dump_id, planner.progress))

                attempt = _ChunkAttempt(
                    store,
                    dump_id,
                    key_columns,
                    window_timeout_s,
                    max_attempts,
                    source_patience_s,
                    read,
                    direct,
                    stop,
                )
                ended = run_table(
                    store,
                    dump_id,
                    planner,
                    ChunkSlots(pool, sources, attempt),
                    source_patience_s,
                    on_progress,
                    stop,
                )
                if ended is not None:
                    return ended
                if direct is not None:
                    _prune_tombstones(store, direct, table)
        # Redis may have lost a table's last saves (a failover): saved again, its progress
        # and the counters it sums into are right again (`DumpStore.save_progress`).
        for table_progress in progress.values():
            patiently(partial(store.dumps.save_progress, dump_id, table_progress))
        patiently(partial(store.dumps.mark, dump_id, DumpState.DONE))
        return DumpState.DONE
    except Exception as exc:
        # Whatever stopped the dump is its reason: nobody waits on a "running" dump forever.
        reason = str(exc) if isinstance(exc, DumpFailed) else f"{type(exc).__name__}: {exc}"
        try:
            store.dumps.mark(dump_id, DumpState.FAILED, reason=reason)
        except StateStoreUnavailable:
            log.warning("could not mark dump %s failed: the state store is away", dump_id)
        raise
    finally:
        for source in sources:
            source.close()


@dataclass(frozen=True)
class _ChunkAttempt:
    """Reads one chunk to its end on a source: windows retried with new watermarks
    (`retry_chunk`), sequenced through Redis or direct into the target."""

    store: StateStore
    dump_id: str
    key_columns: tuple[str, ...]
    window_timeout_s: float
    max_attempts: int
    source_patience_s: float
    read: ChunkReader
    direct: DirectChunkReader | None
    stop: threading.Event | None

    def __call__(self, chunk: Chunk, source: ChunkSource) -> ChunkOutcome:
        args = (self.store, source, self.dump_id, chunk, self.key_columns)
        what = f"chunk {chunk.seq} of {chunk.table}"
        timeout = self.window_timeout_s
        run = (
            partial(run_chunk, *args, window_timeout_s=timeout, read=self.read)
            if self.direct is None
            else partial(run_direct_chunk, *args, window_timeout_s=timeout, read=self.direct)
        )
        return retry_chunk(
            run,
            ChunkRetries(self.max_attempts, Patience(self.source_patience_s, label=what)),
            what,
            on_retry=partial(_count_retry, self.store, self.dump_id),
            on_pause=partial(_note_pause, self.store, self.dump_id),
            ending=self._ending,
        )

    def _ending(self) -> bool:
        """Whether the dump is ending (stopped, cancelled): a paused chunk then stops waiting."""
        if self.stop is not None and self.stop.is_set():
            return True
        try:
            controls = self.store.dumps.controls(self.dump_id)
        except StateStoreUnavailable:
            return False
        return controls is None or controls.cancelled


class ChunkSlots(Generic[S, T]):
    """Up to one chunk in flight per source, each in a pool thread on its own source: a slot
    freed by a chunk that ended takes the next one at once, rather than when the slowest chunk
    of a round ends (its tailer's emission, its Spark job's start overlap the others' reads).
    A verify run's slots are a source and a target reader each (`verify/runner.py`)."""

    def __init__(
        self,
        pool: ThreadPoolExecutor,
        sources: list[S],
        attempt: Callable[[Chunk, S], T],
    ) -> None:
        self._pool = pool
        self.size = len(sources)
        self._free = list(sources)
        self._attempt = attempt
        self._running: dict[Future[T], tuple[Chunk, S]] = {}

    @property
    def busy(self) -> bool:
        return bool(self._running)

    @property
    def free_source(self) -> S | None:
        """A source no chunk is reading with, to plan on; None when every slot is taken."""
        return self._free[0] if self._free else None

    def start(self, chunk: Chunk) -> None:
        source = self._free.pop()
        future = self._pool.submit(self._attempt, chunk, source)
        self._running[future] = (chunk, source)

    def ended(self) -> list[tuple[Chunk, T]]:
        """Wait for at least one chunk to end; each ended chunk and its outcome, in the order
        they were started. A chunk that failed for good raises here."""
        done, _ = wait(self._running, return_when=FIRST_COMPLETED)
        ended = []
        for future in sorted(done, key=lambda f: self._running[f][0].seq):
            chunk, source = self._running.pop(future)
            self._free.append(source)
            try:
                ended.append((chunk, future.result()))
            except ChunkLeft as exc:
                log.info("%s", exc)  # the dump is ending: the chunk is read when it resumes
        return ended


def run_table(
    store: StateStore,
    dump_id: str,
    planner: TablePlanner,
    slots: ChunkSlots[ChunkSource, ChunkOutcome],
    source_patience_s: float,
    on_progress: ProgressCallback | None,
    stop: threading.Event | None,
) -> DumpState | None:
    """Dump one table, chunks kept in flight in every slot; None once it is done, else the
    state the dump ended in (cancelled, or running when `stop` is set). Between chunks the
    controls are obeyed: a pause, a cancel or a stop starts no new chunk and lets those in
    flight end (their rows count); the progress saved is the planner's, which moves only
    past chunks that ended in order, so a dump killed at any moment resumes from there."""
    ending: DumpState | None = None
    controls: DumpControls | None = None
    last_ended = time.monotonic()
    while not planner.done or slots.busy:
        if ending is None:
            controls = patiently(partial(store.dumps.controls, dump_id))
            if stop is not None and stop.is_set():
                ending = DumpState.RUNNING
            elif controls is None or controls.cancelled:
                ending = DumpState.CANCELLED
        if ending is not None or controls is None:
            if not slots.busy:
                break
        elif controls.paused:
            if not slots.busy:
                patiently(partial(store.dumps.mark, dump_id, DumpState.PAUSED))
                (stop or threading.Event()).wait(PAUSE_POLL_S)
                continue
        else:
            source = slots.free_source
            if source is not None and not planner.done:
                patiently(partial(store.dumps.mark, dump_id, DumpState.RUNNING))
                planner.chunk_size = controls.chunk_size
                for chunk in patiently(
                    partial(plan_chunks, planner, source, slots.size), source_patience_s
                ):
                    slots.start(chunk)
        if not slots.busy:
            continue
        for chunk, outcome in slots.ended():
            planner.complete(chunk, outcome.rows, outcome.last_key)
            planner.progress.rows_written += outcome.written
            patiently(partial(store.dumps.chunk_done, dump_id, planner.progress))
            if on_progress is not None:
                on_progress(dump_id, planner.progress)
            if controls is not None and ending is None:
                # Each chunk's rows take at least their share of time since the one before.
                pace(controls, outcome.rows, time.monotonic() - last_ended, stop)
            last_ended = time.monotonic()
    if ending is DumpState.CANCELLED:
        patiently(partial(store.dumps.mark, dump_id, DumpState.CANCELLED))
    return ending


@contextmanager
def _beating(store: StateStore, dump_id: str) -> Iterator[None]:
    """Beat for the dump while it runs, from a thread, so a long chunk still beats."""
    owner = process_name()
    done = threading.Event()

    def beat() -> None:
        while not done.is_set():
            try:
                store.dumps.beat(dump_id, owner, DRIVER_TTL_MS)
            except StateStoreUnavailable as exc:  # the dump's own calls to Redis say so
                log.debug("could not beat for dump %s: %s", dump_id, exc)
            done.wait(DRIVER_TTL_MS / 5000)

    thread = threading.Thread(target=beat, name="dblog-dump-beat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        with suppress(StateStoreUnavailable):  # then the beat expires after its TTL
            store.dumps.unbeat(dump_id, owner)


def process_name() -> str:
    """This process as a run's driver names it: `host:pid`."""
    return f"{socket.gethostname()}:{os.getpid()}"


def gone_from_this_host(driver: str) -> bool:
    """Whether `driver` (a `process_name`) is a process of this host that no longer runs: one
    killed a moment ago, whose beat outlives it by up to its TTL."""
    host, _, pid = driver.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        return False
    return False


def patiently(call: Callable[[], T], patience_s: float = STORE_PATIENCE_S) -> T:
    """A call between chunks (or a Spark driver's first) rides out a restart of Redis or the
    source instead of ending the dump; after `patience_s` of it the dump fails, saying what was
    away."""
    patience = Patience(patience_s)
    while True:
        try:
            result = call()
        except (StateStoreUnavailable, SourceUnavailable) as exc:
            delay = patience.away(exc)
            if delay is None:
                raise DumpFailed(patience.verdict()) from exc
            time.sleep(delay)
        else:
            patience.back()
            return result


def _prune_tombstones(store: StateStore, direct: DirectChunkReader, table: TableRef) -> None:
    """A direct dump that finished a table prunes the target's tombstones no older row can
    reach any more; a failure to prune (a store or target away) only delays it."""
    try:
        horizon = store.directs.horizon()
        if horizon is not None:
            pruned = direct.prune_tombstones(table, horizon)
            log.info("pruned %d tombstones of %s before %s", pruned, table, horizon)
    except (StateStoreUnavailable, DBLogError) as exc:
        log.warning("could not prune the tombstones of %s: %s", table, exc)


def plan_chunks(planner: TablePlanner, source: ChunkSource, parallelism: int) -> list[Chunk]:
    """The planner's next chunks, with the split keys it wants read from `source`."""
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


def retry_chunk(
    attempt: Callable[[], ChunkOutcome],
    retries: ChunkRetries,
    what: str,
    *,
    on_retry: Callable[[str], None],
    on_pause: Callable[[str], None],
    ending: Callable[[], bool],
    sleep: Callable[[float], None] = time.sleep,
) -> ChunkOutcome:
    """Run `attempt` (one window: `run_chunk`) until its chunk completes; each retry is a new
    window with new watermarks, announced to `on_retry` after its backoff. Raises DumpFailed
    once `retries` is spent, naming `what` (the chunk) and why. While the read replica is
    behind, the chunk pauses, announced to `on_pause`, for as long as it takes, unless
    `ending()` says the dump is ending: then it raises `ChunkLeft`."""
    while True:
        try:
            outcome = attempt()
        except ReplicaBehind as exc:
            if ending():
                raise ChunkLeft(f"{what} left unread, the dump ending: {exc}") from exc
            pause = retries.replica_behind()
            log.warning("%s paused: %s; trying again in %.2fs", what, exc, pause)
            on_pause(str(exc))
            sleep(pause)
            continue
        except (SourceUnavailable, StateStoreUnavailable) as exc:
            # The source or Redis went away (a restart, a failover): wait for it, within the
            # patience, without spending the window attempts.
            delay = retries.patience.away(exc)
            if delay is None:
                raise DumpFailed(f"{what}: {retries.patience.verdict()}") from exc
            sleep(delay)
            on_retry(str(exc))
            continue
        except (UnknownWindow, ChunkReadFailed) as exc:
            # The window's keys vanished (Redis lost them) or the reader failed (a Spark job):
            # a failed window, retried with new watermarks.
            outcome = ChunkOutcome(False, 0, None, str(exc))
        retries.patience.back()  # the servers answered
        if outcome.completed:
            return outcome
        reason = outcome.reason or "unknown"
        if not retries.window_failed(reason):
            raise DumpFailed(
                f"{what} failed {retries.max_attempts} times; last: {reason}. "
                "Is the tailer running (dblog status)?"
            )
        on_retry(reason)
        log.info("%s retried: %s", what, reason)
        sleep(retries.window_backoff())


def _count_retry(store: StateStore, dump_id: str, reason: str) -> None:
    """Count a retried window and say why in the dump's status while it waits."""
    try:
        store.dumps.count(dump_id, windows_retried=1)
        store.dumps.note(dump_id, f"retrying a chunk: {reason}")
    except StateStoreUnavailable:
        log.warning("could not count a retried window of %s: the state store is away", dump_id)


def _note_pause(store: StateStore, dump_id: str, reason: str) -> None:
    """Say in the dump's status that a chunk waits for the read replica (not a retried window)."""
    try:
        store.dumps.note(dump_id, f"paused until the read replica catches up: {reason}")
    except StateStoreUnavailable:
        log.warning("could not note the pause of %s: the state store is away", dump_id)


def pace(controls: DumpControls, rows: int, elapsed: float, stop: threading.Event | None) -> None:
    """Wait out the throttle after a chunk of `rows` rows that ended `elapsed` seconds after
    the one before: its delay, and at least the rows' share of the rate limit."""
    pause = controls.delay_ms / 1000
    if controls.max_rows_per_s:
        pause = max(pause, rows / controls.max_rows_per_s - elapsed)
    if pause > 0:
        (stop or threading.Event()).wait(pause)
