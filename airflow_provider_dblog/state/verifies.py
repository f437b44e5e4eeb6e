"""Verify runs: the request, its status, its controls, where each table stands, the counts per
table and every differing key found.

A chunk's verdict is saved in one MULTI/EXEC with the table's progress past it: a run that dies
resumes from the chunk after the last one saved, and no chunk is counted twice or half. Like dump
records, verify records do not expire: they are the history a person reads.

The controls (pause, cancel, chunk size, delay, rows/s) are a dump's (`state/dumps.py`): the same
hash, set by the same script, read by the runner between chunks.

Durability (see the package's docstring): a lost chunk save is a chunk verified again by the
resumed run, counted once; a lost status write is a run that looks still running, and runs again
from its progress when asked.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from airflow_provider_dblog.core.event import JsonValue, Key, TableRef, freeze
from airflow_provider_dblog.core.verify import ChunkVerdict, Difference
from airflow_provider_dblog.state.base import (
    NOW_MS,
    RedisStore,
    compact_json,
    decode_hash,
    reachable,
    text,
)
from airflow_provider_dblog.state.dumps import (
    MARK_STATE,
    SET_CONTROLS,
    DumpControls,
    controls_from,
    throttle_changes,
)
from airflow_provider_dblog.state.errors import AlreadyExists

COUNTERS = ("checked", "in_flux", *(kind.value for kind in Difference))
"""The counts kept per table, in the order a report shows them."""


class VerifyState(StrEnum):
    RUNNING = "running"
    PAUSED = "paused"
    CANCELLED = "cancelled"
    FAILED = "failed"
    DONE = "done"

    @property
    def finished(self) -> bool:
        return self in (VerifyState.CANCELLED, VerifyState.FAILED, VerifyState.DONE)


@dataclass(frozen=True, slots=True)
class VerifyStatus:
    state: VerifyState
    reason: str
    chunks: int
    windows_retried: int
    created_ms: int
    finished_ms: int | None
    removed: int = 0
    """Keys its repair removed from the target (`verify/repair.py`)."""
    repair_dumps: tuple[str, ...] | None = None
    """The key dumps its repair started, one a table with keys to re-send; None: no repair."""


@dataclass(frozen=True, slots=True)
class FoundDifference:
    table: TableRef
    kind: Difference
    key: Key


class VerifyStore(RedisStore):
    """The verify runs of one source."""

    # KEYS: request, status, list, controls. ARGV: id, request JSON, chunk size ('' for no
    # controls). 0 when the run exists.
    _CREATE = (
        NOW_MS
        + """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('SET', KEYS[1], ARGV[2])
redis.call('HSET', KEYS[2], 'state', 'running', 'reason', '', 'chunks', 0,
           'windows_retried', 0, 'created_ms', now, 'updated_ms', now)
redis.call('RPUSH', KEYS[3], ARGV[1])
if ARGV[3] ~= '' then
  redis.call('HSET', KEYS[4], 'paused', 0, 'cancelled', 0, 'chunk_size', ARGV[3],
             'delay_ms', 0, 'max_rows_per_s', 0)
