"""Dump requests and what their run leaves: status and counters, progress per table, the
controls Airflow and the CLI change while it runs, and the beat of the process running it.

Dump records do not expire: they are small, and they are the history Airflow shows.

Durability (see the package's docstring for what a crash of Redis loses):

- dump progress or counters lost: the dump resumes from an earlier chunk and reads some rows
  again (duplicates, never gaps: progress is saved after the window closed, so it never
  survives the close it depends on). The status's `chunks` and `rows` are the sums of the
  tables' `chunks_done` and `rows_done`: each save of a table's progress moves them by its
  difference from the one stored, not by one chunk, so what a lost write took is counted
  again by the table's next save (a dump that completes saves every table's once more).
- dump request, status or controls lost: the last second of Airflow's writes; the caller sees
  the request missing or a control not applied and asks again.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from airflow_provider_dblog.core.direct import DumpMode
from airflow_provider_dblog.core.dump_plan import (
    DumpKind,
    DumpRequest,
    TableProgress,
    checked_chunk_size,
)
from airflow_provider_dblog.core.errors import InvalidRequest
from airflow_provider_dblog.core.event import JsonValue, TableRef, freeze
from airflow_provider_dblog.state.base import (
    NOW_MS,
    RedisStore,
    compact_json,
    decode_hash,
    reachable,
    text,
)
from airflow_provider_dblog.state.errors import AlreadyExists, UnknownDump


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

    def to_json(self, dump_id: str) -> dict[str, JsonValue]:
        """The dump's status as `dblog status` and the live view both show it."""
        return {
            "dump_id": dump_id,
            "state": self.state.value,
            "reason": self.reason,
            "chunks": self.chunks,
            "rows": self.rows,
            "windows_retried": self.windows_retried,
            "created_ms": self.created_ms,
            "started_ms": self.started_ms,
            "finished_ms": self.finished_ms,
            "updated_ms": self.updated_ms,
        }


@dataclass(frozen=True, slots=True)
class DumpControls:
    """What the dump obeys between chunks. `max_rows_per_s` None means no limit. `chunk_size`
    is the one place a dump's chunk size is stored: the request's when it is created, a
    throttle's after; the request read back (`DumpStore.get`) carries it."""

    paused: bool
    cancelled: bool
    chunk_size: int
    delay_ms: int
    max_rows_per_s: float | None

    def to_json(self) -> dict[str, JsonValue]:
        """The controls as `dblog status --dump` and the live view both show them."""
        return {
            "paused": self.paused,
            "cancelled": self.cancelled,
            "chunk_size": self.chunk_size,
            "delay_ms": self.delay_ms,
            "max_rows_per_s": self.max_rows_per_s,
        }


def dump_status_from(raw: Mapping[bytes | str, bytes | str]) -> DumpStatus | None:
    """A dump's status from its `dump:<id>:status` hash; None if there is none."""
    if not raw:
        return None
    data = decode_hash(raw)
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


def dump_progress_from(raw: Mapping[bytes | str, bytes | str]) -> dict[TableRef, TableProgress]:
    """The progress of a dump's tables from its `dump:<id>:progress` hash."""
    data = decode_hash(raw)
    return {TableRef.parse(t): TableProgress.from_json(json.loads(p)) for t, p in data.items()}


def stored_dump_from(raw: bytes | str | None, chunk_size: bytes | str | None) -> StoredDump | None:
    """A dump's request and key columns from its `dump:<id>` value, with the chunk size its
    controls hold (`chunk_size`; a request stored when the request kept one too reads its own
    if the controls have none); None if there is none."""
    if raw is None:
        return None
    data = json.loads(raw)
    request = data["request"]
    return StoredDump(
        request=_request_from_json(
            request, request["chunk_size"] if chunk_size is None else int(chunk_size)
        ),
        key_columns={TableRef.parse(t): tuple(c) for t, c in data["key_columns"].items()},
    )


def _optional_int(value: str | None) -> int | None:
    return None if value is None else int(value)


def _request_to_json(request: DumpRequest) -> dict[str, JsonValue]:
    return {
        "dump_id": request.dump_id,
        "kind": request.kind.value,
        "tables": [str(t) for t in request.tables],
        "keys": [list(k) for k in request.keys],
        "parallelism": request.parallelism,
        "mode": request.mode.value,
        "where": request.where,
        "read_only": request.read_only,
    }


