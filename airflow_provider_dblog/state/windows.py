"""Watermark windows and their chunk rows: where the dump and the tailer meet.

The dump registers a window before it writes lw and stores the chunk rows before it writes hw;
the tailer looks watermark values up, moves the window's state and reads the rows at hw.

A window's life (every move is one Lua script, so two racing processes see one winner):

    registered --lw (tailer)--> open --hw (tailer)--> closing --output durable (tailer)--> closed
    registered/open --dump timed out--> abandoned      registered/open/closing --tailer--> failed

`closing` is the tailer's claim at hw, taken before it emits any chunk row: once the tailer holds
it, the dump cannot abandon the window, and once the dump abandoned it, the tailer's claim fails
and it emits nothing. So an abandoned window's rows are never emitted, and `closed` still means
what the dump needs to move its progress: the chunk's events are durable in the output.

Every key of a window (`window:<id>*`, `wm:<value>`) expires with the TTL given when it was
registered, so Redis does not grow with the windows of old dumps; the rows, the bulk of it, are
deleted as soon as the window ends.

Durability (see the package's docstring for what a crash of Redis loses):

- window registration lost: the tailer meets a watermark value it does not know and ignores it;
  the dump's wait times out, the abandon finds nothing, and the chunk is retried.
- window transition lost (open, closed, failed): at worst the window is back in an earlier state.
  The tailer's next transition is refused, it drops the window, and the dump times out and
  retries the chunk. If the close was lost after the output took the rows, the retried chunk
  emits them again: the output is at-least-once and consumers drop duplicates by position.
- chunk rows lost: the tailer finds none at hw and fails the window; the chunk is retried.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

import redis
from redis.typing import EncodableT, FieldT

from airflow_provider_dblog.core.direct import DumpMode
from airflow_provider_dblog.core.encoded_rows import EncodedRows, encode_rows, row_columns
from airflow_provider_dblog.core.errors import InvalidRequest
from airflow_provider_dblog.core.event import JsonValue, Row, TableRef
from airflow_provider_dblog.core.reconciler import ChunkRows, Window
from airflow_provider_dblog.state.base import (
    FENCE,
    NOW_MS,
    RedisStore,
    compact_json,
    decode_hash,
    reachable,
    text,
    ttl_ms,
)
from airflow_provider_dblog.state.errors import (
    AlreadyExists,
    FencedOut,
    MissingRows,
    UnknownWindow,
)

Mark = Literal["lw", "hw"]

_PAGE_ROWS = 1000
"""Rows per page of a chunk at most: a page is two list elements (keys, values), so 50k small
rows are 100 RPUSH arguments."""
_PAGE_BYTES = 1 << 20
"""A page ends once its values pass this, so what the tailer holds of a chunk at once is about
this much whatever the width of the rows."""
_READ_PAGES = 4
"""Pages the tailer reads a round trip."""
_ROWS_FORMAT = "encoded-pages-1"
"""Stored in `rowsmeta` as `format` beside the rows: rows stored by a dump of a dblog version
that spelled them otherwise are never read as these."""
_SCAN_COUNT = 1000
"""Keys a SCAN call looks at (`ids`)."""
_WAIT_SLICE_S = 1.0
"""The longest a blocking wait runs before the state is read again (below any socket timeout)."""


class WindowState(StrEnum):
    REGISTERED = "registered"
    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"
    FAILED = "failed"
    ABANDONED = "abandoned"

    @property
    def ended(self) -> bool:
        return self not in (WindowState.REGISTERED, WindowState.OPEN, WindowState.CLOSING)


@dataclass(frozen=True, slots=True)
class WindowStatus:
    window: Window
    state: WindowState
    reason: str
    chunk: dict[str, JsonValue]
    registered_ms: int
    updated_ms: int


def window_of(data: Mapping[str, str]) -> Window:
    """The window a stored hash (or watermark entry) describes; one registered before windows
    had modes is sequenced."""
    mode = DumpMode(data.get("mode", DumpMode.SEQUENCED))
    return Window(data["window_id"], data["dump_id"], TableRef.parse(data["table"]), mode)


@dataclass(frozen=True, slots=True)
class StoredRows:
    """What the tailer reads of a window's chunk at hw before its rows: the rows come after,
    a page at a time (`WindowStore.row_slices`)."""

    window_id: str
    key_columns: tuple[str, ...]
    rows: int
    pages: int
    invisible_txids: frozenset[int]
    columns: frozenset[tuple[str, ...]]
    """Each column list the rows were read with: more than one when parts were read on both
    sides of an ALTER."""
    snapshot_end: int | None = None
    """A read-only window's: the lowest of its reads' `ChunkRows.snapshot_end`."""


def _pages(rows: EncodedRows) -> list[bytes]:
    """Up to `_PAGE_ROWS` rows a page, fewer when they pass `_PAGE_BYTES`: two list elements a
    page, its keys and its values, each joined by newlines."""
    pages: list[bytes] = []
    keys, values = rows.keys, rows.values
    start = 0
    while start < len(keys):
        end, size = start + 1, len(values[start])
        while end < len(keys) and end - start < _PAGE_ROWS and size < _PAGE_BYTES:
            size += len(values[end])
            end += 1
        pages += [b"\n".join(keys[start:end]), b"\n".join(values[start:end])]
        start = end
    return pages


def _read_with(rows: Sequence[Row], columns: Sequence[str]) -> str:
    """The `columns:<part>` value of a read: the rows' column lists, or `columns` when no row
    is stored (a direct read keeps its rows elsewhere); '' when neither says."""
    if rows:
        return compact_json(row_columns(rows))
    return compact_json([list(columns)]) if columns else ""


class WindowStore(RedisStore):
    """The watermark windows of one source and their chunk rows."""

    # KEYS: window, wm_lw, wm_hw. ARGV: ttl_ms, lw json, hw json, then window field/value pairs.
    _REGISTER = (
        NOW_MS
        + """
