"""The chunk rows of a watermark window: stored by the dump before it writes hw (in one
transaction, or a part at a time by Spark tasks), read by the tailer at hw a few pages a round
trip. The window's own life is `windows.py`'s; the rows expire with the window and are deleted
as soon as it ends.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import redis
from redis.typing import EncodableT, FieldT

from airflow_provider_dblog.core.encoded_rows import EncodedRows, encode_rows, row_columns
from airflow_provider_dblog.core.errors import InvalidRequest
from airflow_provider_dblog.core.event import Row
from airflow_provider_dblog.core.reconciler import ChunkRows
from airflow_provider_dblog.state.base import (
    RedisStore,
    compact_json,
    decode_hash,
    reachable,
    text,
)
from airflow_provider_dblog.state.errors import MissingRows, UnknownWindow

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
_OPEN_STATES = ("registered", "open")
"""The window states in which a dump may still store rows (`WindowState`'s values)."""


@dataclass(frozen=True, slots=True)
class StoredRows:
    """What the tailer reads of a window's chunk at hw before its rows: the rows come after,
    a page at a time (`WindowRows.row_slices`)."""

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


class WindowRows(RedisStore):
    """The chunk rows of the watermark windows of one source: stored by the dump before hw,
    read by the tailer at hw (`WindowStore` adds the windows themselves)."""

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
                    if text(state) not in _OPEN_STATES:
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