def _request_from_json(data: dict[str, Any], chunk_size: int) -> DumpRequest:
    return DumpRequest(
        dump_id=data["dump_id"],
        kind=DumpKind(data["kind"]),
        tables=tuple(TableRef.parse(t) for t in data["tables"]),
        keys=tuple(tuple(freeze(v) for v in k) for k in data["keys"]),
        chunk_size=chunk_size,
        parallelism=data["parallelism"],
        mode=DumpMode(data.get("mode", DumpMode.SEQUENCED)),
        where=data.get("where"),
        read_only=data.get("read_only", False),
    )


_UNFINISHED = """
local finished = {cancelled = true, failed = true, done = true}
local state = redis.call('HGET', KEYS[1], 'state')
if not state then return -1 end
if finished[state] then return 0 end
"""
"""Lua: the dump's `state` from its status hash (KEYS[1]); returns -1 if there is no such dump,
0 if it has finished (a finished dump takes no more changes)."""

# KEYS: status. ARGV: state, reason. Returns 1, 0 (finished already), -1 (no such run). A
# verify run's state is marked the same way (`VerifyStore`).
MARK_STATE = (
    NOW_MS
    + _UNFINISHED
    + """
redis.call('HSET', KEYS[1], 'state', ARGV[1], 'reason', ARGV[2], 'updated_ms', now)
if ARGV[1] == 'running' and redis.call('HEXISTS', KEYS[1], 'started_ms') == 0 then
  redis.call('HSET', KEYS[1], 'started_ms', now)
end
if finished[ARGV[1]] then redis.call('HSET', KEYS[1], 'finished_ms', now) end
return 1
"""
)

# KEYS: status, controls. ARGV: control field/value pairs. Returns 1, 0 (finished), -1 (no
# such run). A pending dump that is cancelled ends at once: no dump process runs yet to notice
# it. A verify run's controls are set the same way (`VerifyStore`).
SET_CONTROLS = (
    NOW_MS
    + _UNFINISHED
    + """
redis.call('HSET', KEYS[2], unpack(ARGV))
if state == 'pending' and redis.call('HGET', KEYS[2], 'cancelled') == '1' then
  redis.call('HSET', KEYS[1], 'state', 'cancelled', 'reason', 'cancelled before it started',
             'updated_ms', now, 'finished_ms', now)
end
return 1
"""
)


