"""Watermark windows: where the dump and the tailer meet (their chunk rows: `window_rows.py`).

The dump registers a window before it writes lw and stores the chunk rows before it writes hw;
the tailer looks watermark values up, moves the window's state and reads the rows at hw.

A window's life (every move is one Lua script, so two racing processes see one winner):

    registered --lw (tailer)--> open --hw (tailer)--> closing --output durable (tailer)--> closed
    registered/open --dump timed out--> abandoned      registered/open/closing --tailer--> failed

`closing` is the tailer's claim at hw, taken before it emits any chunk row: once the tailer holds
it, the dump cannot abandon the window, and once the dump abandoned it, the tailer's claim fails
and it emits nothing. So an abandoned window's rows are never emitted, and `closed` still means
what the dump needs to move its progress: the chunk's events are durable in the output.

Every key of a window (`window:<id>*`, `wm:<value>`) expires with the TTL given when it was
registered, so Redis does not grow with the windows of old dumps; the rows, the bulk of it, are
deleted as soon as the window ends.

Durability (see the package's docstring for what a crash of Redis loses):

- window registration lost: the tailer meets a watermark value it does not know and ignores it;
  the dump's wait times out, the abandon finds nothing, and the chunk is retried.
- window transition lost (open, closed, failed): at worst the window is back in an earlier state.
  The tailer's next transition is refused, it drops the window, and the dump times out and
  retries the chunk. If the close was lost after the output took the rows, the retried chunk
  emits them again: the output is at-least-once and consumers drop duplicates by position.
- chunk rows lost: the tailer finds none at hw and fails the window; the chunk is retried.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

from airflow_provider_dblog.core.direct import DumpMode
from airflow_provider_dblog.core.errors import InvalidRequest
from airflow_provider_dblog.core.event import JsonValue, TableRef
from airflow_provider_dblog.core.reconciler import Window
from airflow_provider_dblog.state.base import (
    FENCE,
    NOW_MS,
    compact_json,
    decode_hash,
    reachable,
    text,
    ttl_ms,
)
from airflow_provider_dblog.state.errors import (
    AlreadyExists,
    FencedOut,
    UnknownWindow,
)
from airflow_provider_dblog.state.window_rows import WindowRows

Mark = Literal["lw", "hw"]

_SCAN_COUNT = 1000
"""Keys a SCAN call looks at (`ids`)."""
_WAIT_SLICE_S = 1.0
"""The longest a blocking wait runs before the state is read again (below any socket timeout)."""


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


@dataclass(frozen=True, slots=True)
class WindowStatus:
    window: Window
    state: WindowState
    reason: str
    chunk: dict[str, JsonValue]
    registered_ms: int
    updated_ms: int


def window_of(data: Mapping[str, str]) -> Window:
    """The window a stored hash (or watermark entry) describes; one registered before windows
    had modes is sequenced."""
    mode = DumpMode(data.get("mode", DumpMode.SEQUENCED))
    return Window(data["window_id"], data["dump_id"], TableRef.parse(data["table"]), mode)


class WindowStore(WindowRows):
    """The watermark windows of one source, and their chunk rows (`WindowRows`)."""

    # KEYS: window, wm_lw, wm_hw. ARGV: ttl_ms, lw json, hw json, then window field/value pairs.
    _REGISTER = (
        NOW_MS
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

    @reachable
    def register(
        self, window: Window, lw: str, hw: str, chunk: Mapping[str, JsonValue], ttl_s: float
    ) -> None:
        """Register a window before the dump writes `lw` into the source, so the tailer can tell
        our watermark values from stale ones. Every key of the window expires after `ttl_s`:
        make it longer than the dump waits for the window before it abandons it."""
        if lw == hw:
            raise InvalidRequest("lw and hw must differ")
        known = {
            "window_id": window.window_id,
            "dump_id": window.dump_id,
            "table": str(window.table),
            "mode": window.mode.value,
        }
        done = self._eval(
            self._REGISTER,
            keys=[
                self.keys.window(window.window_id),
                self.keys.watermark(lw),
                self.keys.watermark(hw),
            ],
            args=[
                ttl_ms(ttl_s),
                compact_json({**known, "mark": "lw"}),
                compact_json({**known, "mark": "hw"}),
                *(item for pair in known.items() for item in pair),
                "lw",
                lw,
                "hw",
                hw,
                "chunk",
                compact_json(dict(chunk)),
            ],
        )
        if not done:
            raise AlreadyExists(
                f"window {window.window_id} or watermark {lw} / {hw} is already registered"
            )

    @reachable
    def lookup_watermark(self, value: str) -> tuple[Window, Mark] | None:
        """The window a watermark value belongs to, in whatever state it is now. None means the
        value is stale (from a window that expired, or not ours): the tailer ignores it."""
        raw = self._r.get(self.keys.watermark(value))
        if raw is None:
            return None
        data = json.loads(raw)
        mark: Mark = "lw" if data["mark"] == "lw" else "hw"
        return window_of(data), mark

    def open(self, window_id: str, token: int) -> bool:
        """The tailer met lw: registered -> open. False if the window is not registered (ended,
        expired, or lw seen twice). Raises `FencedOut` if `token` no longer holds the lease."""
        return self._move(window_id, WindowState.OPEN, "", token, WindowState.REGISTERED)

    def claim(self, window_id: str, token: int) -> bool:
        """The tailer met hw: open -> closing, before it emits a single chunk row. From here the
        dump can no longer abandon the window. Exactly one of this and `abandon` wins a race;
        False means the window ended first (abandoned, say): drop it, emit nothing."""
        return self._move(window_id, WindowState.CLOSING, "", token, WindowState.OPEN)

    def close(self, window_id: str, token: int) -> bool:
        """The output has made the chunk's events durable: closing -> closed. Only now may the
        dump count the chunk as complete and move its progress. Deletes the chunk rows."""
        return self._move(window_id, WindowState.CLOSED, "", token, WindowState.CLOSING)

    def fail(self, window_id: str, reason: str, token: int) -> bool:
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

    def abandon(self, window_id: str, reason: str = "the dump stopped waiting") -> bool:
        """The dump gave up waiting for the window: registered/open -> abandoned. Exactly one of
        `claim` and this wins a race; False means the tailer claimed or ended the window first:
        read its state, and if it is closing, wait for the tailer to close it."""
        return self._move(
            window_id,
            WindowState.ABANDONED,
            reason,
            None,
            WindowState.REGISTERED,
            WindowState.OPEN,
        )

    # KEYS: window, rows, rowsmeta, ended, token. ARGV: token ('' = not a tailer write),
    # to_state, reason, allowed from-states... Returns 1 (moved), 0 (not in an allowed state),
    # -1 (fenced).
    _TRANSITION = (
        FENCE
        + NOW_MS
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

    @reachable
    def _move(
        self,
        window_id: str,
        to: WindowState,
        reason: str,
        token: int | None,
        *allowed: WindowState,
    ) -> bool:
        result = self._eval(
            self._TRANSITION,
            keys=[
                self.keys.window(window_id),
                self.keys.window_rows(window_id),
                self.keys.window_rows_meta(window_id),
                self.keys.window_ended(window_id),
                self.keys.tailer_token,
            ],
            args=["" if token is None else token, to.value, reason, *(s.value for s in allowed)],
        )
        if result == -1:
            raise FencedOut.of(self.source, token, f"window {window_id} was not moved to {to}")
        return bool(result == 1)

    @reachable
    def ids(self) -> set[str]:
        """The ids of every window still in Redis, open or ended (an ended one stays until its
        keys expire): a scan, for views of all windows rather than the tailer's or a dump's
        path."""
        prefix = self.keys.window("")
        found = set()
        for key in self._r.scan_iter(match=prefix + "*", count=_SCAN_COUNT, _type="HASH"):
            window_id = text(key)[len(prefix) :]
            if ":" not in window_id:  # not window:<id>:rowsmeta
                found.add(window_id)
        return found

    @reachable
    def state(self, window_id: str) -> WindowStatus | None:
        """The window's state and why it ended (empty unless failed or abandoned); None if the
        window is unknown (never registered, or expired)."""
        raw = self._r.hgetall(self.keys.window(window_id))
        if not raw:
            return None
        data = decode_hash(raw)
        return WindowStatus(
            window=window_of(data),
            state=WindowState(data["state"]),
            reason=data["reason"],
            chunk=json.loads(data["chunk"]),
            registered_ms=int(data["registered_ms"]),
            updated_ms=int(data["updated_ms"]),
        )

    def wait(self, window_id: str, timeout_s: float) -> WindowStatus:
        """Wait until the window ends or `timeout_s` passes; returns its state then (still
        registered or open on a timeout: the dump abandons it next). Blocks on the window's
        `ended` list (BLMOVE onto itself, so every waiter wakes and none consumes the signal)
        and reads the state again at least every second, so a lost signal costs one second."""
        deadline = time.monotonic() + timeout_s
        ended_key = self.keys.window_ended(window_id)
        while True:
            status = self.state(window_id)
            if status is None:
                raise UnknownWindow(f"window {window_id} is not registered (or expired)")
            remaining = deadline - time.monotonic()
            if status.state.ended or remaining <= 0:
                return status
            self._block(ended_key, min(remaining, _WAIT_SLICE_S))

    @reachable
    def _block(self, key: str, timeout_s: float) -> None:
        # BLMOVE takes a fractional timeout; redis-py's blmove() is typed for whole seconds.
        self._r.execute_command(  # type: ignore[no-untyped-call]
            "BLMOVE", key, key, "LEFT", "RIGHT", max(timeout_s, 0.01)
        )
