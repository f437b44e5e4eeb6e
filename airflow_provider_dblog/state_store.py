"""The Redis state store: what the dump, the tailer and Airflow share about one source.

The dump (Spark job or CLI) and the log tailer never talk to each other; they meet here. The dump
registers a watermark window before it writes lw and stores the chunk rows before it writes hw;
the tailer looks watermark values up, moves the window's state and reads the rows at hw. Airflow
writes dump requests and control signals and reads status and tailer health.

Keys (P = `dblog:{<source>}:`; the braces are literal: they make P a Redis Cluster hash tag, so
every key of a source lives in one slot and every Lua script below may touch any of them):

| key                    | type   | meaning                                                     |
|------------------------|--------|-------------------------------------------------------------|
| P window:<id>          | hash   | a watermark window: window_id, dump_id, table, lw, hw,      |
|                        |        | chunk (JSON), state, reason, registered_ms, updated_ms      |
| P wm:<value>           | string | the window a watermark value belongs to: JSON {window_id,   |
|                        |        | dump_id, table, mark: "lw" or "hw"}                         |
| P window:<id>:rows     | list   | the chunk rows, one JSON array of up to 1000 rows each      |
| P window:<id>:rowsmeta | hash   | key_columns, schema_version, invisible_txids (JSON), rows;  |
|                        |        | appended rows add part:<n> (its row count) and              |
|                        |        | invisible_txids:<n> (JSON) per part                         |
| P window:<id>:ended    | list   | one element once the window ended (waiters block on it)     |
| P dumps                | list   | dump ids in the order they were created                     |
| P dump:<id>            | string | the DumpRequest and the tables' key columns (JSON)          |
| P dump:<id>:status     | hash   | state, reason, chunks, rows, windows_retried,               |
|                        |        | created_ms, started_ms, finished_ms, updated_ms             |
| P dump:<id>:controls   | hash   | paused, cancelled, chunk_size, delay_ms, max_rows_per_s     |
| P dump:<id>:progress   | hash   | table ("schema.name") -> TableProgress JSON                 |
| P dump:<id>:driver     | string | the process running the dump; expires (PX) unless renewed   |
| P tailer:checkpoint    | string | the commit position the tailer restarts from                |
| P tailer:token         | string | the last fencing token handed out                           |
| P tailer:lease         | hash   | owner, token of the active tailer; expires (PX)             |
| P tailer:heartbeat     | hash   | owner, at_ms (Redis clock), metrics (JSON); expires (PX)    |

A window's life (every move is one Lua script, so two racing processes see one winner):

    registered --lw (tailer)--> open --hw (tailer)--> closing --output durable (tailer)--> closed
    registered/open --dump timed out--> abandoned      registered/open/closing --tailer--> failed

`closing` is the tailer's claim at hw, taken before it emits any chunk row: once the tailer holds
it, the dump cannot abandon the window, and once the dump abandoned it, the tailer's claim fails
and it emits nothing. So an abandoned window's rows are never emitted, and `closed` still means
what the dump needs to move its progress: the chunk's events are durable in the output.

Every key of a window (`window:<id>*`, `wm:<value>`) expires with the TTL given when it was
registered, so Redis does not grow with the windows of old dumps; the rows, the bulk of it, are
deleted as soon as the window ends. Dump records do not expire: they are small, and they are the
history Airflow shows.

Timestamps written by scripts come from the Redis server clock (TIME), so the dump, the tailer
and Airflow on different hosts compare them on one clock.

Durability. Redis runs with `appendonly yes` and `appendfsync everysec`: a crash of Redis (or of
its host) can lose the writes of the last second or so. The AOF is a log, so what is lost is
always a suffix of the writes: a later write never survives an earlier one. Per kind of key:

- window registration lost: the tailer meets a watermark value it does not know and ignores it;
  the dump's wait times out, the abandon finds nothing, and the chunk is retried.
- window transition lost (open, closed, failed): at worst the window is back in an earlier state.
  The tailer's next transition is refused, it drops the window, and the dump times out and
  retries the chunk. If the close was lost after the output took the rows, the retried chunk
  emits them again: the output is at-least-once and consumers drop duplicates by position.
- chunk rows lost: the tailer finds none at hw and fails the window; the chunk is retried.
- dump progress or counters lost: the dump resumes from an earlier chunk and reads some rows
  again (duplicates, never gaps: progress is saved after the window closed, so it never
  survives the close it depends on).
- dump request, status or controls lost: the last second of Airflow's writes; the caller sees
  the request missing or a control not applied and asks again.
- checkpoint lost: the tailer re-reads some log from an earlier position (duplicates only).
- lease lost: the holder's next renewal fails and it stops; a standby acquires it.
- fencing token lost: tokens are `max(last + 1, Redis time in ms)`, so a token handed out again
  after a lost INCR is still larger than every token handed out before the crash (as long as the
  Redis host's clock does not step back across the restart), and the old leader stays fenced out.
- heartbeat lost: health looks stale until the next beat, a few seconds later.

A Redis that cannot be reached raises `StateStoreUnavailable` (wrapping redis-py's
ConnectionError / TimeoutError) from every method; nothing is retried here beyond what the
client's own retry policy does.
"""