class DumpStore(RedisStore):
    """The dump requests of one source, their status, progress, controls and driver."""

    # KEYS: request, status, controls, index. ARGV: dump_id, request json, chunk_size.
    _CREATE = (
        NOW_MS
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

    @reachable
    def create(
        self,
        request: DumpRequest,
        key_columns: Mapping[TableRef, Sequence[str]] | None = None,
    ) -> None:
        """Store a new dump request, pending, with controls from the request (chunk_size) and
        no throttle. `key_columns` are the tables' primary-key columns when the request was
        checked, so the dump reads keys with the same columns the person gave them for."""
        columns = {str(t): list(c) for t, c in (key_columns or {}).items()}
        stored = {"request": _request_to_json(request), "key_columns": columns}
        done = self._eval(
            self._CREATE,
            keys=[
                self.keys.dump(request.dump_id),
                self.keys.dump_status(request.dump_id),
                self.keys.dump_controls(request.dump_id),
                self.keys.dumps,
            ],
            args=[request.dump_id, compact_json(stored), request.chunk_size],
        )
        if not done:
            raise AlreadyExists(f"dump {request.dump_id} already exists")

    @reachable
    def get(self, dump_id: str) -> StoredDump | None:
        """The request (its chunk size the controls') and the key columns."""
        with self._r.pipeline(transaction=False) as pipe:
            pipe.get(self.keys.dump(dump_id))
            pipe.hget(self.keys.dump_controls(dump_id), "chunk_size")
            raw, chunk_size = pipe.execute()
        return stored_dump_from(raw, chunk_size)

    @reachable
    def ids(self) -> list[str]:
        """Dump ids, oldest first."""
        return [text(d) for d in self._r.lrange(self.keys.dumps, 0, -1)]

    # KEYS: progress, status. ARGV: table, progress JSON, its chunks_done and rows_done, '1' if
    # a chunk ended (a running dump's note is cleared). Returns 1, or -1 (no such dump). The
    # counters move by the difference from the table's stored progress: they stay its sums.
    _SAVE_PROGRESS = """
if redis.call('EXISTS', KEYS[2]) == 0 then return -1 end
local chunks, rows = 0, 0
local stored = redis.call('HGET', KEYS[1], ARGV[1])
if stored then
  local was = cjson.decode(stored)
  chunks, rows = was.chunks_done, was.rows_done
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('HINCRBY', KEYS[2], 'chunks', string.format('%d', ARGV[3] - chunks))
redis.call('HINCRBY', KEYS[2], 'rows', string.format('%d', ARGV[4] - rows))
if ARGV[5] == '1' and redis.call('HGET', KEYS[2], 'state') == 'running' then
  redis.call('HSET', KEYS[2], 'reason', '')
end
return 1
"""

    @reachable
    def save_progress(self, dump_id: str, progress: TableProgress) -> None:
        """Store a table's durable progress (call it after the window closed), and the dump's
        counters with it (see the module's docstring)."""
        self._save_progress(dump_id, progress, chunk_ended=False)

    @reachable
    def chunk_done(self, dump_id: str, progress: TableProgress) -> None:
        """A chunk ended: its table's progress and the dump's counters move in one step, so a
        dump killed at any moment never counts a chunk it will read again, nor misses one. A
        running dump's `note` is cleared: it moves again."""
        self._save_progress(dump_id, progress, chunk_ended=True)

    def _save_progress(self, dump_id: str, progress: TableProgress, *, chunk_ended: bool) -> None:
        result = self._eval(
            self._SAVE_PROGRESS,
            keys=[self.keys.dump_progress(dump_id), self.keys.dump_status(dump_id)],
            args=[
                str(progress.table),
                compact_json(progress.to_json()),
                progress.chunks_done,
                progress.rows_done,
                int(chunk_ended),
            ],
        )
        if result == -1:
            raise UnknownDump(f"no dump {dump_id}")

    @reachable
    def load_progress(self, dump_id: str) -> dict[TableRef, TableProgress]:
        return dump_progress_from(self._r.hgetall(self.keys.dump_progress(dump_id)))

    @reachable
    def status(self, dump_id: str) -> DumpStatus | None:
        return dump_status_from(self._r.hgetall(self.keys.dump_status(dump_id)))

    # KEYS: status. ARGV: the note. 1: noted; 0: not running.
    _NOTE = """
if redis.call('HGET', KEYS[1], 'state') ~= 'running' then return 0 end
redis.call('HSET', KEYS[1], 'reason', ARGV[1])
return 1
"""

    @reachable
    def note(self, dump_id: str, why: str) -> bool:
        """What a running dump waits for (a chunk retried: a source or replica behind or away,
        a window not closed), kept as its reason, which `dblog status` and the live view show,
        until its next chunk ends. False if the dump is not running."""
        return bool(self._eval(self._NOTE, keys=[self.keys.dump_status(dump_id)], args=[why]))

    @reachable
    def mark(self, dump_id: str, state: DumpState, reason: str = "") -> bool:
        """The dump process reports its state (running, paused, failed with a reason, done).
        A finished dump (done, failed, cancelled) stays finished: False then, e.g. when the
        dump was cancelled before its process started. The first `running` sets started_ms."""
        result = self._eval(
            MARK_STATE, keys=[self.keys.dump_status(dump_id)], args=[state.value, reason]
        )
        if result == -1:
            raise UnknownDump(f"no dump {dump_id}")
        return bool(result)

    # KEYS: status. ARGV: chunks, rows, windows_retried. Returns 1, or -1 (no such dump).
    _COUNT = """
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
redis.call('HINCRBY', KEYS[1], 'chunks', ARGV[1])
redis.call('HINCRBY', KEYS[1], 'rows', ARGV[2])
redis.call('HINCRBY', KEYS[1], 'windows_retried', ARGV[3])
return 1
"""

    @reachable
    def count(
        self, dump_id: str, *, chunks: int = 0, rows: int = 0, windows_retried: int = 0
    ) -> None:
        """Add to the dump's counters, all at once."""
        result = self._eval(
            self._COUNT,
            keys=[self.keys.dump_status(dump_id)],
            args=[chunks, rows, windows_retried],
        )
        if result == -1:
            raise UnknownDump(f"no dump {dump_id}")

    # KEYS: status, controls. ARGV: none. Returns 1, 0 (done: nothing to run again), -1 (no such
    # dump). A failed or cancelled dump, or one whose process died, becomes pending again with
    # its pause and cancel cleared; its progress is kept, so the next run resumes from it.
    _REOPEN = (
        NOW_MS
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

    @reachable
    def reopen(self, dump_id: str) -> bool:
        """Make a failed, cancelled or interrupted dump pending again (pause and cancel
        cleared, progress kept), so that running it again resumes it. False if it is done."""
        result = self._eval(
            self._REOPEN,
            keys=[self.keys.dump_status(dump_id), self.keys.dump_controls(dump_id)],
        )
        if result == -1:
            raise UnknownDump(f"no dump {dump_id}")
        return bool(result)

    @reachable
    def beat(self, dump_id: str, owner: str, ttl_ms: int) -> None:
        """The process running the dump says it is alive; without a beat within `ttl_ms` it
        counts as gone (whoever waits on the dump can then tell a dead driver from a slow
        chunk)."""
        self._r.set(self.keys.dump_driver(dump_id), owner, px=ttl_ms)

    # KEYS: driver. ARGV: owner. Deletes the driver's beat if it is still this owner's.
    _UNBEAT = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

    @reachable
    def unbeat(self, dump_id: str, owner: str) -> None:
        """The process running the dump has stopped running it: it no longer counts as its
        driver (a run started right after, from `dblog ui` say, need not wait for the beat
        to expire). Another owner's beat is left alone."""
        self._eval(self._UNBEAT, keys=[self.keys.dump_driver(dump_id)], args=[owner])

    @reachable
    def driver(self, dump_id: str) -> str | None:
        """The process running the dump, or None if none beat within its TTL."""
        raw = self._r.get(self.keys.dump_driver(dump_id))
        return None if raw is None else text(raw)

    @reachable
    def record_origin(self, dump_id: str, origin: Mapping[str, JsonValue]) -> None:
        """Who asked for the dump, when it was not `dblog dump` (Airflow: the DAG run and task,
        and their URLs), for the live view to link back to. Written again by each try."""
        self._r.set(self.keys.dump_origin(dump_id), compact_json(dict(origin)))

    @reachable
    def origin(self, dump_id: str) -> dict[str, JsonValue] | None:
        """What `record_origin` recorded; None for a dump nobody recorded one for."""
        raw = self._r.get(self.keys.dump_origin(dump_id))
        if raw is None:
            return None
        origin: dict[str, JsonValue] = json.loads(raw)
        return origin

    # -- controls ------------------------------------------------------------------------------

    def pause(self, dump_id: str) -> bool:
        """Ask the dump to stop between chunks until resumed. False if it has finished."""
        return self._set_controls(dump_id, {"paused": 1})

    def resume(self, dump_id: str) -> bool:
        return self._set_controls(dump_id, {"paused": 0})

    def cancel(self, dump_id: str) -> bool:
        """Ask the dump to stop for good; a pending dump is cancelled at once."""
        return self._set_controls(dump_id, {"cancelled": 1})

    def throttle(
        self,
        dump_id: str,
        *,
        chunk_size: int | None = None,
        delay_ms: int | None = None,
        max_rows_per_s: float | None = None,
    ) -> bool:
        """Change the pace of a running dump from its next chunk on. None leaves a setting as
        it is; `max_rows_per_s=0` lifts the rate limit."""
        changes = throttle_changes(chunk_size, delay_ms, max_rows_per_s)
        return self._set_controls(dump_id, changes)

    @reachable
    def _set_controls(self, dump_id: str, changes: Mapping[str, int | float]) -> bool:
        result = self._eval(
            SET_CONTROLS,
            keys=[self.keys.dump_status(dump_id), self.keys.dump_controls(dump_id)],
            args=[item for pair in changes.items() for item in pair],
        )
        if result == -1:
            raise UnknownDump(f"no dump {dump_id}")
        return bool(result)

    @reachable
    def controls(self, dump_id: str) -> DumpControls | None:
        return controls_from(self._r.hgetall(self.keys.dump_controls(dump_id)))


def controls_from(raw: Mapping[bytes | str, bytes | str]) -> DumpControls | None:
    """A run's controls from their hash (a dump's, a verify run's); None if there is none."""
    if not raw:
        return None
    data = decode_hash(raw)
    rate = float(data["max_rows_per_s"])
    return DumpControls(
        paused=data["paused"] == "1",
        cancelled=data["cancelled"] == "1",
        chunk_size=int(data["chunk_size"]),
        delay_ms=int(data["delay_ms"]),
        max_rows_per_s=rate if rate > 0 else None,
    )


def throttle_changes(
    chunk_size: int | None, delay_ms: int | None, max_rows_per_s: float | None
) -> dict[str, int | float]:
    """A throttle's settings checked, as control fields; None leaves a setting as it is."""
    changes: dict[str, int | float] = {}
    if chunk_size is not None:
        changes["chunk_size"] = checked_chunk_size(chunk_size)
    if delay_ms is not None:
        if delay_ms < 0:
            raise InvalidRequest(f"delay_ms must not be negative, got {delay_ms}")
        changes["delay_ms"] = delay_ms
    if max_rows_per_s is not None:
        if max_rows_per_s < 0:
            raise InvalidRequest(f"max_rows_per_s must not be negative, got {max_rows_per_s}")
        changes["max_rows_per_s"] = max_rows_per_s
    if not changes:
        raise InvalidRequest("a throttle needs at least one setting")
    return changes
