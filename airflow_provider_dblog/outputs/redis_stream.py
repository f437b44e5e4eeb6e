"""The change stream as Redis Streams: one stream per source, or one per table.

Each event is one entry: `event` (the encoded JSON), and `table`, `op` and `position` (`[commit,
seq]` as JSON) for consumers that route or filter without decoding. Entry IDs are Redis's own
(time-based), so consumers can use XREAD/XREADGROUP as usual; order within a stream is the output
order. A batch is sent as one pipeline (not a transaction: a failed batch is retried whole, and
what it did write is recognised as a replay).

Durable means what the server's persistence makes it: `appendonly yes` with `appendfsync always`
loses nothing acknowledged; `everysec` can lose the last second on a power failure.

Trimming, at most one of:
- `maxlen`: keep about that many entries per stream (`XADD ... MAXLEN ~`);
- `max_age_s`: drop entries older than that (`XADD ... MINID ~ now - max_age`).
Either way the stream is a buffer, not the record: trimming drops entries whether or not a
consumer has read them, so a consumer that falls further behind than the retention loses events
and must be repaired from a dump. Without either option the stream grows forever.

Replays are dropped: before a stream's first write the output reads its last entry's position and
skips events not newer (positions strictly increase in output order). A stream trimmed down to
nothing has no last entry, so replays into it are written again; consumers drop those by
(key, position).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

import redis

from airflow_provider_dblog.core.event import Event, encode
from airflow_provider_dblog.core.position import Position
from airflow_provider_dblog.outputs.base import (
    Output,
    OutputError,
    OutputUnavailable,
    drop_replayed,
)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class RedisStreamOutput(Output):
    """XADDs events to `{prefix}:{source}:events`, or with `per_table` to
    `{prefix}:{source}:events:{schema}.{table}`. The output owns `client` and closes it."""

    def __init__(
        self,
        client: redis.Redis,
        *,
        per_table: bool = False,
        maxlen: int | None = None,
        max_age_s: float | None = None,
        prefix: str = "dblog",
    ) -> None:
        if maxlen is not None and max_age_s is not None:
            raise OutputError("redis_stream: trim by maxlen or by max_age_s, not both")
        if (maxlen is not None and maxlen <= 0) or (max_age_s is not None and max_age_s <= 0):
            raise OutputError("redis_stream: maxlen and max_age_s must be positive")
        self._client = client
        self.per_table = per_table
        self.maxlen = maxlen
        self.max_age_s = max_age_s
        self.prefix = prefix
        self._last: dict[str, Position | None] = {}
        """Per stream, the position of its last entry, once read."""

    def stream_key(self, event: Event) -> str:
        key = f"{self.prefix}:{event.source.name}:events"
        return f"{key}:{event.table}" if self.per_table else key

    def write(self, events: Sequence[Event]) -> None:
        groups: dict[str, list[Event]] = {}
        for event in events:
            groups.setdefault(self.stream_key(event), []).append(event)
        try:
            self._read_last([k for k in groups if k not in self._last])
            pipe = self._client.pipeline(transaction=False)
            trim = self._trim()
            kept = {key: drop_replayed(group, self._last[key]) for key, group in groups.items()}
            for key, group in kept.items():
                for event in group:
                    fields = {
                        "event": encode(event),
                        "table": str(event.table),
                        "op": event.op.value,
                        "position": json.dumps(event.position.to_json()),
                    }
                    pipe.xadd(key, fields, **trim)  # type: ignore[arg-type]
            pipe.execute()
        except redis.RedisError as exc:
            for key in groups:  # some entries may be in: read the tails again next time
                self._last.pop(key, None)
            if isinstance(exc, redis.ConnectionError | redis.TimeoutError):
                raise OutputUnavailable(f"the Redis output went away: {exc}") from exc
            raise OutputError(f"Redis refused the batch: {exc}") from exc
        for key, group in kept.items():
            if group:
                self._last[key] = group[-1].position

    def _read_last(self, keys: list[str]) -> None:
        if not keys:
            return
        pipe = self._client.pipeline(transaction=False)
        for key in keys:
            pipe.xrevrange(key, count=1)
        for key, entries in zip(keys, pipe.execute(), strict=True):
            if entries:
                fields = {_text(k): v for k, v in entries[0][1].items()}
                self._last[key] = Position.from_json(json.loads(fields["position"]))
            else:
                self._last[key] = None

    def _trim(self) -> dict[str, Any]:
        if self.maxlen is not None:
            return {"maxlen": self.maxlen, "approximate": True}
        if self.max_age_s is not None:
            min_ms = int((time.time() - self.max_age_s) * 1000)
            return {"minid": f"{max(min_ms, 0)}-0", "approximate": True}
        return {}

    def close(self) -> None:
        self._client.close()