end
return 1
"""
    )

    @reachable
    def create(self, verify_id: str, request: Mapping[str, JsonValue]) -> None:
        """Store a new run's request, running, with controls when the request has a
        `chunk_size` (unpaused, unthrottled); `AlreadyExists` if the id is taken."""
        chunk_size = request.get("chunk_size")
        created = self._eval(
            self._CREATE,
            keys=[
                self.keys.verify(verify_id),
                self.keys.verify_part(verify_id, "status"),
                self.keys.verifies,
                self.keys.verify_part(verify_id, "controls"),
            ],
            args=[verify_id, compact_json(dict(request)), "" if chunk_size is None else chunk_size],
        )
        if created == 0:
            raise AlreadyExists(f"verify run {verify_id} exists")

    @reachable
    def request(self, verify_id: str) -> dict[str, JsonValue] | None:
        raw = self._r.get(self.keys.verify(verify_id))
        return None if raw is None else dict(json.loads(text(raw)))

    @reachable
    def status(self, verify_id: str) -> VerifyStatus | None:
        raw = self._r.hgetall(self.keys.verify_part(verify_id, "status"))
        if not raw:
            return None
        data = decode_hash(raw)
        finished = data.get("finished_ms")
        return VerifyStatus(
            VerifyState(data["state"]),
            data["reason"],
            int(data["chunks"]),
            int(data["windows_retried"]),
            int(data["created_ms"]),
            None if finished is None else int(finished),
            int(data.get("removed", 0)),
            None if "repair_dumps" not in data else tuple(data["repair_dumps"].split()),
        )

    @reachable
    def progress(self, verify_id: str) -> dict[TableRef, dict[str, JsonValue]]:
        """Where each table's verify stands, as the runner saved it."""
        raw = decode_hash(self._r.hgetall(self.keys.verify_part(verify_id, "progress")))
        return {TableRef.parse(table): json.loads(saved) for table, saved in raw.items()}

    @reachable
    def chunk_done(
        self,
        verify_id: str,
        table: TableRef,
        progress: Mapping[str, JsonValue],
        *verdicts: ChunkVerdict,
    ) -> None:
        """Chunks' verdicts, in the order their chunks were planned, and their table's progress
        past them, in one transaction."""
        counts = self.keys.verify_part(verify_id, "counts")
        pipe = self._r.pipeline(transaction=True)
        pipe.hset(
            self.keys.verify_part(verify_id, "progress"), str(table), compact_json(dict(progress))
        )
        found = dict.fromkeys(COUNTERS, 0)
        differences = []
        for verdict in verdicts:
            found["checked"] += verdict.checked
            found["in_flux"] += verdict.in_flux
            for kind in Difference:
                found[kind.value] += verdict.count(kind)
            differences += [
                compact_json([str(table), kind.value, list(key)])
                for key, kind in verdict.differences
            ]
        for counter, value in found.items():
            if value:
                pipe.hincrby(counts, f"{table} {counter}", value)
        if differences:
            pipe.rpush(self.keys.verify_part(verify_id, "diffs"), *differences)
        pipe.hincrby(self.keys.verify_part(verify_id, "status"), "chunks", len(verdicts))
        pipe.execute()

    @reachable
    def repair_started(self, verify_id: str, removed: int, dump_ids: Sequence[str]) -> None:
        """The run's repair removed `removed` keys from the target and stored `dump_ids`, the
        key dumps that re-send the rest: recorded once, before the dumps run, so a repair
        that dies resumes them rather than starting again."""
        self._r.hset(
            self.keys.verify_part(verify_id, "status"),
            mapping={"removed": removed, "repair_dumps": " ".join(dump_ids)},
        )

    @reachable
    def retried(self, verify_id: str) -> None:
        """A chunk's windows failed and it is read again."""
        self._r.hincrby(self.keys.verify_part(verify_id, "status"), "windows_retried", 1)

    # KEYS: status. ARGV: state, reason.
    _FINISH = (
        NOW_MS
        + """
redis.call('HSET', KEYS[1], 'state', ARGV[1], 'reason', ARGV[2], 'finished_ms', now,
           'updated_ms', now)
return 1
"""
    )

    @reachable
    def finish(self, verify_id: str, state: VerifyState, reason: str = "") -> None:
        self._eval(
            self._FINISH,
            keys=[self.keys.verify_part(verify_id, "status")],
            args=[state.value, reason],
        )

    @reachable
    def mark(self, verify_id: str, state: VerifyState) -> bool:
        """The runner reports the run's state (running, paused); False once it has finished."""
        status = self.keys.verify_part(verify_id, "status")
        return bool(self._eval(MARK_STATE, keys=[status], args=[state.value, ""]) == 1)

    # KEYS: status, controls. 1 when a failed or cancelled run is running again.
    _REOPEN = (
        NOW_MS
        + """
local state = redis.call('HGET', KEYS[1], 'state')
if state ~= 'failed' and state ~= 'cancelled' then return 0 end
redis.call('HSET', KEYS[1], 'state', 'running', 'reason', '', 'updated_ms', now)
redis.call('HDEL', KEYS[1], 'finished_ms')
if redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('HSET', KEYS[2], 'paused', 0, 'cancelled', 0)
end
return 1
"""
    )

    @reachable
    def reopen(self, verify_id: str) -> bool:
        """Run a failed or cancelled run again from its progress, its pause and cancel
        cleared; a run whose process died keeps its state and controls (a paused one stays
        paused). False if it was not failed or cancelled."""
        keys = [self.keys.verify_part(verify_id, p) for p in ("status", "controls")]
        return bool(self._eval(self._REOPEN, keys=keys))

    # -- controls: a dump's (`state/dumps.py`) ----------------------------------------------------

    def pause(self, verify_id: str) -> bool:
        """Ask the run to stop between chunks until resumed. False if it has finished."""
        return self._set_controls(verify_id, {"paused": 1})

    def resume(self, verify_id: str) -> bool:
        return self._set_controls(verify_id, {"paused": 0})

    # KEYS: status, runner. A run no process runs ends cancelled at once.
    _CANCEL_IDLE = (
        NOW_MS
        + """
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
local state = redis.call('HGET', KEYS[1], 'state')
if state ~= 'running' and state ~= 'paused' then return 0 end
redis.call('HSET', KEYS[1], 'state', 'cancelled', 'reason', 'cancelled while no process ran it',
           'updated_ms', now, 'finished_ms', now)
return 1
"""
    )

    @reachable
    def cancel(self, verify_id: str) -> bool:
        """Ask the run to stop for good after the chunks in flight; a run no process runs (its
        process died) is cancelled at once. False if it has finished."""
        if not self._set_controls(verify_id, {"cancelled": 1}):
            return False
        keys = [self.keys.verify_part(verify_id, p) for p in ("status", "runner")]
        self._eval(self._CANCEL_IDLE, keys=keys)
        return True

    def throttle(
        self,
        verify_id: str,
        *,
        chunk_size: int | None = None,
        delay_ms: int | None = None,
        max_rows_per_s: float | None = None,
    ) -> bool:
        """Change the pace of the run from its next chunk on, as a dump's (`max_rows_per_s`:
        rows checked a second; 0 lifts the limit). False if it has finished."""
        changes = throttle_changes(chunk_size, delay_ms, max_rows_per_s)
        return self._set_controls(verify_id, changes)

    @reachable
    def _set_controls(self, verify_id: str, changes: Mapping[str, int | float]) -> bool:
        keys = [self.keys.verify_part(verify_id, p) for p in ("status", "controls")]
        if not self._r.exists(keys[1]):  # no such run, or one stored without controls
            return False
        result = self._eval(
            SET_CONTROLS, keys=keys, args=[item for pair in changes.items() for item in pair]
        )
        return bool(result == 1)

    @reachable
    def controls(self, verify_id: str) -> DumpControls | None:
        """What the run obeys between chunks; None for a run stored without controls."""
        return controls_from(self._r.hgetall(self.keys.verify_part(verify_id, "controls")))

    # KEYS: runner. ARGV: owner, ttl_ms, a runner known gone ('' for none). '' when the run is
    # now the owner's for ttl_ms, else the process that runs it.
    _CLAIM = """
local runner = redis.call('GET', KEYS[1])
if runner and runner ~= ARGV[1] and runner ~= ARGV[3] then return runner end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return ''
"""

    @reachable
    def claim(
        self, verify_id: str, owner: str, ttl_ms: int, *, gone: str | None = None
    ) -> str | None:
        """Run the verify as `owner` for `ttl_ms` (claimed again to renew it); when another
        process runs it, its name, and nothing changes. `gone`: a runner known to be dead,
        whose claim is taken over before it expires."""
        runner = text(
            self._eval(
                self._CLAIM,
                keys=[self.keys.verify_part(verify_id, "runner")],
                args=[owner, ttl_ms, gone or ""],
            )
        )
        return runner or None

    # KEYS: runner. ARGV: owner.
    _RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

    @reachable
    def release(self, verify_id: str, owner: str) -> None:
        """`owner` no longer runs the verify; another process's claim is left alone."""
        self._eval(self._RELEASE, keys=[self.keys.verify_part(verify_id, "runner")], args=[owner])

    @reachable
    def runner(self, verify_id: str) -> str | None:
        """The process running the verify, or None if none claimed it within its TTL."""
        raw = self._r.get(self.keys.verify_part(verify_id, "runner"))
        return None if raw is None else text(raw)

    @reachable
    def counts(self, verify_id: str) -> dict[TableRef, dict[str, int]]:
        """Per table, each of `COUNTERS` (0 where none was counted)."""
        raw = decode_hash(self._r.hgetall(self.keys.verify_part(verify_id, "counts")))
        counts: dict[TableRef, dict[str, int]] = {}
        for field, value in raw.items():
            table, counter = field.rsplit(" ", 1)
            per_table = counts.setdefault(TableRef.parse(table), dict.fromkeys(COUNTERS, 0))
            per_table[counter] = int(value)
        return counts

    @reachable
    def differences(self, verify_id: str, first: int | None = None) -> list[FoundDifference]:
        """The differing keys found, in the order found: all of them, or the `first` ones."""
        end = -1 if first is None else first - 1
        if end == -1 and first is not None:
            return []
        raw = self._r.lrange(self.keys.verify_part(verify_id, "diffs"), 0, end)
        return [_difference(json.loads(text(item))) for item in raw]

    @reachable
    def ids(self) -> Sequence[str]:
        return [text(v) for v in self._r.lrange(self.keys.verifies, 0, -1)]

    def summary(self, verify_id: str) -> dict[str, JsonValue] | None:
        """A verify run as `dblog status --json` and the live view show it: its state, its
        controls (a dump's) and its counts over all its tables (`COUNTERS`); None if it has no
        status."""
        status = self.status(verify_id)
        if status is None:
            return None
        counts = self.counts(verify_id).values()
        controls = self.controls(verify_id)
        return {
            "verify_id": verify_id,
            "state": status.state.value,
            "reason": status.reason,
            "chunks": status.chunks,
            "windows_retried": status.windows_retried,
            "created_ms": status.created_ms,
            "finished_ms": status.finished_ms,
            "runner": self.runner(verify_id),
            "controls": None if controls is None else controls.to_json(),
            **{c: sum(per_table[c] for per_table in counts) for c in COUNTERS},
            "removed": status.removed,
            "repair_dumps": None if status.repair_dumps is None else list(status.repair_dumps),
        }


def _difference(item: list[JsonValue]) -> FoundDifference:
    table, kind, key = item
    return FoundDifference(TableRef.parse(table), Difference(kind), tuple(freeze(v) for v in key))