if redis.call('EXISTS', KEYS[1], KEYS[2], KEYS[3]) > 0 then return 0 end
redis.call('HSET', KEYS[1], 'state', 'registered', 'reason', '',
           'registered_ms', now, 'updated_ms', now, unpack(ARGV, 4))
redis.call('PEXPIRE', KEYS[1], ARGV[1])
redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[1])
redis.call('SET', KEYS[3], ARGV[3], 'PX', ARGV[1])
return 1
"""
    )

    @reachable
    def register(
        self, window: Window, lw: str, hw: str, chunk: Mapping[str, JsonValue], ttl_s: float
    ) -> None:
        """Register a window before the dump writes `lw` into the source, so the tailer can tell
        our watermark values from stale ones. Every key of the window expires after `ttl_s`:
        make it longer than the dump waits for the window before it abandons it."""
        if lw == hw:
            raise InvalidRequest("lw and hw must differ")
        known = {
            "window_id": window.window_id,
            "dump_id": window.dump_id,
            "table": str(window.table),
            "mode": window.mode.value,
        }
        done = self._eval(
            self._REGISTER,
            keys=[
                self.keys.window(window.window_id),
                self.keys.watermark(lw),
                self.keys.watermark(hw),
            ],
            args=[
                ttl_ms(ttl_s),
                compact_json({**known, "mark": "lw"}),
                compact_json({**known, "mark": "hw"}),
                *(item for pair in known.items() for item in pair),
                "lw",
                lw,
                "hw",
                hw,
                "chunk",
                compact_json(dict(chunk)),
            ],
        )
        if not done:
            raise AlreadyExists(
                f"window {window.window_id} or watermark {lw} / {hw} is already registered"
            )

    @reachable
    def lookup_watermark(self, value: str) -> tuple[Window, Mark] | None:
        """The window a watermark value belongs to, in whatever state it is now. None means the
        value is stale (from a window that expired, or not ours): the tailer ignores it."""
        raw = self._r.get(self.keys.watermark(value))
        if raw is None:
            return None
        data = json.loads(raw)
        mark: Mark = "lw" if data["mark"] == "lw" else "hw"
        return window_of(data), mark

    @reachable
    def put_rows(self, window_id: str, chunk: ChunkRows, columns: Sequence[str] = ()) -> bool:
        """Encode the chunk rows (`encode_rows`) and store them before the dump writes hw,
        replacing any earlier attempt. One MULTI/EXEC, pipelined: the tailer sees all rows or
        none. False (nothing stored) if the window is past open (the tailer met hw already, or
        it ended): the dump then retries the chunk with a new window. `columns` are the columns
        read with when the rows are not stored (a direct read): the tailer checks them at hw as
        it checks the rows' own."""
        if chunk.window_id != window_id:
            raise InvalidRequest(f"rows of window {chunk.window_id} put for window {window_id}")
        if isinstance(chunk.rows, EncodedRows):
            raise InvalidRequest("put_rows encodes the rows itself: give it the rows as read")
        window_key = self.keys.window(window_id)
        rows_key, meta_key = self.keys.window_rows(window_id), self.keys.window_rows_meta(window_id)
        pages = _pages(encode_rows(chunk.rows, chunk.key_columns))
        meta: dict[FieldT, EncodableT] = {
            "key_columns": compact_json(list(chunk.key_columns)),
            "invisible_txids": compact_json(sorted(chunk.invisible_txids)),
            "rows": len(chunk.rows),
            "format": _ROWS_FORMAT,
        }
        read_with = _read_with(chunk.rows, columns)
        if read_with:
            meta["columns:0"] = read_with
        if chunk.hw is not None:
            meta["hw"] = chunk.hw
        if chunk.snapshot_end is not None:
            meta["snapshot_end"] = chunk.snapshot_end
        with self._r.pipeline() as pipe:
            while True:
                try:
                    pipe.watch(window_key)  # type: ignore[no-untyped-call]
                    state, ttl = pipe.hget(window_key, "state"), pipe.pttl(window_key)
                    if state is None:
                        raise UnknownWindow(f"window {window_id} is not registered")
                    if WindowState(text(state)) not in (WindowState.REGISTERED, WindowState.OPEN):
                        return False
                    pipe.multi()
                    pipe.delete(rows_key, meta_key)
                    if pages:
                        pipe.rpush(rows_key, *pages)
                        pipe.pexpire(rows_key, ttl)
                    pipe.hset(meta_key, mapping=meta)
                    pipe.pexpire(meta_key, ttl)
                    pipe.execute()
                    return True
                except redis.WatchError:
                    continue

    # KEYS: window, rows, rowsmeta. ARGV: part, row count, key_columns json, invisible_txids json,
    # columns json ('' for no rows), rows format, hw, snapshot_end ('' for none), pages...
    # Returns {1, rows stored for the part}, {0, 0} (window past open), {-1, 0} (unknown). A part
    # is stored once: a Spark task run again (retry, speculation) appends nothing more. hw is
    # the parts' highest, snapshot_end their lowest (compared as digit strings: a position may
    # pass a Lua number's 53 bits).
    _APPEND_ROWS = """
local function above(a, b)
  if #a ~= #b then return #a > #b end
  return a > b
end
local state = redis.call('HGET', KEYS[1], 'state')
if not state then return {-1, 0} end
if state ~= 'registered' and state ~= 'open' then return {0, 0} end
local stored = redis.call('HGET', KEYS[3], 'part:' .. ARGV[1])
if stored then return {1, tonumber(stored)} end
local ttl = redis.call('PTTL', KEYS[1])
redis.call('HSETNX', KEYS[3], 'key_columns', ARGV[3])
redis.call('HSETNX', KEYS[3], 'invisible_txids', '[]')
redis.call('HSETNX', KEYS[3], 'format', ARGV[6])
redis.call('HSET', KEYS[3], 'part:' .. ARGV[1], ARGV[2], 'invisible_txids:' .. ARGV[1], ARGV[4])
if ARGV[5] ~= '' then redis.call('HSET', KEYS[3], 'columns:' .. ARGV[1], ARGV[5]) end
redis.call('HINCRBY', KEYS[3], 'rows', ARGV[2])
if ARGV[7] ~= '' then
  local hw = redis.call('HGET', KEYS[3], 'hw')
  if (not hw) or above(ARGV[7], hw) then redis.call('HSET', KEYS[3], 'hw', ARGV[7]) end
end
if ARGV[8] ~= '' then
  local had = redis.call('HGET', KEYS[3], 'snapshot_end')
  if (not had) or above(had, ARGV[8]) then redis.call('HSET', KEYS[3], 'snapshot_end', ARGV[8]) end
end
redis.call('PEXPIRE', KEYS[3], ttl)
if #ARGV > 8 then
  redis.call('RPUSH', KEYS[2], unpack(ARGV, 9))
  redis.call('PEXPIRE', KEYS[2], ttl)
end
return {1, tonumber(ARGV[2])}
"""

    @reachable
    def append_rows(
        self,
        window_id: str,
        part: int,
        rows: Sequence[Row],
        key_columns: Sequence[str],
        invisible_txids: frozenset[int],
        columns: Sequence[str] = (),
        *,
        hw: int | None = None,
        snapshot_end: int | None = None,
    ) -> int | None:
        """Encode one part of a window's chunk rows (a sub-range read by one Spark task) and add
        it in one atomic script, so rows reach Redis straight from the reader, never via the
        dump's driver. The window's rows are the union of its parts and its invisible txids the
        union of theirs; `columns` as for `put_rows`; a read-only window's `hw` the highest of
        theirs, its `snapshot_end` the lowest. A part already stored is kept as it is (a task
        run twice appends once). Returns the rows stored for the part, or None if the
        window is past open: the chunk is retried."""
        status, stored = self._eval(
            self._APPEND_ROWS,
            keys=[
                self.keys.window(window_id),
                self.keys.window_rows(window_id),
                self.keys.window_rows_meta(window_id),
            ],
            args=[
                part,
                len(rows),
                compact_json(list(key_columns)),
                compact_json(sorted(invisible_txids)),
                _read_with(rows, columns),
                _ROWS_FORMAT,
                "" if hw is None else hw,
                "" if snapshot_end is None else snapshot_end,
                *_pages(encode_rows(rows, key_columns)),
            ],
        )
        if status == -1:
            raise UnknownWindow(f"window {window_id} is not registered")
        return int(stored) if status == 1 else None

    @reachable
    def stored_rows(self, window_id: str) -> StoredRows | None:
        """What the dump stored for a window, but the rows themselves (`row_slices` streams
        those); None if nothing is stored (never stored, or the window ended and they were
        deleted): the tailer then fails the window. Raises `MissingRows` for rows stored in
        another format."""
        with self._r.pipeline(transaction=True) as pipe:
            pipe.hgetall(self.keys.window_rows_meta(window_id))
            pipe.llen(self.keys.window_rows(window_id))
            raw_meta, elements = pipe.execute()
        if not raw_meta:
            return None
        meta = decode_hash(raw_meta)
        if meta.get("format") != _ROWS_FORMAT:
            raise MissingRows(
                f"the rows of window {window_id} were stored as {meta.get('format', 'JSON arrays')}"
                f", not {_ROWS_FORMAT}: a dump of another dblog version stored them (upgrade it)"
            )
        txids = (
            txid
            for field, value in meta.items()
            if field == "invisible_txids" or field.startswith("invisible_txids:")
            for txid in json.loads(value)
        )
        columns = {
            tuple(names)
            for field, value in meta.items()
            if field.startswith("columns:")
            for names in json.loads(value)
        }
        return StoredRows(
            window_id=window_id,
            key_columns=tuple(json.loads(meta["key_columns"])),
            rows=int(meta["rows"]),
            pages=int(elements) // 2,
            invisible_txids=frozenset(txids),
            columns=frozenset(columns),
            snapshot_end=int(meta["snapshot_end"]) if "snapshot_end" in meta else None,
        )

    def row_slices(self, stored: StoredRows) -> Iterator[EncodedRows]:
        """The stored rows a page (up to `_PAGE_ROWS` rows, about `_PAGE_BYTES`) at a time, in
        the order they were stored, `_READ_PAGES` pages a round trip, so no more than that is
        held at once. Raises `MissingRows` if they are deleted meanwhile (the window ended, or
        Redis lost them)."""
        rows_key = self.keys.window_rows(stored.window_id)
        for first in range(0, stored.pages, _READ_PAGES):
            wanted = min(_READ_PAGES, stored.pages - first)
            elements = self._range(rows_key, 2 * first, 2 * (first + wanted) - 1)
            if len(elements) != 2 * wanted:
                raise MissingRows(
                    f"the rows of window {stored.window_id} went away after page {first}"
                )
            blobs = [e.encode() if isinstance(e, str) else e for e in elements]
            for keys, values in zip(blobs[::2], blobs[1::2], strict=True):
                yield EncodedRows(keys.split(b"\n"), values.split(b"\n"))
            del elements, blobs

    @reachable
    def _range(self, key: str, start: int, end: int) -> list[bytes | str]:
        elements: list[bytes | str] = self._r.lrange(key, start, end)
        return elements

    def open(self, window_id: str, token: int) -> bool:
        """The tailer met lw: registered -> open. False if the window is not registered (ended,
        expired, or lw seen twice). Raises `FencedOut` if `token` no longer holds the lease."""
        return self._move(window_id, WindowState.OPEN, "", token, WindowState.REGISTERED)

    def claim(self, window_id: str, token: int) -> bool:
        """The tailer met hw: open -> closing, before it emits a single chunk row. From here the
        dump can no longer abandon the window. Exactly one of this and `abandon` wins a race;
        False means the window ended first (abandoned, say): drop it, emit nothing."""
        return self._move(window_id, WindowState.CLOSING, "", token, WindowState.OPEN)

    def close(self, window_id: str, token: int) -> bool:
        """The output has made the chunk's events durable: closing -> closed. Only now may the
        dump count the chunk as complete and move its progress. Deletes the chunk rows."""
        return self._move(window_id, WindowState.CLOSED, "", token, WindowState.CLOSING)

    def fail(self, window_id: str, reason: str, token: int) -> bool:
        """The tailer ends a window it cannot reconcile (hw without lw, stale read, rows
        missing, ...): registered/open/closing -> failed, with the reason. The dump retries
        the chunk."""
        return self._move(
            window_id,
            WindowState.FAILED,
            reason,
            token,
            WindowState.REGISTERED,
            WindowState.OPEN,
            WindowState.CLOSING,
        )

    def abandon(self, window_id: str, reason: str = "the dump stopped waiting") -> bool:
        """The dump gave up waiting for the window: registered/open -> abandoned. Exactly one of
        `claim` and this wins a race; False means the tailer claimed or ended the window first:
        read its state, and if it is closing, wait for the tailer to close it."""
        return self._move(
            window_id,
            WindowState.ABANDONED,
            reason,
            None,
            WindowState.REGISTERED,
            WindowState.OPEN,
        )

    # KEYS: window, rows, rowsmeta, ended, token. ARGV: token ('' = not a tailer write),
    # to_state, reason, allowed from-states... Returns 1 (moved), 0 (not in an allowed state),
    # -1 (fenced).
    _TRANSITION = (
        FENCE
        + NOW_MS
        + """
local state = redis.call('HGET', KEYS[1], 'state')
if not state then return 0 end
local allowed = false
for i = 4, #ARGV do
  if ARGV[i] == state then allowed = true end
end
if not allowed then return 0 end
redis.call('HSET', KEYS[1], 'state', ARGV[2], 'reason', ARGV[3], 'updated_ms', now)
if ARGV[2] ~= 'open' and ARGV[2] ~= 'closing' then
  redis.call('DEL', KEYS[2], KEYS[3])
  redis.call('RPUSH', KEYS[4], ARGV[2])
  local ttl = redis.call('PTTL', KEYS[1])
  if ttl > 0 then redis.call('PEXPIRE', KEYS[4], ttl) end
end
return 1
"""
    )

    @reachable
    def _move(
        self,
        window_id: str,
        to: WindowState,
        reason: str,
        token: int | None,
        *allowed: WindowState,
    ) -> bool:
        result = self._eval(
            self._TRANSITION,
            keys=[
                self.keys.window(window_id),
                self.keys.window_rows(window_id),
                self.keys.window_rows_meta(window_id),
                self.keys.window_ended(window_id),
                self.keys.tailer_token,
            ],
            args=["" if token is None else token, to.value, reason, *(s.value for s in allowed)],
        )
        if result == -1:
            raise FencedOut.of(self.source, token, f"window {window_id} was not moved to {to}")
        return bool(result == 1)

    @reachable
    def ids(self) -> set[str]:
        """The ids of every window still in Redis, open or ended (an ended one stays until its
        keys expire): a scan, for views of all windows rather than the tailer's or a dump's
        path."""
        prefix = self.keys.window("")
        found = set()
        for key in self._r.scan_iter(match=prefix + "*", count=_SCAN_COUNT, _type="HASH"):
            window_id = text(key)[len(prefix) :]
            if ":" not in window_id:  # not window:<id>:rowsmeta
                found.add(window_id)
        return found

    @reachable
    def state(self, window_id: str) -> WindowStatus | None:
        """The window's state and why it ended (empty unless failed or abandoned); None if the
        window is unknown (never registered, or expired)."""
        raw = self._r.hgetall(self.keys.window(window_id))
        if not raw:
            return None
        data = decode_hash(raw)
        return WindowStatus(
            window=window_of(data),
            state=WindowState(data["state"]),
            reason=data["reason"],
            chunk=json.loads(data["chunk"]),
            registered_ms=int(data["registered_ms"]),
            updated_ms=int(data["updated_ms"]),
        )

    def wait(self, window_id: str, timeout_s: float) -> WindowStatus:
        """Wait until the window ends or `timeout_s` passes; returns its state then (still
        registered or open on a timeout: the dump abandons it next). Blocks on the window's
        `ended` list (BLMOVE onto itself, so every waiter wakes and none consumes the signal)
        and reads the state again at least every second, so a lost signal costs one second."""
        deadline = time.monotonic() + timeout_s
        ended_key = self.keys.window_ended(window_id)
        while True:
            status = self.state(window_id)
            if status is None:
                raise UnknownWindow(f"window {window_id} is not registered (or expired)")
            remaining = deadline - time.monotonic()
            if status.state.ended or remaining <= 0:
                return status
            self._block(ended_key, min(remaining, _WAIT_SLICE_S))

    @reachable
    def _block(self, key: str, timeout_s: float) -> None:
        # BLMOVE takes a fractional timeout; redis-py's blmove() is typed for whole seconds.
        self._r.execute_command(  # type: ignore[no-untyped-call]
            "BLMOVE", key, key, "LEFT", "RIGHT", max(timeout_s, 0.01)
        )
