"""Direct windows: what the tailer records at their hw, and the windows whose rows are pending.

A direct window (see `core/direct.py`) lives in `WindowStore` like any other until its hw. There
the tailer does not claim it and emit rows: `record` stores the keys that changed inside it and
where lw and hw sit, and closes it, in one fenced Lua script. The dump waiting on the window
reads the record (`record_of`), writes its surviving rows into the target, and then says so
(`committed`).

When the record may be exposed. The window closes at once, before the log events the tailer
handed over up to hw are durable in the output. For a target that keeps the highest position per
key that is safe: the dump's rows are positioned after hw, the events before hw are older, and
whichever reaches the target first, the newer wins. What must not be lost is the record itself:
a restarted tailer meets hw again only if it re-reads the window, and then it fails it (its lw
was not seen in the new session), so a window recorded, then forgotten, would leave the dump
waiting. Recording and closing are therefore one script: a window is closed with its record or
not closed at all.

The tombstone horizon (`horizon`) is read from the windows still pending: the oldest lw among
the direct windows recorded whose rows are not yet committed, bounded by the tailer's checkpoint
(`core.direct.tombstone_horizon` says why both). The pending windows and the checkpoint are read
in one script, so a window recorded in between cannot be missed: a window recorded later has its
hw after everything the tailer had read, hence after the checkpoint read with them. A pending
window whose keys expired (its dump died between the record and the commit) no longer counts:
its rows are never committed, since the dump commits only within the window's TTL.

Durability: a lost record is a lost close (the window is back open; the dump times out, abandons
it and retries the chunk). A lost `committed` leaves the window pending until its keys expire:
pruning waits longer, nothing else.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from airflow_provider_dblog.core.direct import DirectRecord, tombstone_horizon
from airflow_provider_dblog.core.event import Key, freeze
from airflow_provider_dblog.core.position import Position
from airflow_provider_dblog.state.base import (
    FENCE,
    NOW_MS,
    RedisStore,
    compact_json,
    decode_hash,
    reachable,
    text,
)
from airflow_provider_dblog.state.errors import FencedOut


class DirectWindowStore(RedisStore):
    """The records of direct windows and the windows whose rows are pending, of one source."""

    # KEYS: window, rows, rowsmeta, ended, pending, token. ARGV: token, window id, lw json,
    # hw json, changed json. Returns 1 (recorded and closed), 0 (not open), -1 (fenced).
    _RECORD = (
        FENCE
        + NOW_MS
        + """
if redis.call('HGET', KEYS[1], 'state') ~= 'open' then return 0 end
redis.call('HSET', KEYS[1], 'state', 'closed', 'reason', '', 'updated_ms', now,
           'lw_position', ARGV[3], 'hw_position', ARGV[4], 'changed', ARGV[5])
redis.call('DEL', KEYS[2], KEYS[3])
redis.call('RPUSH', KEYS[4], 'closed')
local ttl = redis.call('PTTL', KEYS[1])
if ttl > 0 then redis.call('PEXPIRE', KEYS[4], ttl) end
redis.call('HSET', KEYS[5], ARGV[2], ARGV[3])
return 1
"""
    )

    @reachable
    def record(self, record: DirectRecord, token: int) -> bool:
        """The tailer met hw of a direct window: store what the dump needs and close the window
        (open -> closed), one script. False if the window is not open (the dump abandoned it
        first: exactly one of the two wins). Raises `FencedOut` if `token` lost the lease."""
        window_id = self.keys.window(record.window_id)
        result = self._eval(
            self._RECORD,
            keys=[
                window_id,
                self.keys.window_rows(record.window_id),
                self.keys.window_rows_meta(record.window_id),
                self.keys.window_ended(record.window_id),
                self.keys.direct_pending,
                self.keys.tailer_token,
            ],
            args=[
                token,
                record.window_id,
                compact_json(record.lw_position.to_json()),
                compact_json(record.hw_position.to_json()),
                compact_json([list(key) for key in sorted(record.changed_keys, key=repr)]),
            ],
        )
        if result == -1:
            raise FencedOut.of(self.source, token, f"direct window {record.window_id} not recorded")
        return bool(result == 1)

    @reachable
    def record_of(self, window_id: str) -> DirectRecord | None:
        """What the tailer recorded at the window's hw; None if it recorded nothing (the
        window is not closed, not direct, or its keys expired)."""
        raw = self._r.hmget(self.keys.window(window_id), "lw_position", "hw_position", "changed")
        values = [value for value in raw if value is not None]
        if len(values) != 3:
            return None
        lw, hw, changed = (json.loads(text(value)) for value in values)
        keys: set[Key] = {tuple(freeze(v) for v in key) for key in changed}
        return DirectRecord(
            window_id, Position.from_json(lw), Position.from_json(hw), frozenset(keys)
        )

    @reachable
    def committed(self, window_id: str) -> None:
        """The dump committed the window's rows into the target: it no longer holds the
        tombstone horizon back."""
        self._r.hdel(self.keys.direct_pending, window_id)

    # KEYS: pending. ARGV: the window key prefix. Returns the lws of the pending windows,
    # dropping those whose keys expired.
    _PENDING_LWS = """
local lws = {}
local pending = redis.call('HGETALL', KEYS[1])
for i = 1, #pending, 2 do
  local window = ARGV[1] .. pending[i]
  if redis.call('EXISTS', window) == 1 then
    table.insert(lws, pending[i + 1])
  else
    redis.call('HDEL', KEYS[1], pending[i])
  end
end
return lws
"""

    @reachable
    def horizon(self) -> Position | None:
        """The position before which no direct dump row can still reach a target (None: none
        known yet, prune nothing): the oldest lw of the pending windows, or the checkpoint.

        The checkpoint is read first, on its own: a script's keys must all be writable by its
        caller, and a dump's or the compaction's Redis user only reads the tailer's keys. A
        window recorded between the two reads is counted, and the checkpoint only grows, so
        the horizon is never later than one read at once."""
        checkpoint = self._r.get(self.keys.tailer_checkpoint)
        lws = self._eval(
            self._PENDING_LWS, keys=[self.keys.direct_pending], args=[self.keys.window("")]
        )
        return tombstone_horizon(
            _positions(lws), None if checkpoint is None else int(text(checkpoint))
        )

    @reachable
    def pending(self) -> dict[str, Position]:
        """The direct windows recorded whose rows are not yet committed, with their lws."""
        raw = decode_hash(self._r.hgetall(self.keys.direct_pending))
        return {window: Position.from_json(json.loads(lw)) for window, lw in raw.items()}


def _positions(values: Iterable[bytes | str]) -> list[Position]:
    return [Position.from_json(json.loads(text(value))) for value in values]
