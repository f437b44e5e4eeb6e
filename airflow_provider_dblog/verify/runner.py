"""A verify run: its tables one after another, each chunk by chunk (`chunk.py`), every chunk's
verdict saved with the table's progress past it (`state/verifies.py`), so a run that died
resumes from the chunk after the last one saved.

A range chunk reads up to `chunk_size` source rows after the last key verified; the target reads
the same key range (`chunk.py` says which), so a key the target has and the source has not is
met by the chunk whose range holds it, the last chunk's range running to the end of the table
(or of the range asked). A key list is verified `chunk_size` keys a chunk.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress

from airflow_provider_dblog.core.dump_plan import Chunk
from airflow_provider_dblog.core.errors import DBLogError
from airflow_provider_dblog.core.event import JsonValue, Key, TableRef, freeze
from airflow_provider_dblog.dump.runner import gone_from_this_host, process_name
from airflow_provider_dblog.sources.base import ChunkSource
from airflow_provider_dblog.state import StateStore, StateStoreUnavailable, VerifyState
from airflow_provider_dblog.verify.chunk import BeforeClose, VerifiedChunk, verify_chunk
from airflow_provider_dblog.verify.reader import TargetReader
from airflow_provider_dblog.verify.request import VerifyRequest

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 20
"""How often a chunk whose windows failed is read again before the run fails (a tailer that
stays away, a table altered again and again); the run resumes from there when asked."""


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
            f"verify {verify_id} is running in {runner}: wait for it to end, or give this run "
            "another --verify-id"
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


def run_verify(
    store: StateStore,
    source: ChunkSource,
    target: TargetReader,
    request: VerifyRequest,
    *,
    window_timeout_s: float = 60.0,
    on_chunk: Callable[[TableRef], None] = lambda table: None,
) -> VerifyState:
    """Verify every table of `request` not yet done, then mark the run done; failed (with the
    reason) when a chunk could not be read in `MAX_ATTEMPTS`."""
    verify_id = request.verify_id
    progress = store.verifies.progress(verify_id)
    try:
        for table in request.tables:
            saved = progress.get(table, {})
            if saved.get("done"):
                continue
            chunks: Iterable[tuple[Chunk, ProgressOf]] = (
                _key_chunks(request, table, saved)
                if request.keys is not None
                else _RangeChunks(request, table, saved)
            )
            for chunk, saved_after in chunks:
                verified = verify_with_retries(
                    store, source, target, request, chunk, window_timeout_s
                )
                store.verifies.chunk_done(verify_id, table, saved_after(verified), verified.verdict)
                on_chunk(table)
    except ChunkGaveUp as exc:
        store.verifies.finish(verify_id, VerifyState.FAILED, str(exc))
        return VerifyState.FAILED
    store.verifies.finish(verify_id, VerifyState.DONE)
    return VerifyState.DONE


ProgressOf = Callable[[VerifiedChunk], dict[str, JsonValue]]


class _RangeChunks:
    """The range chunks of a table, each starting where the last verified one ended."""

    def __init__(self, request: VerifyRequest, table: TableRef, saved: dict[str, JsonValue]):
        self._request, self._table = request, table
        after = saved["after"] if "after" in saved else _listed(request.after)
        self._after: Key | None = None if after is None else tuple(freeze(v) for v in after)
        self._done = False

    def __iter__(self) -> _RangeChunks:
        return self

    def __next__(self) -> tuple[Chunk, ProgressOf]:
        if self._done:
            raise StopIteration
        request = self._request
        chunk = Chunk(
            self._table,
            0,
            after=self._after,
            upto=request.upto,
            limit=request.chunk_size,
            where=request.where,
        )

        def saved(verified: VerifiedChunk) -> dict[str, JsonValue]:
            self._after = verified.next_after
            self._done = verified.next_after is None
            return {"after": _listed(verified.next_after), "done": self._done}

        return chunk, saved


def _key_chunks(
    request: VerifyRequest, table: TableRef, saved: dict[str, JsonValue]
) -> list[tuple[Chunk, ProgressOf]]:
    keys = request.keys or ()
    start = int(saved.get("key_index", 0))
    size = request.chunk_size
    chunks: list[tuple[Chunk, ProgressOf]] = []
    for index in range(start, len(keys), size):
        end = min(index + size, len(keys))
        progress = {"key_index": end, "done": end >= len(keys)}
        chunks.append((Chunk(table, index, keys=keys[index:end]), _fixed(progress)))
    return chunks


def _fixed(progress: dict[str, JsonValue]) -> ProgressOf:
    return lambda verified: dict(progress)


def verify_with_retries(
    store: StateStore,
    source: ChunkSource,
    target: TargetReader,
    request: VerifyRequest,
    chunk: Chunk,
    window_timeout_s: float,
    before_close: BeforeClose | None = None,
) -> VerifiedChunk:
    """The chunk verified, read again with new windows while its windows fail (`before_close`:
    see `verify_chunk`); `ChunkGaveUp` after `MAX_ATTEMPTS`."""
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
        )
        if isinstance(outcome, VerifiedChunk):
            return outcome
        reason = outcome.reason or "its window failed"
        log.info(
            "verify %s: a chunk of %s is read again: %s", request.verify_id, chunk.table, reason
        )
        store.verifies.retried(request.verify_id)
    raise ChunkGaveUp(f"a chunk of {chunk.table} failed {MAX_ATTEMPTS} times, last: {reason}")


def _listed(key: Key | None) -> JsonValue:
    return None if key is None else list(key)
