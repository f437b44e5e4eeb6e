"""The tailer's state: the lease that makes one tailer of a source active, the fencing token
that refuses a stale one, the checkpoint it restarts from, the schema versions it numbered, and
the heartbeat Airflow reads.

Durability (see the package's docstring for what a crash of Redis loses):

- checkpoint lost: the tailer re-reads some log from an earlier position (duplicates only).
- lease lost: the holder's next renewal fails and it stops; a standby acquires it.
- fencing token lost: a token handed out again is still larger than every one before
  (`lease.Lease`), and the old leader stays fenced out.
- heartbeat lost: health looks stale until the next beat, a few seconds later.
- a schema lost: a schema is saved once its event is durable and before the checkpoint passes
  it, so a lost save comes with a lost checkpoint: the tailer reads that stretch of log again
  and emits the schema event again, at its position with its version (a duplicate).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import redis

from airflow_provider_dblog.core.event import JsonValue, TableRef
from airflow_provider_dblog.core.position import Position
from airflow_provider_dblog.core.schema import TableSchema
from airflow_provider_dblog.core.schema_versions import KnownSchema, replayable
from airflow_provider_dblog.state.base import (
    BEAT,
    FENCE,
    NOW_MS,
    RedisStore,
    compact_json,
    decode_hash,
    reachable,
    text,
    ttl_ms,
)
from airflow_provider_dblog.state.errors import FencedOut
from airflow_provider_dblog.state.lease import Lease


@dataclass(frozen=True, slots=True)
class TailerHealth:
    """The active tailer's last heartbeat: who beat, when (Redis clock), how long ago, and its
    metrics (last commit, lag_ms, events_per_s, open_windows, ...)."""

    owner: str
    at_ms: int
    age_ms: int
    metrics: dict[str, JsonValue]

    def to_json(self) -> dict[str, JsonValue]:
        return dataclasses.asdict(self)


def tailer_health_from(
    raw: Mapping[bytes | str, bytes | str], now: tuple[int, int]
) -> TailerHealth | None:
    """The health in a `tailer:heartbeat` hash, aged by `now` (Redis TIME: seconds,
    microseconds); None if there was no beat within its TTL."""
    if not raw:
        return None
    data = decode_hash(raw)
    at_ms = int(data["at_ms"])
    seconds, micros = now
    return TailerHealth(
        owner=data["owner"],
        at_ms=at_ms,
        age_ms=seconds * 1000 + micros // 1000 - at_ms,
        metrics=json.loads(data["metrics"]),
    )


@dataclass(frozen=True, slots=True)
class TablesChange:
    """Captured tables a running tailer started (`added`) or stopped (`removed`) following."""

    at_ms: int
    owner: str
    added: tuple[TableRef, ...]
    removed: tuple[TableRef, ...]

    def to_json(self) -> dict[str, JsonValue]:
        return {
            "at_ms": self.at_ms,
            "owner": self.owner,
            "added": [str(t) for t in self.added],
            "removed": [str(t) for t in self.removed],
        }


class TailerStore(RedisStore):
    """The lease, fencing token, checkpoint and heartbeat of one source's tailer."""

    # KEYS: checkpoint, resume, token. ARGV: token, commit, resume ('' = none).
    _CHECKPOINT = (
        FENCE
        + """
redis.call('SET', KEYS[1], ARGV[2])
if ARGV[3] == '' then
  redis.call('DEL', KEYS[2])
else
  redis.call('SET', KEYS[2], ARGV[3])
end
return 1
"""
    )

    @reachable
    def save_checkpoint(self, commit: int, token: int, resume: str | None = None) -> None:
        """Store the commit position the tailer restarts from and, with it, where the source's
        log reader resumes (`LogReader.acknowledge`'s answer; None when the source keeps that
        itself). Raises `FencedOut` if `token` no longer holds the lease (a stale leader must
        not move the checkpoint)."""
        if resume == "":
            raise ValueError("a resume point is None or a non-empty string")
        result = self._eval(
            self._CHECKPOINT,
            keys=[
                self.keys.tailer_checkpoint,
                self.keys.tailer_resume,
                self.keys.tailer_token,
            ],
            args=[token, commit, resume or ""],
        )
        if result == -1:
            raise FencedOut.of(self.source, token, f"checkpoint {commit} was not saved")

    @reachable
    def load_checkpoint(self) -> int | None:
        raw = self._r.get(self.keys.tailer_checkpoint)
        return None if raw is None else int(raw)

    @reachable
    def load_resume(self) -> str | None:
        """Where the source's log reader resumes, as saved with the last checkpoint."""
        raw = self._r.get(self.keys.tailer_resume)
        return None if raw is None else text(raw)

    # KEYS: schemas, token. ARGV: token, table, version, JSON (the table's history, newest
    # last). Returns 0 if the stored newest version is not older (a replay), 1 when saved. A
    # single schema object is how earlier releases stored a table's one schema.
    _SCHEMA = (
        FENCE
        + """
local stored = redis.call('HGET', KEYS[1], ARGV[2])
if stored then
  local data = cjson.decode(stored)
  local newest = data['version'] or data[#data]['version']
  if newest >= tonumber(ARGV[3]) then return 0 end
end
redis.call('HSET', KEYS[1], ARGV[2], ARGV[4])
return 1
"""
    )

    @reachable
    def save_schema(self, known: KnownSchema, token: int) -> bool:
        """Store a table's schema once its event is durable, unless a version at least as new
        is stored (versions only grow), with the earlier ones a tailer restarting from the
        checkpoint can still meet (`replayable`). Raises `FencedOut` if `token` no longer
        holds the lease."""
        raw = self._r.hget(self.keys.tailer_schemas, str(known.table))
        stored = [] if raw is None else _schemas(known.table, text(raw))
        history = replayable([*stored, known], self.load_checkpoint())
        result = self._eval(
            self._SCHEMA,
            keys=[self.keys.tailer_schemas, self.keys.tailer_token],
            args=[token, str(known.table), known.version, compact_json(_history_json(history))],
        )
        if result == -1:
            raise FencedOut.of(self.source, token, f"schema of {known.table} was not saved")
        return bool(result)

    @reachable
    def load_schemas(self) -> list[KnownSchema]:
        """Every table's durable schemas, as `save_schema` stored them."""
        raw = decode_hash(self._r.hgetall(self.keys.tailer_schemas))
        return [
            known for table, data in raw.items() for known in _schemas(TableRef.parse(table), data)
        ]

    def __init__(self, client: redis.Redis, source: str) -> None:
        super().__init__(client, source)
        self.lease = Lease(client, source, self.keys.tailer_lease, self.keys.tailer_token)

    def acquire_lease(self, owner: str, ttl_ms: int) -> int | None:
        """Become the active tailer if nobody is (`Lease.acquire`)."""
        return self.lease.acquire(owner, ttl_ms)

    def renew_lease(self, owner: str, token: int, ttl_ms: int) -> bool:
        """Extend the lease; False if it is no longer ours (expired, or taken): stop at once."""
        return self.lease.renew(owner, token, ttl_ms)

    def raise_lease_above(self, owner: str, token: int, floor: int) -> int | None:
        """A token above `floor` for the lease this owner holds (`Lease.raise_above`)."""
        return self.lease.raise_above(owner, token, floor)

    def release_lease(self, owner: str, token: int) -> bool:
        """Give the lease up so a standby takes over without waiting for the TTL."""
        return self.lease.release(owner, token)

    # KEYS: tables. ARGV: the change's JSON without at_ms, how many to keep.
    _TABLES = (
        NOW_MS
        + """
local change = cjson.decode(ARGV[1])
change['at_ms'] = now
redis.call('LPUSH', KEYS[1], cjson.encode(change))
redis.call('LTRIM', KEYS[1], 0, tonumber(ARGV[2]) - 1)
return 1
"""
    )

    @reachable
    def record_tables(
        self, owner: str, added: Sequence[TableRef], removed: Sequence[TableRef]
    ) -> None:
        """A running tailer took a new list of captured tables (a reload): what `dblog
        status` shows, with the time on the Redis clock."""
        change = {"owner": owner, "added": [str(t) for t in added]}
        change["removed"] = [str(t) for t in removed]
        self._eval(self._TABLES, keys=[self.keys.tailer_tables], args=[compact_json(change), 20])

    @reachable
    def tables_changes(self) -> list[TablesChange]:
        """The captured tables' changes a running tailer took, newest first."""
        return [
            TablesChange(
                int(data["at_ms"]),
                str(data["owner"]),
                tuple(TableRef.parse(t) for t in data["added"] or ()),
                tuple(TableRef.parse(t) for t in data["removed"] or ()),
            )
            for data in map(json.loads, self._r.lrange(self.keys.tailer_tables, 0, -1))
        ]

    @reachable
    def beat(self, owner: str, metrics: Mapping[str, JsonValue], ttl_s: float = 30) -> None:
        """The active tailer says it is alive, with its metrics (last commit, lag_ms,
        events_per_s, open_windows, ...). Without a beat within `ttl_s` it counts as gone."""
        self._eval(
            BEAT,
            keys=[self.keys.tailer_heartbeat],
            args=[owner, compact_json(dict(metrics)), ttl_ms(ttl_s)],
        )

    @reachable
    def health(self) -> TailerHealth | None:
        """The last heartbeat, its age on the Redis clock; None if there was none within its
        TTL."""
        with self._r.pipeline(transaction=False) as pipe:
            pipe.hgetall(self.keys.tailer_heartbeat)
            pipe.time()
            raw, now = pipe.execute()
        return tailer_health_from(raw, now)


def _history_json(history: Sequence[KnownSchema]) -> JsonValue:
    return [
        {
            "version": known.version,
            "schema": known.schema.to_json(),
            "position": known.position.to_json(),
        }
        for known in history
    ]


def _schemas(table: TableRef, raw: str) -> list[KnownSchema]:
    """A table's stored schemas, oldest first: a list, or one schema (earlier releases)."""
    data = json.loads(raw)
    return [
        KnownSchema(
            table,
            int(item["version"]),
            TableSchema.from_json(item["schema"]),
            Position.from_json(item["position"]),
        )
        for item in (data if isinstance(data, list) else [data])
    ]
