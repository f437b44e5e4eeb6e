"""One JSON snapshot of a source as the store holds it: the tailer, its windows, the dumps.

Windows have no index in the store (they are found by the dump and the tailer through their
watermark values), so they are found here with SCAN over the source's `window:*` keys, which
Redis serves in small steps between other clients' commands. A window that has ended never
changes again, so it is read once; each snapshot reads only the new and unfinished ones.
Finished dumps are read once per change of their status, likewise.

What the page could not tell from one read is decided here, on the Redis clock: whether the
tailer still beats (`STALE_BEATS` heartbeats missed say it stopped, long before its heartbeat
expires), and each table's pace and ETA (`core.dump_pace`, as `dblog dump` prints them).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

import redis

from airflow_provider_dblog.core.dump_pace import TablePace, clock_text, eta_s
from airflow_provider_dblog.core.dump_plan import TableProgress, estimated_fraction
from airflow_provider_dblog.core.event import JsonValue, TableRef
from airflow_provider_dblog.state import (
    DumpStatus,
    StateStore,
    StateStoreUnavailable,
    TailerHealth,
    VerifyStatus,
    WindowStatus,
)

WINDOW_HORIZON_MS = 120_000
"""Ended windows older than this (Redis clock) are left out of the snapshot."""
MAX_WINDOWS = 300
MAX_DUMPS = 20
"""The most recent dumps listed; `dumps_total` counts them all, and an older one is listed
apart (`pinned`) while a page of it is open (`pin`)."""
MAX_VERIFIES = 10
"""The most recent verify runs listed."""
STALE_BEATS = 3
"""Heartbeats missed before the view says the tailer stopped (one may come late on a busy
tailer; the heartbeat itself expires only after 30 s)."""


def table_rates(
    before: Mapping[str, Mapping[str, int]] | None,
    after: Mapping[str, Mapping[str, int]],
    seconds: float,
) -> dict[str, float]:
    """Events per second by table between two heartbeats' per-table counts."""
    if before is None or seconds <= 0:
        return {}
    rates = {}
    for table, counts in after.items():
        earlier = before.get(table, {})
        moved = sum(max(0, n - earlier.get(op, 0)) for op, n in counts.items() if op != "dropped")
        rates[table] = moved / seconds
    return rates


@dataclass
class _CachedDump:
    updated_ms: int
    json: dict[str, JsonValue]


