"""Verify runs: the request, its status, where each table stands, the counts per table and every
differing key found.

A chunk's verdict is saved in one MULTI/EXEC with the table's progress past it: a run that dies
resumes from the chunk after the last one saved, and no chunk is counted twice or half. Like dump
records, verify records do not expire: they are the history a person reads.

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
from airflow_provider_dblog.state.errors import AlreadyExists

COUNTERS = ("checked", "in_flux", *(kind.value for kind in Difference))
"""The counts kept per table, in the order a report shows them."""


class VerifyState(StrEnum):
    RUNNING = "running"
    FAILED = "failed"
    DONE = "done"


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

    # KEYS: request, status, list. ARGV: id, request JSON. 0 when the run exists.
    _CREATE = (
        NOW_MS
        + """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('SET', KEYS[1], ARGV[2])
redis.call('HSET', KEYS[2], 'state', 'running', 'reason', '', 'chunks', 0,
           'windows_retried', 0, 'created_ms', now, 'updated_ms', now)
redis.call('RPUSH', KEYS[3], ARGV[1])
return 1
"""
    )

    @reachable
    def create(self, verify_id: str, request: Mapping[str, JsonValue]) -> None:
        """Store a new run's request, running; `AlreadyExists` if the id is taken."""
        created = self._eval(
            self._CREATE,
            keys=[
                self.keys.verify(verify_id),
                self.keys.verify_part(verify_id, "status"),
                self.keys.verifies,
            ],
            args=[verify_id, compact_json(dict(request))],
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
        verdict: ChunkVerdict,
    ) -> None:
        """A chunk's verdict and its table's progress past it, in one transaction."""
        counts = self.keys.verify_part(verify_id, "counts")
        pipe = self._r.pipeline(transaction=True)
        pipe.hset(
            self.keys.verify_part(verify_id, "progress"), str(table), compact_json(dict(progress))
        )
        found = {
            "checked": verdict.checked,
            "in_flux": verdict.in_flux,
            **{kind.value: verdict.count(kind) for kind in Difference},
        }
        for counter, value in found.items():
            if value:
                pipe.hincrby(counts, f"{table} {counter}", value)
        if verdict.differences:
            pipe.rpush(
                self.keys.verify_part(verify_id, "diffs"),
                *(
                    compact_json([str(table), kind.value, list(key)])
                    for key, kind in verdict.differences
                ),
            )
        pipe.hincrby(self.keys.verify_part(verify_id, "status"), "chunks", 1)
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
    def reopen(self, verify_id: str) -> None:
        """Run a failed run again from its progress."""
        status = self.keys.verify_part(verify_id, "status")
        self._r.hset(status, mapping={"state": VerifyState.RUNNING.value, "reason": ""})
        self._r.hdel(status, "finished_ms")

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


def _difference(item: list[JsonValue]) -> FoundDifference:
    table, kind, key = item
    return FoundDifference(TableRef.parse(table), Difference(kind), tuple(freeze(v) for v in key))
