"""A verify run: its tables one after another, each in chunks verified up to `parallelism` at a
time, each chunk its own windows (`chunk.py`) on a slot of its own (a source and a target
reader), the controls obeyed between chunks as a dump obeys them (`dump/runner.run_table`):
pause, cancel, chunk size, delay and rows/s, the dump's controls (`state/verifies.py`).

Each slot of `dblog verify` of the SQL target keeps `LANES` chunks in flight on its connections:
while one waits for the tailer (its watermarks, the target applying the log through its hw), the
others read (`Slot.lanes`); `ROWS_LANES` of them at most read rows, the others sums.

A table's chunks are planned as a dump's, with split keys (`TablePlanner`, bounded): key ranges
`after < key <= split` that both sides read, the last one running to the end of the range asked
(or of the table), so a key the target has and the source has not is met by the chunk whose
range holds it, a key inserted since the run started included. A key list is verified
`chunk_size` keys a chunk.

Counts stay exact when a run dies: a chunk's verdict is saved with its table's progress past it
(`VerifyStore.chunk_done`), and progress moves only past chunks that ended in order (the
planner's), so the verdict of a chunk that ended before one planned earlier is held until that
one ended. A run that died resumes from its saved progress: it verifies again, and counts once,
the chunks whose verdicts it had not saved, and no other.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager, suppress
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, cast

from airflow_provider_dblog.core.dump_plan import Chunk, TablePlanner, TableProgress
from airflow_provider_dblog.core.errors import DBLogError
from airflow_provider_dblog.core.event import JsonValue, Key, TableRef
from airflow_provider_dblog.core.verify import ChunkVerdict
from airflow_provider_dblog.dump.runner import (
    PAUSE_POLL_S,
    ChunkSlots,
    gone_from_this_host,
    pace,
    plan_chunks,
    process_name,
)
from airflow_provider_dblog.sources.base import ChunkSource
from airflow_provider_dblog.state import StateStore, StateStoreUnavailable, VerifyState
from airflow_provider_dblog.verify.chunk import (
    IN_PROCESS,
    NO_GATE,
    BeforeClose,
    ChunkHasher,
    verify_chunk,
)
from airflow_provider_dblog.verify.reader import RowsTarget, TargetReader
from airflow_provider_dblog.verify.request import VerifyRequest

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 20
"""How often a chunk whose windows failed is read again before the run fails (a tailer that
stays away, a table altered again and again); the run resumes from there when asked."""


LANES = 4
"""Chunks in flight on one slot of an in-process verify of a `RowsTarget` (the SQL target, whose
reader answers each call on its own; the lake's remembers what it waits for between calls): a
chunk waits on the tailer more than on either database (its four watermarks, then the target
applying the log through its hw: the tailer checkpoints every `checkpoint_s`), and the other
chunks' reads fit in those waits."""
ROWS_LANES = 2
"""Of a slot's chunks in flight, how many read rows at once (`verify_chunk`'s `rows_gate`): each
holds both sides' rows of its chunk, where a sum holds none."""


class ChunkGaveUp(Exception):
    """A chunk failed `MAX_ATTEMPTS` times."""


RUNNER_TTL_MS = 15_000
"""A run whose process has not renewed its claim for this long may be run by another."""


class RunInProgress(DBLogError):
    """Another live process runs this verify run."""


@contextmanager
def running(store: StateStore, verify_id: str) -> Iterator[Callable[[], None]]:
    """Run the verify as this process alone: claimed in the store, the claim renewed from a
    thread while the body runs (a chunk may wait long for the tailer) and released after.
    `RunInProgress` when another live process runs it; a process of this host that died (its
    claim outlives it by up to `RUNNER_TTL_MS`) is taken over at once. The body gets a check to
    call between chunks: `RunInProgress` once another process took the run over (this one
    could not renew its claim in time)."""
    owner = process_name()
    runner = store.verifies.claim(verify_id, owner, RUNNER_TTL_MS)
    if runner is not None and gone_from_this_host(runner):
        runner = store.verifies.claim(verify_id, owner, RUNNER_TTL_MS, gone=runner)
    if runner is not None:
        raise RunInProgress(
            f"verify {verify_id} is running in {runner}: act on it with dblog verify-pause|"
            f"verify-resume|verify-cancel|verify-throttle {verify_id}, or give this run another "
            "--verify-id"
        )
    done = threading.Event()
    taken_by: list[str] = []

    def renew() -> None:
        while not taken_by and not done.wait(RUNNER_TTL_MS / 5000):
            try:
                other = store.verifies.claim(verify_id, owner, RUNNER_TTL_MS)
            except StateStoreUnavailable as exc:  # the run's own calls to Redis say so
                log.debug("could not renew verify %s: %s", verify_id, exc)
            else:
                taken_by.extend([other] if other is not None else [])

    def still_ours() -> None:
        if taken_by:
            raise RunInProgress(f"verify {verify_id} was taken over by {taken_by[0]}")

    thread = threading.Thread(target=renew, name="dblog-verify-runner", daemon=True)
    thread.start()
    try:
        yield still_ours
    finally:
        done.set()
        thread.join()
        with suppress(StateStoreUnavailable):  # then the claim expires after its TTL
            store.verifies.release(verify_id, owner)


@dataclass(frozen=True)
class Slot:
    """What one chunk in flight reads with: a source and a target reader of its own."""

    source: ChunkSource
    target: TargetReader
    rows_gate: AbstractContextManager[object] = NO_GATE
    """Entered around a chunk's read of rows: the lanes' share of `ROWS_LANES`."""

    def lanes(self, count: int) -> list[Slot]:
        """`count` slots on this one's connections, for as many chunks in flight: each of its
        calls on the source, or on the target, waits for the other lanes' to end, so each
        database still sees one call at a time from the slot, and `ROWS_LANES` of them at
        most read rows at once. Closed by closing this one."""
        if count == 1:
            return [self]
        source = cast(ChunkSource, _InTurn(self.source, threading.Lock()))
        target = cast(TargetReader, _InTurn(self.target, threading.Lock()))
        gate = threading.BoundedSemaphore(ROWS_LANES) if count > ROWS_LANES else NO_GATE
        return [Slot(source, target, gate)] * count

    def close(self) -> None:
        try:
            self.target.close()
        finally:
            self.source.close()


class _InTurn:
    """An object whose methods are called one at a time, under `turn`."""

    def __init__(self, inner: object, turn: threading.Lock) -> None:
        self._inner = inner
        self._turn = turn

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._inner, name)
        if not callable(value):
            return value
        turn = self._turn

        def in_turn(*args: Any, **kwargs: Any) -> Any:
            with turn:
                return value(*args, **kwargs)

        return in_turn


