"""The compaction follower's state: the lease that makes one `dblog lake compact --follow` of
a source fold, and the heartbeat `dblog status` and the live view read.

Durability (see the package's docstring for what a crash of Redis loses):

- lease lost: the holder's next renewal fails and it stops folding after its current run; a
  standby acquires it.
- fencing token lost: a token handed out again is still larger than every one before
  (`lease.Lease`).
- heartbeat lost: the compaction looks absent until the next beat, an interval later.

The lake itself keeps what matters: each table's progress commits with its data, so a fold
that two holders ran one after the other, or a holder killed mid-run, changes nothing twice.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass

import redis

from airflow_provider_dblog.core.event import JsonValue
from airflow_provider_dblog.state.base import (
    BEAT,
    RedisStore,
    compact_json,
    decode_hash,
    reachable,
    ttl_ms,
)
from airflow_provider_dblog.state.lease import Lease


@dataclass(frozen=True, slots=True)
class CompactorHealth:
    """The folding follower's last heartbeat: who beat, when (Redis clock), how long ago, and
    its metrics (state, events, freshness_s, pending_bytes, ...)."""

    owner: str
    at_ms: int
    age_ms: int
    metrics: dict[str, JsonValue]

    def to_json(self) -> dict[str, JsonValue]:
        return dataclasses.asdict(self)

    def summary(self) -> dict[str, JsonValue]:
        """Who folds and how fresh the lake is (`follow_metrics`), as `dblog status` and the
        live view both show it."""
        m = self.metrics
        return {
            "owner": self.owner,
            "age_ms": self.age_ms,
            "freshness_s": m.get("freshness_s"),
            "events": m.get("events", 0),
            "pending_bytes": m.get("pending_bytes", 0),
        }


class CompactorStore(RedisStore):
    """The lease, fencing token and heartbeat of one source's compaction follower."""

    def __init__(self, client: redis.Redis, source: str) -> None:
        super().__init__(client, source)
        self.lease = Lease(client, source, self.keys.compact_lease, self.keys.compact_token)

    @reachable
    def beat(self, owner: str, metrics: Mapping[str, JsonValue], ttl_s: float) -> None:
        """The follower says it is alive, with its metrics; without a beat within `ttl_s` it
        counts as gone."""
        self._eval(
            BEAT,
            keys=[self.keys.compact_heartbeat],
            args=[owner, compact_json(dict(metrics)), ttl_ms(ttl_s)],
        )

    @reachable
    def health(self) -> CompactorHealth | None:
        """The last heartbeat, aged on the Redis clock; None if there was none within its TTL."""
        with self._r.pipeline(transaction=False) as pipe:
            pipe.hgetall(self.keys.compact_heartbeat)
            pipe.time()
            raw, (seconds, micros) = pipe.execute()
        if not raw:
            return None
        data = decode_hash(raw)
        at_ms = int(data["at_ms"])
        age_ms = seconds * 1000 + micros // 1000 - at_ms
        return CompactorHealth(data["owner"], at_ms, age_ms, json.loads(data["metrics"]))
