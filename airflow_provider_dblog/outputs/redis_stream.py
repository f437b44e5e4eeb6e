"""The change stream as Redis Streams: one stream per source, or one per table.

Each event is one entry: `event` (the encoded JSON), and `table`, `op` and `position` (`[commit,
seq]` as JSON) for consumers that route or filter without decoding. Entry IDs are Redis's own
(time-based), so consumers can use XREAD/XREADGROUP as usual; order within a stream is the output
order. A table-level event is an entry like any other, in its table's stream: `op` is `t` (the
table was truncated: drop every row of it held so far) or `s` (its columns changed: the new ones
are in the event's `table_schema`).

A batch is one Lua script per source (one round trip, all of it or nothing), which:
1. refuses the batch if `{prefix}:{source}:events-fence` holds a larger lease token than the
   writer's (`OutputFenced`), and otherwise raises it to the writer's token;
2. checks that each stream's last entry is still the one this output last saw (another writer, or
   a retried call whose reply was lost, may have appended since): if not, it writes nothing, and
   the output reads the streams' last positions again and drops the replays again;
3. appends the events.
The fence key lives in the output's Redis, next to the streams it guards (that Redis need not be
the state store's). In Redis Cluster, all of a source's keys must hash to one slot (put the
source name in braces in `prefix`, e.g. `{dblog}`).

Durable means what the server's persistence makes it: `appendonly yes` with `appendfsync always`
loses nothing acknowledged; `everysec` can lose the last second on a power failure.

Trimming, at most one of:
- `maxlen`: keep about that many entries per stream (`XADD ... MAXLEN ~`);
- `max_age_s`: drop entries older than that (`XADD ... MINID ~ now - max_age`).
Either way the stream is a buffer, not the record: trimming drops entries whether or not a
consumer has read them, so a consumer that falls further behind than the retention loses events
and must be repaired from a dump. Without either option the stream grows forever.

Replays are dropped: before a stream's first write, and after any error, the output reads its last
entry's position and skips events not newer (positions strictly increase in output order). A
stream trimmed down to nothing has no last entry, so replays into it are written again; consumers
drop those by (key, position).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass

import redis

from airflow_provider_dblog.core.event import Event
from airflow_provider_dblog.core.event_codec import encode
from airflow_provider_dblog.core.position import Position
from airflow_provider_dblog.outputs.base import (
    Output,
    OutputError,
    OutputFenced,
    OutputUnavailable,
    drop_replayed,
)

# KEYS: fence, then the streams. ARGV: token, trim ('' | 'MAXLEN' | 'MINID'), trim threshold,
# then per stream its last entry ID as the caller knows it ('' = empty) and how many entries it
# gets, then 4 fields per entry, stream after stream.
# Returns {'fenced', fence} | {'moved'} | {'ok', last ID of each stream ('' if it got none)}.
_APPEND = """
local token = tonumber(ARGV[1])
local fence = redis.call('GET', KEYS[1])
if fence and tonumber(fence) > token then
  return {'fenced', fence}
end
if not fence or tonumber(fence) < token then
  redis.call('SET', KEYS[1], ARGV[1])
end
local streams = #KEYS - 1
for s = 1, streams do
  local last = redis.call('XREVRANGE', KEYS[s + 1], '+', '-', 'COUNT', 1)
  if #last > 0 and last[1][1] ~= ARGV[2 + 2 * s] then
    return {'moved'}
  end
end
local trim = {}
if ARGV[2] ~= '' then
  trim = {ARGV[2], '~', ARGV[3]}