class LiveView:
    """Builds snapshots of one source; keeps what it learnt between them (ended windows,
    finished dumps, the last heartbeat's counts). One instance per sampling thread."""

    def __init__(self, client: redis.Redis, source: str, heartbeat_s: float = 1.0) -> None:
        self._r = client
        self.store = StateStore(client, source)
        self.stale_after_ms = round(STALE_BEATS * heartbeat_s * 1000)
        self._windows: dict[str, WindowStatus] = {}
        self._dumps: dict[str, _CachedDump] = {}
        self._verifies: dict[str, tuple[VerifyStatus, dict[str, JsonValue]]] = {}
        """Finished verify runs' summaries, by the status they were read with."""
        self._paces: dict[tuple[str, TableRef], TablePace] = {}
        self._pins: Counter[str] = Counter()
        self._pins_lock = threading.Lock()
        self._beat: tuple[int, dict[str, dict[str, int]]] | None = None
        self._rates: dict[str, float] = {}

    def pin(self, dump_id: str, delta: int) -> None:
        """A page of one dump opened (+1) or closed (-1): the snapshots list that dump even
        when it is older than the `MAX_DUMPS` most recent (a link from an old Airflow run)."""
        with self._pins_lock:
            self._pins[dump_id] += delta
            if self._pins[dump_id] <= 0:
                del self._pins[dump_id]

    def snapshot(self) -> dict[str, JsonValue]:
        """The source now; `error` says why parts are missing when Redis is away."""
        snapshot: dict[str, JsonValue] = {"source": self.store.source, "error": None}
        try:
            seconds, micros = self._r.time()
            now_ms = seconds * 1000 + micros // 1000
            snapshot["now_ms"] = now_ms
            snapshot["tailer"] = self._tailer(self.store.tailer.health())
            compaction = self.store.compactor.health()
            snapshot["compaction"] = None if compaction is None else compaction.summary()
            snapshot["windows"] = self._window_list(now_ms)
            with self._pins_lock:
                pins = sorted(self._pins)
            snapshot["pins"] = list(pins)
            snapshot["dumps"], snapshot["pinned"], snapshot["dumps_total"] = self._dump_list(
                now_ms, pins
            )
            snapshot["verifies"] = self._verify_list()
        except StateStoreUnavailable as exc:
            snapshot["error"] = str(exc)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            snapshot["error"] = f"the Redis state store cannot be reached: {exc}"
        return snapshot

    # -- the tailer ----------------------------------------------------------------------------

    def _tailer(self, health: TailerHealth | None) -> JsonValue:
        if health is None:
            return None
        metrics = health.metrics
        tables = _table_counts(metrics.get("tables"))
        if self._beat is None or self._beat[0] != health.at_ms:
            if self._beat is not None:
                seconds = (health.at_ms - self._beat[0]) / 1000
                self._rates = table_rates(self._beat[1], tables, seconds)
            self._beat = (health.at_ms, tables)
        rows: list[JsonValue] = [
            {
                "table": table,
                "ops": {op: n for op, n in counts.items() if op != "dropped"},
                "dropped": counts.get("dropped", 0),
                "per_s": round(self._rates.get(table, 0.0), 1),
            }
            for table, counts in sorted(tables.items())
        ]
        return {
            "owner": health.owner,
            "age_ms": health.age_ms,
            "alive": health.age_ms <= self.stale_after_ms,
            "metrics": {k: v for k, v in metrics.items() if k != "tables"},
            "tables": rows,
        }

    # -- windows -------------------------------------------------------------------------------

    def _window_list(self, now_ms: int) -> list[JsonValue]:
        ids = self.store.windows.ids()
        for gone in self._windows.keys() - ids:
            del self._windows[gone]
        for window_id in ids:
            known = self._windows.get(window_id)
            if known is None or not known.state.ended:
                status = self.store.windows.state(window_id)
                if status is None:
                    self._windows.pop(window_id, None)
                else:
                    self._windows[window_id] = status
        shown = sorted(
            (
                w
                for w in self._windows.values()
                if not w.state.ended or now_ms - w.updated_ms <= WINDOW_HORIZON_MS
            ),
            key=lambda w: (w.registered_ms, w.window.window_id),
        )[-MAX_WINDOWS:]
        return [_window_json(w) for w in shown]

    # -- verify runs ---------------------------------------------------------------------------

    def _verify_list(self) -> list[JsonValue]:
        """The most recent verify runs, newest first, as `dblog status --json` shows them; a
        finished one read again only once its status changes (a run can be resumed)."""
        runs: list[JsonValue] = []
        for verify_id in list(reversed(self.store.verifies.ids()))[:MAX_VERIFIES]:
            status = self.store.verifies.status(verify_id)
            cached = self._verifies.get(verify_id)
            if cached is not None and cached[0] == status:
                runs.append(cached[1])
                continue
            summary = self.store.verifies.summary(verify_id)
            if status is None or summary is None:
                continue
            if status.state.finished:
                self._verifies[verify_id] = (status, summary)
            runs.append(summary)
        return runs

    # -- dumps ---------------------------------------------------------------------------------

    def _dump_list(
        self, now_ms: int, pins: list[str]
    ) -> tuple[list[JsonValue], list[JsonValue], int]:
        """The most recent dumps, newest first; the older ones pinned; how many in all."""
        every = self.store.dumps.ids()
        recent = every[-MAX_DUMPS:]
        pinned = [i for i in pins if i not in recent]
        kept = set(recent) | set(pinned)
        for gone in self._dumps.keys() - kept:
            del self._dumps[gone]
        for seen in [s for s in self._paces if s[0] not in kept]:
            del self._paces[seen]
        listed = [self._dump(dump_id, now_ms) for dump_id in reversed(recent)]
        older = [self._dump(dump_id, now_ms) for dump_id in pinned]
        return [d for d in listed if d], [d for d in older if d], len(every)

    def _dump(self, dump_id: str, now_ms: int) -> JsonValue:
        """One dump's JSON (a finished one as read at its last change); None if unknown."""
        status = self.store.dumps.status(dump_id)
        if status is None:
            return None
        cached = self._dumps.get(dump_id)
        fresh = cached is not None and cached.updated_ms == status.updated_ms
        if cached is None or not (fresh and status.state.finished):
            cached = _CachedDump(status.updated_ms, self._dump_json(dump_id, status, now_ms))
            self._dumps[dump_id] = cached
        return cached.json

    def _dump_json(self, dump_id: str, status: DumpStatus, now_ms: int) -> dict[str, JsonValue]:
        stored = self.store.dumps.get(dump_id)
        progress = self.store.dumps.load_progress(dump_id)
        controls = self.store.dumps.controls(dump_id)
        finished = status.state.finished
        if finished:  # a run of it that is resumed later is paced anew
            for seen in [s for s in self._paces if s[0] == dump_id]:
                del self._paces[seen]
        tables: list[JsonValue] = []
        rates: list[float] = []
        etas: list[float | None] = []
        if stored is not None:
            keys_requested = len(stored.request.keys)
            for table in stored.request.tables:
                done = progress.get(table) or TableProgress(table)
                pace = None if finished else self._pace(dump_id, done, now_ms / 1000)
                fraction = estimated_fraction(
                    done, keys_requested, None if pace is None else pace.first
                )
                rate = None
                if pace is not None:
                    rate = pace.rows_per_s(None if done.done else now_ms / 1000)
                    if not done.done and rate is not None:
                        rates.append(rate)
                eta = eta_s(done, fraction, rate)
                if not done.done:
                    etas.append(eta)
                tables.append(
                    {
                        "table": str(table),
                        "rows": done.rows_done,
                        "chunks": done.chunks_done,
                        "started": done.started,
                        "done": done.done,
                        "fraction": None if fraction is None else round(fraction, 4),
                        "rows_per_s": None if rate is None else round(rate, 1),
                        "eta": None if eta is None else clock_text(eta),
                    }
                )
        return {
            **status.to_json(dump_id),
            "duration": _duration(status, now_ms),
            "rows_per_s": _dump_rate(status, rates),
            "eta": None if finished else _dump_eta(etas),
            "driver": self.store.dumps.driver(dump_id),
            "origin": self.store.dumps.origin(dump_id),
            "controls": None if controls is None else controls.to_json(),
            "tables": tables,
            "where": None if stored is None else stored.request.where,
            "read_only": stored is not None and stored.request.read_only,
        }

    def _pace(self, dump_id: str, progress: TableProgress, now_s: float) -> TablePace | None:
        """The table's pace since this view first saw it being dumped; None if it never did
        (done, or not started, before the view looked)."""
        seen = (dump_id, progress.table)
        pace = self._paces.get(seen)
        if pace is None and progress.started and not progress.done:
            pace = self._paces[seen] = TablePace(now_s, progress.rows_done)
        if pace is not None:
            pace.step(progress, now_s)
        return pace