from __future__ import annotations

import functools
import json
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal, ParamSpec, TypeVar

import redis
import redis.asyncio
from redis.typing import EncodableT, FieldT

from airflow_provider_dblog.core.dump_plan import DumpKind, DumpRequest, TableProgress
from airflow_provider_dblog.core.errors import DBLogError, InvalidRequest
from airflow_provider_dblog.core.event import JsonValue, Row, TableRef, freeze
from airflow_provider_dblog.core.reconciler import ChunkRows, Window

Mark = Literal["lw", "hw"]

_SOURCE_NAME = re.compile(r"[A-Za-z0-9_.-]+")
_PAGE_ROWS = 1000
"""Rows per list element of a chunk: one JSON array each, so 50k rows are 50 RPUSH arguments."""
_WAIT_SLICE_S = 1.0
"""The longest a blocking wait runs before the state is read again (below any socket timeout)."""


class StateStoreError(DBLogError):
    """Something in the state store is not as the caller expected."""


class StateStoreUnavailable(StateStoreError):
    """Redis cannot be reached (down, restarting, loading its AOF, or the network)."""


class FencedOut(StateStoreError):
    """A tailer wrote with a fencing token that no longer holds the lease: a newer tailer took
    over. The stale tailer must stop at once; its write was not made."""


class UnknownWindow(StateStoreError):
    """No such window: never registered, or its keys expired."""


class UnknownDump(StateStoreError):
    """No such dump request."""


class AlreadyExists(StateStoreError):
    """A window id, watermark value or dump id is already in use."""


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