end
local result = {'ok'}
local field = 4 + 2 * streams
for s = 1, streams do
  local id = ''
  for _ = 1, tonumber(ARGV[3 + 2 * s]) do
    local args = {'XADD', KEYS[s + 1]}
    for _, word in ipairs(trim) do
      args[#args + 1] = word
    end
    args[#args + 1] = '*'
    args[#args + 1] = 'event'
    args[#args + 1] = ARGV[field]
    args[#args + 1] = 'table'
    args[#args + 1] = ARGV[field + 1]
    args[#args + 1] = 'op'
    args[#args + 1] = ARGV[field + 2]
    args[#args + 1] = 'position'
    args[#args + 1] = ARGV[field + 3]
    id = redis.call(unpack(args))
    field = field + 4
  end
  result[s + 1] = id
end
return result
"""

_ATTEMPTS = 3
"""Script calls per batch: a call that finds a stream moved raised the fence first, so only a
writer with the same token (or a lost reply's retry) can move it again."""


def stream_name(prefix: str, source: str, table: str | None = None) -> str:
    """The stream of a source's events, or with `table` (per_table) of that table's events:
    also what the change trigger reads."""
    key = f"{prefix}:{source}:events"
    return key if table is None else f"{key}:{table}"


def _encoded(event: Event) -> bytes | str:
    """The event's JSON; an event's that carries its line (`Event.line`) as that line."""
    line = event.line
    return encode(event) if line is None else line[:-1]


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


@dataclass(frozen=True)
class _Tail:
    """A stream's last entry: its ID and its event's position."""

    entry_id: str
    position: Position


class RedisStreamOutput(Output):
    """XADDs events to `{prefix}:{source}:events`, or with `per_table` to
    `{prefix}:{source}:events:{schema}.{table}`; the fence is `{prefix}:{source}:events-fence`.
    The output owns `client` and closes it."""

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
        self._append = client.register_script(_APPEND)
        self.per_table = per_table
        self.maxlen = maxlen
        self.max_age_s = max_age_s
        self.prefix = prefix
        self._last: dict[str, _Tail | None] = {}
        """Per stream, its last entry (None: empty), once read; forgotten after any error."""

    def stream_key(self, event: Event) -> str:
        table = str(event.table) if self.per_table else None
        return stream_name(self.prefix, event.source.name, table)

    def fence_key(self, source: str) -> str:
        return f"{self.prefix}:{source}:events-fence"

    def fence(self, source: str) -> int | None:
        try:
            value = self._client.get(self.fence_key(source))
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise OutputUnavailable(f"the Redis output went away: {exc}") from exc
        return None if value is None else int(value)

    def write(self, events: Sequence[Event], token: int) -> None:
        sources: dict[str, dict[str, list[Event]]] = {}
        for event in events:
            streams = sources.setdefault(event.source.name, {})
            streams.setdefault(self.stream_key(event), []).append(event)
        for source, streams in sources.items():
            try:
                self._write_source(source, streams, token)
            except redis.RedisError as exc:
                for key in streams:  # the tails may have moved: read them again next time
                    self._last.pop(key, None)
                # A failover's new primary is not yet known to the client: READONLY.
                transient = redis.ConnectionError | redis.TimeoutError | redis.ReadOnlyError
                if isinstance(exc, transient):
                    raise OutputUnavailable(f"the Redis output went away: {exc}") from exc
                raise OutputError(f"Redis refused the batch: {exc}") from exc

    def _write_source(self, source: str, streams: dict[str, list[Event]], token: int) -> None:
        for _ in range(_ATTEMPTS):
            self._read_last([key for key in streams if key not in self._last])
            keys = list(streams)
            kept = {key: drop_replayed(streams[key], self._position(key)) for key in keys}
            args: list[bytes | str | int] = [token, *self._trim()]
            for key in keys:
                tail = self._last[key]
                args += ["" if tail is None else tail.entry_id, len(kept[key])]
            for key in keys:
                for event in kept[key]:
                    args += [
                        _encoded(event),
                        str(event.table),
                        event.op.value,
                        json.dumps(event.position.to_json()),
                    ]
            result = [
                _text(r) for r in self._append(keys=[self.fence_key(source), *keys], args=args)
            ]
            if result[0] == "fenced":
                raise OutputFenced(f"Redis stream output of {source}", token, int(result[1]))
            if result[0] == "moved":
                for key in keys:
                    self._last.pop(key, None)
                continue
            for key, entry_id in zip(keys, result[1:], strict=True):
                if kept[key]:
                    self._last[key] = _Tail(entry_id, kept[key][-1].position)
            return
        raise OutputError(
            f"the Redis streams of {source} keep moving under this output: another writer uses"
            f" the same lease token {token}"
        )

    def _position(self, key: str) -> Position | None:
        tail = self._last[key]
        return None if tail is None else tail.position

    def _read_last(self, keys: list[str]) -> None:
        if not keys:
            return
        pipe = self._client.pipeline(transaction=False)
        for key in keys:
            pipe.xrevrange(key, count=1)
        for key, entries in zip(keys, pipe.execute(), strict=True):
            if entries:
                entry_id, raw = entries[0]
                fields = {_text(k): v for k, v in raw.items()}
                position = Position.from_json(json.loads(fields["position"]))
                self._last[key] = _Tail(_text(entry_id), position)
            else:
                self._last[key] = None

    def _trim(self) -> tuple[str, str]:
        """The trim option of every XADD: its kind and threshold ('' and '' for none)."""
        if self.maxlen is not None:
            return "MAXLEN", str(self.maxlen)
        if self.max_age_s is not None:
            min_ms = int((time.time() - self.max_age_s) * 1000)
            return "MINID", f"{max(min_ms, 0)}-0"
        return "", ""

    def close(self) -> None:
        self._client.close()
