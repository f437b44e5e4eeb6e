"""Read-only windows: watermarks that are log positions the dump reads, not rows it writes.

A dump that must not write to the source registers its window as any other
(`WindowStore.register`) and adds it here (`add`). Then:

1. The tailer, between two transactions, arms it (`arm`: registered -> open, with `lw` its read
   position: it has read every commit below `lw`). From here every change it reads of the
   window's table leaves the chunk. The dump waits for that (`wait_armed`) before it reads.
2. The dump reads the chunk; each read stores its rows with `hw`, a log position every
   transaction the read saw commits below (`WindowStore.put_rows`/`append_rows`), then the dump
   marks the window `ready`.
3. The tailer closes the window once it has read every commit below `hw`: the rows go out
   positioned in the gap after the last commit it read, at seqs `reserve` hands out once.

The tailer finds the windows to arm and to close by polling `pending`, a set of a few ids; `add`
and `ready` also publish on `positional:wake`, so that a tailer following `wakes` looks at once
rather than at its next poll (a wake lost while it reconnects costs one poll).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import redis

from airflow_provider_dblog.core.reconciler import Window
from airflow_provider_dblog.state.base import FENCE, NOW_MS, RedisStore, reachable, text
from airflow_provider_dblog.state.errors import FencedOut, UnknownWindow
from airflow_provider_dblog.state.windows import WindowState, WindowStatus, WindowStore, window_of

_WAIT_SLICE_S = 1.0
"""The longest a blocking wait runs before the state is read again."""


@dataclass(frozen=True, slots=True)
class PendingWindow:
    """A read-only window the tailer has to act on: arm it (`registered`), close it once `hw`
    is behind its read (`open`, `hw` set when the rows are stored), or fail it (`open` but not
    armed by this tailer: it restarted inside the window)."""

    window: Window
    state: WindowState
    ready: bool
    """Every read stored its rows (and its hw, when the server gave one)."""
    hw: int | None
    snapshot_end: int | None


class PositionalWindowStore(RedisStore):
    """What read-only windows add to the windows of one source (see the module docstring)."""

    @reachable
    def add(self, window_id: str) -> None:
        """Make a registered window one the tailer arms by position, and wake the tailer."""
        pipe = self._r.pipeline(transaction=False)
        pipe.sadd(self.keys.positional, window_id)
        pipe.publish(self.keys.positional_wake, window_id)
        pipe.execute()

    def wakes(self, stop: threading.Event) -> Iterator[None]:
        """One item each time a dump adds a read-only window or makes one ready, until `stop`
        (looked at every `_WAIT_SLICE_S`). Redis going away is waited out here, quietly: the
        tailer's polls stand in meanwhile."""
        while not stop.is_set():
            try:
                pubsub = self._r.pubsub(ignore_subscribe_messages=True)
                with pubsub as subscription:
                    subscription.subscribe(self.keys.positional_wake)
                    while not stop.is_set():
                        if subscription.get_message(timeout=_WAIT_SLICE_S) is not None:
                            yield
            except (redis.ConnectionError, redis.TimeoutError):
                stop.wait(_WAIT_SLICE_S)

    # KEYS: set. Returns, for each window still to act on, {state, ready, hw, snapshot_end,
    # window_id, dump_id, table, mode}; ids whose window expired or ended leave the set. The
    # windows' keys are built from the set's (the source's prefix): one hash slot, as every
    # key of a source.
    _PENDING = """
local found = {}
for _, id in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local key = string.sub(KEYS[1], 1, -11) .. 'window:' .. id
  local w = redis.call('HMGET', key, 'state', 'ready', 'window_id', 'dump_id', 'table', 'mode')
  if (not w[1]) or (w[1] ~= 'registered' and w[1] ~= 'open') then
    redis.call('SREM', KEYS[1], id)
  else
    local hw, snapshot_end = '', ''
    if w[2] then
      local meta = redis.call('HMGET', key .. ':rowsmeta', 'hw', 'snapshot_end')
      hw, snapshot_end = meta[1] or '', meta[2] or ''
    end
    table.insert(found, {w[1], w[2] or '', hw, snapshot_end, w[3], w[4], w[5], w[6] or 'sequenced'})
  end
end
return found
"""

    @reachable
    def pending(self) -> list[PendingWindow]:
        """The read-only windows still registered or open; one script, cheap when none is."""
        found = []
        for state, ready, hw, snapshot_end, window_id, dump_id, table, mode in self._eval(
            self._PENDING, keys=[self.keys.positional]
        ):
            window = window_of(
                {
                    "window_id": text(window_id),
                    "dump_id": text(dump_id),
                    "table": text(table),
                    "mode": text(mode),
                }
            )
            found.append(
                PendingWindow(
                    window,
                    WindowState(text(state)),
                    bool(text(ready)),
                    int(hw) if text(hw) else None,
                    int(snapshot_end) if text(snapshot_end) else None,
                )
            )
        return found

    # KEYS: window, armed, token. ARGV: token, lw. 1: armed; 0: not registered; -1: fenced.
    _ARM = (
        FENCE
        + NOW_MS
        + """
if redis.call('HGET', KEYS[1], 'state') ~= 'registered' then return 0 end
redis.call('HSET', KEYS[1], 'state', 'open', 'armed_at', ARGV[2], 'updated_ms', now)
redis.call('RPUSH', KEYS[2], 'armed')
redis.call('PEXPIRE', KEYS[2], math.max(redis.call('PTTL', KEYS[1]), 1))
return 1
"""
    )

    @reachable
    def arm(self, window_id: str, token: int, lw: int) -> bool:
        """The tailer opens the window at `lw` (it has read every commit below it):
        registered -> open, and the dump waiting in `wait_armed` wakes. False if the window is
        no longer registered (the dump abandoned it). Raises `FencedOut` for a stale token."""
        result = self._eval(
            self._ARM,
            keys=[
                self.keys.window(window_id),
                self.keys.window_armed(window_id),
                self.keys.tailer_token,
            ],
            args=[token, lw],
        )
        if result == -1:
            raise FencedOut.of(self.source, token, f"window {window_id} was not armed")
        return bool(result == 1)

    def wait_armed(self, windows: WindowStore, window_id: str, timeout_s: float) -> WindowStatus:
        """Wait until the tailer armed the window (or it ended) or `timeout_s` passes; its
        state then (still registered on a timeout: the dump abandons it next)."""
        deadline = time.monotonic() + timeout_s
        while True:
            status = windows.state(window_id)
            if status is None:
                raise UnknownWindow(f"window {window_id} is not registered (or expired)")
            remaining = deadline - time.monotonic()
            if status.state is not WindowState.REGISTERED or remaining <= 0:
                return status
            self._block(self.keys.window_armed(window_id), min(remaining, _WAIT_SLICE_S))

    @reachable
    def _block(self, key: str, timeout_s: float) -> None:
        self._r.execute_command(  # type: ignore[no-untyped-call]
            "BLMOVE", key, key, "LEFT", "RIGHT", max(timeout_s, 0.01)
        )

    # KEYS: window, wake channel. 1: marked; 0: the window is no longer open.
    _READY = """
if redis.call('HGET', KEYS[1], 'state') ~= 'open' then return 0 end
redis.call('HSET', KEYS[1], 'ready', '1')
redis.call('PUBLISH', KEYS[2], '')
return 1
"""

    @reachable
    def ready(self, window_id: str) -> bool:
        """Every read of the window stored its rows and hw: the tailer may close it (and is
        woken). False if the window is no longer open (it failed or expired): the chunk is
        retried."""
        keys = [self.keys.window(window_id), self.keys.positional_wake]
        return bool(self._eval(self._READY, keys=keys) == 1)

    # KEYS: last, token. ARGV: token, commit, count. The seq before the first one handed out.
    _RESERVE = (
        FENCE
        + """
local base = 0
local last = redis.call('GET', KEYS[1])
if last then
  local commit, seq = string.match(last, '^(%d+) (%d+)$')
  if commit == ARGV[2] then base = tonumber(seq) + 1 end
end
redis.call('SET', KEYS[1], ARGV[2] .. ' ' .. (base + tonumber(ARGV[3])))
return base
"""
    )

    @reachable
    def reserve(self, commit: int, count: int, token: int) -> int:
        """Hand out `count` seqs after the one returned at `commit`, never handed out before,
        not even by a tailer that died since: a read-only window's rows take positions in the
        gap after a commit, which the next tailer may close a window at again."""
        result = self._eval(
            self._RESERVE,
            keys=[self.keys.positional_last, self.keys.tailer_token],
            args=[token, commit, count],
        )
        if result == -1:
            raise FencedOut.of(self.source, token, f"no position reserved at {commit}")
        return int(result)