def run_verify(
    store: StateStore,
    open_slot: Callable[[], Slot],
    request: VerifyRequest,
    *,
    window_timeout_s: float = 60.0,
    between_chunks: Callable[[], None] = lambda: None,
    hasher: ChunkHasher = IN_PROCESS,
) -> VerifyState:
    """Verify every table of `request` not yet done on `parallelism` slots (`open_slot`,
    closed after; `LANES` chunks in flight on each when `hasher` reads a `RowsTarget` in
    process), then mark the run done; cancelled when its controls say so, failed (with the
    reason) when a chunk could not be read in `MAX_ATTEMPTS`. `between_chunks` is called
    between chunks (it may raise to end the run). Each chunk's sides are read by `hasher`: in
    this process, or by Spark tasks (`spark_run.py`)."""
    verify_id = request.verify_id
    progress = store.verifies.progress(verify_id)
    slots: list[Slot] = []
    try:
        for _ in range(request.parallelism):
            slots.append(open_slot())
        attempt = partial(_attempt, store, request, window_timeout_s, hasher)
        lanes = [
            lane
            for slot in slots
            for lane in slot.lanes(
                LANES if hasher is IN_PROCESS and isinstance(slot.target, RowsTarget) else 1
            )
        ]
        with ThreadPoolExecutor(len(lanes), thread_name_prefix="dblog-verify") as pool:
            chunk_slots = ChunkSlots(pool, lanes, attempt)
            for table in request.tables:
                planner = _planner(request, table, progress.get(table))
                if planner.needs_max_key and not _begun(store, request, planner, slots[0], attempt):
                    continue
                ended = _verify_table(store, request, planner, chunk_slots, between_chunks)
                if ended is not None:
                    store.verifies.finish(verify_id, ended)
                    return ended
    except ChunkGaveUp as exc:
        store.verifies.finish(verify_id, VerifyState.FAILED, str(exc))
        return VerifyState.FAILED
    finally:
        for slot in slots:
            slot.close()
    store.verifies.finish(verify_id, VerifyState.DONE)
    return VerifyState.DONE


def _planner(
    request: VerifyRequest, table: TableRef, saved: Mapping[str, JsonValue] | None
) -> TablePlanner:
    """The dump's planner of the table's chunks, from where its verify stands."""
    progress = (
        TableProgress.from_json(dict(saved))
        if saved is not None
        else TableProgress(table, after=request.after)
    )
    return TablePlanner(
        progress, request.chunk_size, request.keys, bounded=True, where=request.where
    )


Attempt = Callable[[Chunk, Slot], ChunkVerdict]


def _begun(
    store: StateStore, request: VerifyRequest, planner: TablePlanner, slot: Slot, attempt: Attempt
) -> bool:
    """Start the table's key range at its end (the range's, or the table's maximum key now);
    False when the source table is empty and so verified already, in one chunk over the whole
    range (what the target holds there is extra)."""
    table = planner.table
    end = request.upto if request.upto is not None else slot.source.max_key(table)
    planner.begin(end)
    if end is not None:
        return True
    verdict = attempt(Chunk(table, 0, after=request.after, where=request.where), slot)
    store.verifies.chunk_done(request.verify_id, table, planner.progress.to_json(), verdict)
    return False