class DumpState(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    PAUSED = "paused"
    CANCELLED = "cancelled"
    FAILED = "failed"
    DONE = "done"

    @property
    def finished(self) -> bool:
        return self in (DumpState.CANCELLED, DumpState.FAILED, DumpState.DONE)


@dataclass(frozen=True, slots=True)
class WindowStatus:
    window: Window
    state: WindowState
    reason: str
    chunk: dict[str, JsonValue]
    registered_ms: int
    updated_ms: int


@dataclass(frozen=True, slots=True)
class StoredDump:
    request: DumpRequest
    key_columns: dict[TableRef, tuple[str, ...]]


@dataclass(frozen=True, slots=True)
class DumpStatus:
    state: DumpState
    reason: str
    chunks: int
    rows: int
    windows_retried: int
    created_ms: int
    started_ms: int | None
    finished_ms: int | None
    updated_ms: int


@dataclass(frozen=True, slots=True)
class DumpControls:
    """What the dump obeys between chunks. `max_rows_per_s` None means no limit."""

    paused: bool
    cancelled: bool
    chunk_size: int
    delay_ms: int
    max_rows_per_s: float | None


# -- Lua scripts: every check-then-write that two processes may race on ------------------------

_NOW_MS = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

# KEYS: window, wm_lw, wm_hw. ARGV: ttl_ms, lw json, hw json, then window field/value pairs.
_REGISTER = (
    _NOW_MS
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

# The fencing check of every tailer write: the token must be the last one handed out.
_FENCE = """
if ARGV[1] ~= '' and redis.call('GET', KEYS[#KEYS]) ~= ARGV[1] then return -1 end
"""

# KEYS: window, rows, rowsmeta, ended, token. ARGV: token ('' = not a tailer write), to_state,
# reason, allowed from-states... Returns 1 (moved), 0 (not in an allowed state), -1 (fenced).
_TRANSITION = (
    _FENCE
    + _NOW_MS
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

# KEYS: checkpoint, token. ARGV: token, commit.
_CHECKPOINT = (
    _FENCE
    + """
redis.call('SET', KEYS[1], ARGV[2])
return 1
"""
)

# KEYS: lease, token. ARGV: owner, ttl_ms. Returns the new token, or 0 when the lease is held.
_ACQUIRE = (
    _NOW_MS
    + """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local token = redis.call('INCR', KEYS[2])
if token < now then
  token = now
  redis.call('SET', KEYS[2], token)
end
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'token', token)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return token
"""
)

# KEYS: lease. ARGV: owner, token, ttl_ms ('' = release). Returns 1 if the lease was ours.
_RENEW_OR_RELEASE = """
local lease = redis.call('HMGET', KEYS[1], 'owner', 'token')
if lease[1] ~= ARGV[1] or lease[2] ~= ARGV[2] then return 0 end
if ARGV[3] == '' then
  redis.call('DEL', KEYS[1])
else
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
end
return 1
"""

# KEYS: heartbeat. ARGV: owner, metrics json, ttl_ms.
_HEARTBEAT = (
    _NOW_MS
    + """
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'at_ms', now, 'metrics', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
"""
)

# KEYS: request, status, controls, index. ARGV: dump_id, request json, chunk_size.
_CREATE_DUMP = (
    _NOW_MS
    + """
if redis.call('SET', KEYS[1], ARGV[2], 'NX') == false then return 0 end
redis.call('HSET', KEYS[2], 'state', 'pending', 'reason', '', 'chunks', 0, 'rows', 0,
           'windows_retried', 0, 'created_ms', now, 'updated_ms', now)
redis.call('HSET', KEYS[3], 'paused', 0, 'cancelled', 0, 'chunk_size', ARGV[3],
           'delay_ms', 0, 'max_rows_per_s', 0)
redis.call('RPUSH', KEYS[4], ARGV[1])
return 1
"""
)

# KEYS: window, rows, rowsmeta. ARGV: part, row count, key_columns json, invisible_txids json,
# pages... Returns {1, rows stored for the part}, {0, 0} (window past open), {-1, 0} (unknown).
# A part is stored once: a Spark task run again (retry, speculation) appends nothing more.
_APPEND_ROWS = """
local state = redis.call('HGET', KEYS[1], 'state')
if not state then return {-1, 0} end
if state ~= 'registered' and state ~= 'open' then return {0, 0} end
local stored = redis.call('HGET', KEYS[3], 'part:' .. ARGV[1])
if stored then return {1, tonumber(stored)} end
local ttl = redis.call('PTTL', KEYS[1])
redis.call('HSETNX', KEYS[3], 'key_columns', ARGV[3])
redis.call('HSETNX', KEYS[3], 'schema_version', 0)
redis.call('HSETNX', KEYS[3], 'invisible_txids', '[]')
redis.call('HSET', KEYS[3], 'part:' .. ARGV[1], ARGV[2], 'invisible_txids:' .. ARGV[1], ARGV[4])
redis.call('HINCRBY', KEYS[3], 'rows', ARGV[2])
redis.call('PEXPIRE', KEYS[3], ttl)
if #ARGV > 4 then
  redis.call('RPUSH', KEYS[2], unpack(ARGV, 5))
  redis.call('PEXPIRE', KEYS[2], ttl)
end
return {1, tonumber(ARGV[2])}
"""

_FINISHED = "local finished = {cancelled = true, failed = true, done = true}\n"

# KEYS: status. ARGV: state, reason. Returns 1, 0 (finished already), -1 (no such dump).
_MARK_DUMP = (
    _NOW_MS
    + _FINISHED
    + """
local state = redis.call('HGET', KEYS[1], 'state')
if not state then return -1 end
if finished[state] then return 0 end
redis.call('HSET', KEYS[1], 'state', ARGV[1], 'reason', ARGV[2], 'updated_ms', now)
if ARGV[1] == 'running' and redis.call('HEXISTS', KEYS[1], 'started_ms') == 0 then
  redis.call('HSET', KEYS[1], 'started_ms', now)
end
if finished[ARGV[1]] then redis.call('HSET', KEYS[1], 'finished_ms', now) end
return 1
"""
)

# KEYS: status. ARGV: chunks, rows, windows_retried. Returns 1, or -1 (no such dump).
_COUNT_DUMP = """
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
redis.call('HINCRBY', KEYS[1], 'chunks', ARGV[1])
redis.call('HINCRBY', KEYS[1], 'rows', ARGV[2])
redis.call('HINCRBY', KEYS[1], 'windows_retried', ARGV[3])
return 1
"""

# KEYS: status, controls. ARGV: control field/value pairs. A pending dump that is cancelled
# ends at once: no dump process runs yet to notice it.
_CONTROL = (
    _NOW_MS
    + _FINISHED
    + """
local state = redis.call('HGET', KEYS[1], 'state')
if not state then return -1 end
if finished[state] then return 0 end
redis.call('HSET', KEYS[2], unpack(ARGV))
if state == 'pending' and redis.call('HGET', KEYS[2], 'cancelled') == '1' then
  redis.call('HSET', KEYS[1], 'state', 'cancelled', 'reason', 'cancelled before it started',
             'updated_ms', now, 'finished_ms', now)
end
return 1
"""
)

# KEYS: status, controls. ARGV: none. Returns 1, 0 (done: nothing to run again), -1 (no such
# dump). A failed or cancelled dump, or one whose process died, becomes pending again with its
# pause and cancel cleared; its progress is kept, so the next run resumes from it.
_REOPEN_DUMP = (
    _NOW_MS
    + """
local state = redis.call('HGET', KEYS[1], 'state')
if not state then return -1 end
if state == 'done' then return 0 end
redis.call('HSET', KEYS[1], 'state', 'pending', 'reason', '', 'updated_ms', now)
redis.call('HDEL', KEYS[1], 'finished_ms')
redis.call('HSET', KEYS[2], 'paused', 0, 'cancelled', 0)
return 1
"""
)


# -- helpers -------------------------------------------------------------------------------------

P = ParamSpec("P")
R = TypeVar("R")


def _reachable(method: Callable[P, R]) -> Callable[P, R]:
    """Turn redis-py's connection failures into `StateStoreUnavailable`, naming the server."""

    @functools.wraps(method)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return method(*args, **kwargs)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            store = args[0]
            assert isinstance(store, StateStore)
            raise StateStoreUnavailable(
                f"the Redis state store at {store.address} cannot be reached: {exc}"
            ) from exc

    return wrapper


def _text(value: bytes | str) -> str:
    """Works whether or not the client decodes responses."""
    return value.decode() if isinstance(value, bytes) else value


def _hash(raw: Mapping[Any, Any]) -> dict[str, str]:
    return {_text(k): _text(v) for k, v in raw.items()}


def _dumps(value: JsonValue) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _ttl_ms(seconds: float) -> int:
    ms = round(seconds * 1000)
    if ms < 1:
        raise InvalidRequest(f"a TTL must be positive, got {seconds}s")
    return ms


def _optional_int(value: str | None) -> int | None:
    return None if value is None else int(value)


def _request_to_json(request: DumpRequest) -> dict[str, JsonValue]:
    return {
        "dump_id": request.dump_id,
        "kind": request.kind.value,
        "tables": [str(t) for t in request.tables],
        "keys": [list(k) for k in request.keys],
        "chunk_size": request.chunk_size,
        "parallelism": request.parallelism,
    }


def _request_from_json(data: dict[str, Any]) -> DumpRequest:
    return DumpRequest(
        dump_id=data["dump_id"],
        kind=DumpKind(data["kind"]),
        tables=tuple(TableRef.parse(t) for t in data["tables"]),
        keys=tuple(tuple(freeze(v) for v in k) for k in data["keys"]),
        chunk_size=data["chunk_size"],
        parallelism=data["parallelism"],
    )


def _prefix(source: str) -> str:
    """The keys' prefix of a source (see the key table above), its name checked."""
    if not _SOURCE_NAME.fullmatch(source):
        raise InvalidRequest(f"a source name is letters, digits, '_', '.' and '-', got {source!r}")
    return f"dblog:{{{source}}}:"


def _dump_key(prefix: str, dump_id: str, part: str = "") -> str:
    return f"{prefix}dump:{dump_id}{part}"


def _dump_status(raw: Mapping[Any, Any]) -> DumpStatus | None:
    if not raw:
        return None
    data = _hash(raw)
    return DumpStatus(
        state=DumpState(data["state"]),
        reason=data["reason"],
        chunks=int(data["chunks"]),
        rows=int(data["rows"]),
        windows_retried=int(data["windows_retried"]),
        created_ms=int(data["created_ms"]),
        started_ms=_optional_int(data.get("started_ms")),
        finished_ms=_optional_int(data.get("finished_ms")),
        updated_ms=int(data["updated_ms"]),
    )


def _tailer_health(raw: Mapping[Any, Any], now: tuple[int, int]) -> dict[str, JsonValue] | None:
    if not raw:
        return None
    data = _hash(raw)
    at_ms = int(data["at_ms"])
    seconds, micros = now
    return {
        "owner": data["owner"],
        "at_ms": at_ms,
        "age_ms": seconds * 1000 + micros // 1000 - at_ms,
        "metrics": json.loads(data["metrics"]),
    }


class StateStore:
    """The state of one source in Redis. Thread-safe as far as the redis client is (redis-py's
    connection pool is): the dump's threads and the tailer may share one store."""

    def __init__(self, client: redis.Redis, source: str) -> None:
        self._r = client
        self.source = source
        self.prefix = _prefix(source)
        self._register = client.register_script(_REGISTER)
        self._transition = client.register_script(_TRANSITION)
        self._checkpoint = client.register_script(_CHECKPOINT)
        self._acquire = client.register_script(_ACQUIRE)
        self._renew_or_release = client.register_script(_RENEW_OR_RELEASE)
        self._heartbeat = client.register_script(_HEARTBEAT)
        self._create_dump = client.register_script(_CREATE_DUMP)
        self._mark_dump = client.register_script(_MARK_DUMP)
        self._count_dump = client.register_script(_COUNT_DUMP)
        self._control = client.register_script(_CONTROL)
        self._reopen_dump = client.register_script(_REOPEN_DUMP)
        self._append_rows = client.register_script(_APPEND_ROWS)

    @property
    def address(self) -> str:
        """Where Redis is, without the password."""
        kwargs = self._r.connection_pool.connection_kwargs
        if "path" in kwargs:
            return f"unix:{kwargs['path']}"
        return f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}"

    # -- keys ---------------------------------------------------------------------------------

    def _window_key(self, window_id: str, part: str = "") -> str:
        return f"{self.prefix}window:{window_id}{part}"

    def _window_keys(self, window_id: str) -> list[str]:
        """The keys of the transition script, in its order."""
        return [
            self._window_key(window_id),
            self._window_key(window_id, ":rows"),
            self._window_key(window_id, ":rowsmeta"),
            self._window_key(window_id, ":ended"),
            self.prefix + "tailer:token",
        ]

    def _dump_key(self, dump_id: str, part: str = "") -> str:
        return _dump_key(self.prefix, dump_id, part)

    # -- watermark windows --------------------------------------------------------------------

    @_reachable
    def register_window(
        self, window: Window, lw: str, hw: str, chunk: Mapping[str, JsonValue], ttl_s: float
    ) -> None:
        """Register a window before the dump writes `lw` into the source, so the tailer can tell
        our watermark values from stale ones. Every key of the window expires after `ttl_s`:
        make it longer than the dump waits for the window before it abandons it."""
        if lw == hw:
            raise InvalidRequest("lw and hw must differ")
        ttl_ms = _ttl_ms(ttl_s)
        known = {
            "window_id": window.window_id,
            "dump_id": window.dump_id,
            "table": str(window.table),
        }
        done = self._register(
            keys=[
                self._window_key(window.window_id),
                f"{self.prefix}wm:{lw}",
                f"{self.prefix}wm:{hw}",
            ],
            args=[
                ttl_ms,
                _dumps({**known, "mark": "lw"}),
                _dumps({**known, "mark": "hw"}),
                *(item for pair in known.items() for item in pair),
                "lw",
                lw,
                "hw",
                hw,
                "chunk",
                _dumps(dict(chunk)),
            ],
        )
        if not done:
            raise AlreadyExists(
                f"window {window.window_id} or watermark {lw} / {hw} is already registered"
            )

    @_reachable
    def lookup_watermark(self, value: str) -> tuple[Window, Mark] | None:
        """The window a watermark value belongs to, in whatever state it is now. None means the
        value is stale (from a window that expired, or not ours): the tailer ignores it."""
        raw = self._r.get(f"{self.prefix}wm:{value}")
        if raw is None:
            return None
        data = json.loads(raw)
        window = Window(data["window_id"], data["dump_id"], TableRef.parse(data["table"]))
        mark: Mark = "lw" if data["mark"] == "lw" else "hw"
        return window, mark

    @_reachable
    def put_chunk_rows(self, window_id: str, chunk: ChunkRows) -> bool:
        """Store the chunk rows before the dump writes hw, replacing any earlier attempt. One
        MULTI/EXEC, pipelined: the tailer sees all rows or none. False (nothing stored) if the
        window is past open (the tailer met hw already, or it ended): the dump then retries the
        chunk with a new window."""
        if chunk.window_id != window_id:
            raise InvalidRequest(f"rows of window {chunk.window_id} put for window {window_id}")
        window_key, rows_key, meta_key = self._window_keys(window_id)[:3]
        pages = [
            _dumps(list(chunk.rows[i : i + _PAGE_ROWS]))
            for i in range(0, len(chunk.rows), _PAGE_ROWS)
        ]
        meta: dict[FieldT, EncodableT] = {
            "key_columns": _dumps(list(chunk.key_columns)),
            "schema_version": chunk.schema_version,
            "invisible_txids": _dumps(sorted(chunk.invisible_txids)),
            "rows": len(chunk.rows),
        }
        with self._r.pipeline() as pipe:
            while True:
                try:
                    pipe.watch(window_key)  # type: ignore[no-untyped-call]
                    state, ttl_ms = pipe.hget(window_key, "state"), pipe.pttl(window_key)
                    if state is None:
                        raise UnknownWindow(f"window {window_id} is not registered")
                    if WindowState(_text(state)) not in (WindowState.REGISTERED, WindowState.OPEN):
                        return False
                    pipe.multi()
                    pipe.delete(rows_key, meta_key)
                    if pages:
                        pipe.rpush(rows_key, *pages)
                        pipe.pexpire(rows_key, ttl_ms)
                    pipe.hset(meta_key, mapping=meta)
                    pipe.pexpire(meta_key, ttl_ms)
                    pipe.execute()
                    return True
                except redis.WatchError:
                    continue

    @_reachable
    def append_chunk_rows(
        self,
        window_id: str,
        part: int,
        rows: Sequence[Row],
        key_columns: Sequence[str],
        invisible_txids: frozenset[int],
    ) -> int | None:
        """Add one part of a window's chunk rows (a sub-range read by one Spark task) in one
        atomic script, so rows reach Redis straight from the reader, never via the dump's driver.
        The window's rows are the union of its parts and its invisible txids the union of theirs.
        A part already stored is kept as it is (a task run twice appends once). Returns the rows
        stored for the part, or None if the window is past open: the chunk is retried."""
        _, rows_key, meta_key = self._window_keys(window_id)[:3]
        pages = [_dumps(list(rows[i : i + _PAGE_ROWS])) for i in range(0, len(rows), _PAGE_ROWS)]
        status, stored = self._append_rows(
            keys=[self._window_key(window_id), rows_key, meta_key],
            args=[
                part,
                len(rows),
                _dumps(list(key_columns)),
                _dumps(sorted(invisible_txids)),
                *pages,
            ],
        )
        if status == -1:
            raise UnknownWindow(f"window {window_id} is not registered")
        return int(stored) if status == 1 else None

    @_reachable
    def get_chunk_rows(self, window_id: str) -> ChunkRows | None:
        """The rows the dump stored for a window; None if there are none (never stored, or the
        window ended and they were deleted): the tailer then fails the window."""
        _, rows_key, meta_key = self._window_keys(window_id)[:3]
        with self._r.pipeline(transaction=True) as pipe:
            pipe.hgetall(meta_key)
            pipe.lrange(rows_key, 0, -1)
            raw_meta, pages = pipe.execute()
        if not raw_meta:
            return None
        meta = _hash(raw_meta)
        rows: list[Row] = [row for page in pages for row in json.loads(page)]
        txids = (
            txid
            for field, value in meta.items()
            if field == "invisible_txids" or field.startswith("invisible_txids:")
            for txid in json.loads(value)
        )
        return ChunkRows(
            window_id=window_id,
            key_columns=tuple(json.loads(meta["key_columns"])),
            rows=rows,
            schema_version=int(meta["schema_version"]),
            invisible_txids=frozenset(txids),
        )

    def open_window(self, window_id: str, token: int) -> bool:
        """The tailer met lw: registered -> open. False if the window is not registered (ended,
        expired, or lw seen twice). Raises `FencedOut` if `token` no longer holds the lease."""
        return self._move(window_id, WindowState.OPEN, "", token, WindowState.REGISTERED)

    def claim_window(self, window_id: str, token: int) -> bool:
        """The tailer met hw: open -> closing, before it emits a single chunk row. From here the
        dump can no longer abandon the window. Exactly one of this and `abandon_window` wins a
        race; False means the window ended first (abandoned, say): drop it, emit nothing."""
        return self._move(window_id, WindowState.CLOSING, "", token, WindowState.OPEN)

    def close_window(self, window_id: str, token: int) -> bool:
        """The output has made the chunk's events durable: closing -> closed. Only now may the
        dump count the chunk as complete and move its progress. Deletes the chunk rows."""
        return self._move(window_id, WindowState.CLOSED, "", token, WindowState.CLOSING)

    def fail_window(self, window_id: str, reason: str, token: int) -> bool:
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

    def abandon_window(self, window_id: str, reason: str = "the dump stopped waiting") -> bool:
        """The dump gave up waiting for the window: registered/open -> abandoned. Exactly one of
        `claim_window` and this wins a race; False means the tailer claimed or ended the window
        first: read its state, and if it is closing, wait for the tailer to close it."""
        return self._move(
            window_id,
            WindowState.ABANDONED,
            reason,
            None,
            WindowState.REGISTERED,
            WindowState.OPEN,
        )

    @_reachable
    def _move(
        self,
        window_id: str,
        to: WindowState,
        reason: str,
        token: int | None,
        *allowed: WindowState,
    ) -> bool:
        result = self._transition(
            keys=self._window_keys(window_id),
            args=["" if token is None else token, to.value, reason, *(s.value for s in allowed)],
        )
        if result == -1:
            raise FencedOut(
                f"tailer token {token} of source {self.source} is fenced out: a newer tailer "
                f"holds the lease; window {window_id} was not moved to {to}"
            )
        return bool(result == 1)

    @_reachable
    def window_state(self, window_id: str) -> WindowStatus | None:
        """The window's state and why it ended (empty unless failed or abandoned); None if the
        window is unknown (never registered, or expired)."""
        raw = self._r.hgetall(self._window_key(window_id))
        if not raw:
            return None
        data = _hash(raw)
        return WindowStatus(
            window=Window(data["window_id"], data["dump_id"], TableRef.parse(data["table"])),
            state=WindowState(data["state"]),
            reason=data["reason"],
            chunk=json.loads(data["chunk"]),
            registered_ms=int(data["registered_ms"]),
            updated_ms=int(data["updated_ms"]),
        )

    def wait_window(self, window_id: str, timeout_s: float) -> WindowStatus:
        """Wait until the window ends or `timeout_s` passes; returns its state then (still
        registered or open on a timeout: the dump abandons it next). Blocks on the window's
        `ended` list (BLMOVE onto itself, so every waiter wakes and none consumes the signal)
        and reads the state again at least every second, so a lost signal costs one second."""
        deadline = time.monotonic() + timeout_s
        ended_key = self._window_key(window_id, ":ended")
        while True:
            status = self.window_state(window_id)
            if status is None:
                raise UnknownWindow(f"window {window_id} is not registered (or expired)")
            remaining = deadline - time.monotonic()
            if status.state.ended or remaining <= 0:
                return status
            self._block(ended_key, min(remaining, _WAIT_SLICE_S))

    @_reachable
    def _block(self, key: str, timeout_s: float) -> None:
        # BLMOVE takes a fractional timeout; redis-py's blmove() is typed for whole seconds.
        self._r.execute_command(  # type: ignore[no-untyped-call]
            "BLMOVE", key, key, "LEFT", "RIGHT", max(timeout_s, 0.01)
        )

    # -- dump requests ------------------------------------------------------------------------

    @_reachable
    def create_dump(
        self,
        request: DumpRequest,
        key_columns: Mapping[TableRef, Sequence[str]] | None = None,
    ) -> None:
        """Store a new dump request, pending, with controls from the request (chunk_size) and
        no throttle. `key_columns` are the tables' primary-key columns when the request was
        checked, so the dump reads keys with the same columns the person gave them for."""
        columns = {str(t): list(c) for t, c in (key_columns or {}).items()}
        stored = {"request": _request_to_json(request), "key_columns": columns}
        done = self._create_dump(
            keys=[
                self._dump_key(request.dump_id),
                self._dump_key(request.dump_id, ":status"),
                self._dump_key(request.dump_id, ":controls"),
                self.prefix + "dumps",
            ],
            args=[request.dump_id, _dumps(stored), request.chunk_size],
        )
        if not done:
            raise AlreadyExists(f"dump {request.dump_id} already exists")

    @_reachable
    def get_dump(self, dump_id: str) -> StoredDump | None:
        raw = self._r.get(self._dump_key(dump_id))
        if raw is None:
            return None
        data = json.loads(raw)
        return StoredDump(
            request=_request_from_json(data["request"]),
            key_columns={TableRef.parse(t): tuple(c) for t, c in data["key_columns"].items()},
        )

    @_reachable
    def list_dumps(self) -> list[str]:
        """Dump ids, oldest first."""
        return [_text(d) for d in self._r.lrange(self.prefix + "dumps", 0, -1)]

    @_reachable
    def save_progress(self, dump_id: str, progress: TableProgress) -> None:
        """Store a table's durable progress; call it after the window closed."""
        self._r.hset(
            self._dump_key(dump_id, ":progress"), str(progress.table), _dumps(progress.to_json())
        )

    @_reachable
    def load_progress(self, dump_id: str) -> dict[TableRef, TableProgress]:
        raw = _hash(self._r.hgetall(self._dump_key(dump_id, ":progress")))
        return {TableRef.parse(t): TableProgress.from_json(json.loads(p)) for t, p in raw.items()}

    @_reachable
    def dump_status(self, dump_id: str) -> DumpStatus | None:
        return _dump_status(self._r.hgetall(self._dump_key(dump_id, ":status")))

    @_reachable
    def mark_dump(self, dump_id: str, state: DumpState, reason: str = "") -> bool:
        """The dump process reports its state (running, paused, failed with a reason, done).
        A finished dump (done, failed, cancelled) stays finished: False then, e.g. when the
        dump was cancelled before its process started. The first `running` sets started_ms."""
        result = self._mark_dump(
            keys=[self._dump_key(dump_id, ":status")], args=[state.value, reason]
        )
        if result == -1:
            raise UnknownDump(f"no dump {dump_id}")
        return bool(result)

    @_reachable
    def count_dump(
        self, dump_id: str, *, chunks: int = 0, rows: int = 0, windows_retried: int = 0
    ) -> None:
        """Add to the dump's counters, all at once."""
        result = self._count_dump(
            keys=[self._dump_key(dump_id, ":status")], args=[chunks, rows, windows_retried]
        )
        if result == -1:
            raise UnknownDump(f"no dump {dump_id}")

    @_reachable
    def reopen_dump(self, dump_id: str) -> bool:
        """Make a failed, cancelled or interrupted dump pending again (pause and cancel
        cleared, progress kept), so that running it again resumes it. False if it is done."""
        result = self._reopen_dump(
            keys=[self._dump_key(dump_id, ":status"), self._dump_key(dump_id, ":controls")]
        )
        if result == -1:
            raise UnknownDump(f"no dump {dump_id}")
        return bool(result)

    @_reachable
    def beat_dump(self, dump_id: str, owner: str, ttl_ms: int) -> None:
        """The process running the dump says it is alive; without a beat within `ttl_ms` it
        counts as gone (whoever waits on the dump can then tell a dead driver from a slow
        chunk)."""
        self._r.set(self._dump_key(dump_id, ":driver"), owner, px=ttl_ms)

    @_reachable
    def dump_driver(self, dump_id: str) -> str | None:
        """The process running the dump, or None if none beat within its TTL."""
        raw = self._r.get(self._dump_key(dump_id, ":driver"))
        return None if raw is None else _text(raw)

    # -- dump controls ------------------------------------------------------------------------

    def pause_dump(self, dump_id: str) -> bool:
        """Ask the dump to stop between chunks until resumed. False if it has finished."""
        return self._set_controls(dump_id, paused=1)

    def resume_dump(self, dump_id: str) -> bool:
        return self._set_controls(dump_id, paused=0)

    def cancel_dump(self, dump_id: str) -> bool:
        """Ask the dump to stop for good; a pending dump is cancelled at once."""
        return self._set_controls(dump_id, cancelled=1)

    def throttle_dump(
        self,
        dump_id: str,
        *,
        chunk_size: int | None = None,
        delay_ms: int | None = None,
        max_rows_per_s: float | None = None,
    ) -> bool:
        """Change the pace of a running dump from its next chunk on. None leaves a setting as
        it is; `max_rows_per_s=0` lifts the rate limit."""
        changes: dict[str, int | float] = {}
        if chunk_size is not None:
            if chunk_size < 1:
                raise InvalidRequest(f"chunk_size must be at least 1, got {chunk_size}")
            changes["chunk_size"] = chunk_size
        if delay_ms is not None:
            if delay_ms < 0:
                raise InvalidRequest(f"delay_ms must not be negative, got {delay_ms}")
            changes["delay_ms"] = delay_ms
        if max_rows_per_s is not None:
            if max_rows_per_s < 0:
                raise InvalidRequest(f"max_rows_per_s must not be negative, got {max_rows_per_s}")
            changes["max_rows_per_s"] = max_rows_per_s
        if not changes:
            raise InvalidRequest("throttle_dump needs at least one setting")
        return self._set_controls(dump_id, **changes)

    @_reachable
    def _set_controls(self, dump_id: str, **changes: int | float) -> bool:
        result = self._control(
            keys=[self._dump_key(dump_id, ":status"), self._dump_key(dump_id, ":controls")],
            args=[item for pair in changes.items() for item in pair],
        )
        if result == -1:
            raise UnknownDump(f"no dump {dump_id}")
        return bool(result)

    @_reachable
    def controls(self, dump_id: str) -> DumpControls | None:
        raw = self._r.hgetall(self._dump_key(dump_id, ":controls"))
        if not raw:
            return None
        data = _hash(raw)
        rate = float(data["max_rows_per_s"])
        return DumpControls(
            paused=data["paused"] == "1",
            cancelled=data["cancelled"] == "1",
            chunk_size=int(data["chunk_size"]),
            delay_ms=int(data["delay_ms"]),
            max_rows_per_s=rate if rate > 0 else None,
        )

    # -- the tailer: checkpoint, lease, heartbeat ---------------------------------------------

    @_reachable
    def save_checkpoint(self, commit: int, token: int) -> None:
        """Store the commit position the tailer restarts from. Raises `FencedOut` if `token` no
        longer holds the lease (a stale leader must not move the checkpoint)."""
        result = self._checkpoint(
            keys=[self.prefix + "tailer:checkpoint", self.prefix + "tailer:token"],
            args=[token, commit],
        )
        if result == -1:
            raise FencedOut(
                f"tailer token {token} of source {self.source} is fenced out: a newer tailer "
                f"holds the lease; checkpoint {commit} was not saved"
            )

    @_reachable
    def load_checkpoint(self) -> int | None:
        raw = self._r.get(self.prefix + "tailer:checkpoint")
        return None if raw is None else int(raw)

    @_reachable
    def acquire_lease(self, owner: str, ttl_ms: int) -> int | None:
        """Become the active tailer if nobody is: returns a fencing token larger than every
        token handed out before, or None while someone (this owner included) holds the lease.
        Use an owner name unique to the process (host, pid, a random suffix)."""
        token = int(
            self._acquire(
                keys=[self.prefix + "tailer:lease", self.prefix + "tailer:token"],
                args=[owner, ttl_ms],
            )
        )
        return token or None

    @_reachable
    def renew_lease(self, owner: str, token: int, ttl_ms: int) -> bool:
        """Extend the lease; False if it is no longer ours (expired, or taken): stop at once."""
        return bool(
            self._renew_or_release(keys=[self.prefix + "tailer:lease"], args=[owner, token, ttl_ms])
        )

    @_reachable
    def release_lease(self, owner: str, token: int) -> bool:
        """Give the lease up so a standby takes over without waiting for the TTL."""
        return bool(
            self._renew_or_release(keys=[self.prefix + "tailer:lease"], args=[owner, token, ""])
        )

    @_reachable
    def heartbeat(self, owner: str, metrics: Mapping[str, JsonValue], ttl_s: float = 30) -> None:
        """The active tailer says it is alive, with its metrics (last commit, lag_ms,
        events_per_s, open_windows, ...). Without a beat within `ttl_s` it counts as gone."""
        self._heartbeat(
            keys=[self.prefix + "tailer:heartbeat"],
            args=[owner, _dumps(dict(metrics)), _ttl_ms(ttl_s)],
        )

    @_reachable
    def tailer_health(self) -> dict[str, JsonValue] | None:
        """`{"owner", "at_ms", "age_ms", "metrics"}` of the last heartbeat (age on the Redis
        clock), or None if there was none within its TTL."""
        with self._r.pipeline(transaction=False) as pipe:
            pipe.hgetall(self.prefix + "tailer:heartbeat")
            pipe.time()
            raw, now = pipe.execute()
        return _tailer_health(raw, now)


class AsyncStateReader:
    """What Airflow's triggers poll, on an asyncio Redis client: dump status, whether its
    driver is alive, tailer health. Read only; the same keys and parsing as `StateStore`."""

    def __init__(self, client: redis.asyncio.Redis, source: str) -> None:
        self._r = client
        self.prefix = _prefix(source)

    async def dump_status(self, dump_id: str) -> DumpStatus | None:
        return _dump_status(await self._r.hgetall(_dump_key(self.prefix, dump_id, ":status")))

    async def dump_driver(self, dump_id: str) -> str | None:
        raw = await self._r.get(_dump_key(self.prefix, dump_id, ":driver"))
        return None if raw is None else _text(raw)

    async def tailer_health(self) -> dict[str, JsonValue] | None:
        async with self._r.pipeline(transaction=False) as pipe:
            pipe.hgetall(self.prefix + "tailer:heartbeat")
            pipe.time()
            raw, now = await pipe.execute()
        return _tailer_health(raw, now)