def _duration(status: DumpStatus, now_ms: int) -> str | None:
    """How long the dump ran (runs so far, while it runs), from its first start."""
    if status.started_ms is None:
        return None
    return clock_text(((status.finished_ms or now_ms) - status.started_ms) / 1000)


def _dump_eta(tables_left: list[float | None]) -> str | None:
    """When the dump will be done: known once every table left has an ETA (a table not
    started yet has none)."""
    known = [eta for eta in tables_left if eta is not None]
    if not tables_left or len(known) < len(tables_left):
        return None
    return clock_text(sum(known))


def _dump_rate(status: DumpStatus, running_tables: list[float]) -> float | None:
    """Rows per second: the tables being dumped now, as measured; a finished dump's
    average over its run."""
    if not status.state.finished:
        return round(sum(running_tables), 1) if running_tables else None
    if status.started_ms is None or status.finished_ms is None:
        return None
    seconds = (status.finished_ms - status.started_ms) / 1000
    return round(status.rows / seconds, 1) if seconds > 0 else None


def _table_counts(raw: JsonValue) -> dict[str, dict[str, int]]:
    """The heartbeat's `tables` metric: {"schema.table": {op: count, "dropped": n}}."""
    if not isinstance(raw, dict):
        return {}
    return {
        str(table): {str(k): int(v) for k, v in counts.items() if isinstance(v, int)}
        for table, counts in raw.items()
        if isinstance(counts, dict)
    }


def _window_json(status: WindowStatus) -> dict[str, JsonValue]:
    chunk = status.chunk
    return {
        "window_id": status.window.window_id,
        "dump_id": status.window.dump_id,
        "table": str(status.window.table),
        "state": status.state.value,
        "ended": status.state.ended,
        "reason": status.reason,
        "seq": chunk.get("seq"),
        "keys": chunk.get("keys"),
        "after": chunk.get("after"),
        "upto": chunk.get("upto"),
        "limit": chunk.get("limit"),
        "registered_ms": status.registered_ms,
        "updated_ms": status.updated_ms,
    }