def _verify_table(
    store: StateStore,
    request: VerifyRequest,
    planner: TablePlanner,
    slots: ChunkSlots[Slot, ChunkVerdict],
    between_chunks: Callable[[], None],
) -> VerifyState | None:
    """Verify one table, chunks kept in flight in every slot; None once it is done, else
    `CANCELLED`. Between chunks the controls are obeyed as a dump obeys them: a pause or a
    cancel starts no new chunk and lets those in flight end (their verdicts count)."""
    verify_id = request.verify_id
    in_order = VerdictsInOrder()
    cancelled = False
    last_ended = time.monotonic()
    while not planner.done or slots.busy:
        controls = None
        if not cancelled:
            between_chunks()
            controls = store.verifies.controls(verify_id)
            cancelled = controls is not None and controls.cancelled
        if cancelled:
            if not slots.busy:
                break
        elif controls is not None and controls.paused:
            if not slots.busy:
                store.verifies.mark(verify_id, VerifyState.PAUSED)
                time.sleep(PAUSE_POLL_S)
                continue
        else:
            slot = slots.free_source
            if slot is not None and not planner.done:
                store.verifies.mark(verify_id, VerifyState.RUNNING)
                if controls is not None:
                    planner.chunk_size = controls.chunk_size
                for chunk in plan_chunks(planner, slot.source, slots.size):
                    in_order.started(chunk.seq)
                    slots.start(to_range_end(chunk, planner.progress.max_key, request.upto))
        if not slots.busy:
            continue
        for chunk, verdict in slots.ended():
            planner.complete(chunk, verdict.checked + verdict.in_flux, None)
            verdicts = in_order.ended(chunk.seq, verdict)
            if verdicts:
                progress = planner.progress.to_json()
                store.verifies.chunk_done(verify_id, planner.table, progress, *verdicts)
            if controls is not None and not cancelled:
                pace(
                    controls, verdict.checked + verdict.in_flux, time.monotonic() - last_ended, None
                )
            last_ended = time.monotonic()
    return VerifyState.CANCELLED if cancelled else None


def to_range_end(chunk: Chunk, end: Key | None, upto: Key | None) -> Chunk:
    """The chunk as both sides read it: the last range chunk, the one the planner ends at the
    table's maximum key when the run started (`end`), reads to the end of the range asked
    (`upto`, or the table's end), so that a key above `end` on either side is verified too."""
    if chunk.keys is None and chunk.upto == end:
        return replace(chunk, upto=upto)
    return chunk


class VerdictsInOrder:
    """The verdicts of a table's chunks, each given back once every chunk started before it
    ended: in the order the planner moves the table's progress past them (only past chunks
    that ended in order), so they are saved with that progress and counted once."""

    def __init__(self) -> None:
        self._flying: set[int] = set()
        self._held: dict[int, ChunkVerdict] = {}

    def started(self, seq: int) -> None:
        self._flying.add(seq)

    def ended(self, seq: int, verdict: ChunkVerdict) -> list[ChunkVerdict]:
        """The verdicts to save now, this chunk's among them unless one started before it
        is still in flight."""
        self._flying.remove(seq)
        self._held[seq] = verdict
        first_flying = min(self._flying, default=None)
        ready = sorted(s for s in self._held if first_flying is None or s < first_flying)
        return [self._held.pop(s) for s in ready]


def _attempt(
    store: StateStore,
    request: VerifyRequest,
    window_timeout_s: float,
    hasher: ChunkHasher,
    chunk: Chunk,
    slot: Slot,
) -> ChunkVerdict:
    return verify_with_retries(
        store,
        slot.source,
        slot.target,
        request,
        chunk,
        window_timeout_s,
        hasher=hasher,
        rows_gate=slot.rows_gate,
    )


def verify_with_retries(
    store: StateStore,
    source: ChunkSource,
    target: TargetReader,
    request: VerifyRequest,
    chunk: Chunk,
    window_timeout_s: float,
    before_close: BeforeClose | None = None,
    hasher: ChunkHasher = IN_PROCESS,
    rows_gate: AbstractContextManager[object] = NO_GATE,
) -> ChunkVerdict:
    """The chunk verified, read again with new windows while its windows fail (`before_close`,
    `hasher`, `rows_gate`: see `verify_chunk`); `ChunkGaveUp` after `MAX_ATTEMPTS`."""
    reason = ""
    for _ in range(MAX_ATTEMPTS):
        outcome = verify_chunk(
            store,
            source,
            target,
            request.verify_id,
            chunk,
            request.key_columns[chunk.table],
            window_timeout_s=window_timeout_s,
            before_close=before_close,
            hasher=hasher,
            rows_gate=rows_gate,
        )
        if isinstance(outcome, ChunkVerdict):
            return outcome
        reason = outcome.reason or "its window failed"
        log.info(
            "verify %s: a chunk of %s is read again: %s", request.verify_id, chunk.table, reason
        )
        store.verifies.retried(request.verify_id)
    raise ChunkGaveUp(f"a chunk of {chunk.table} failed {MAX_ATTEMPTS} times, last: {reason}")
