"""One JSON snapshot of a source as the store holds it: the tailer, its windows, the dumps.

Windows have no index in the store (they are found by the dump and the tailer through their
watermark values), so they are found here with SCAN over the source's `window:*` keys, which
Redis serves in small steps between other clients' commands. A window that has ended never
changes again, so it is read once; each snapshot reads only the new and unfinished ones.
Finished dumps are read once per change of their status, likewise.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import redis

from airflow_provider_dblog.core.dump_plan import TableProgress, estimated_fraction, integer_key
from airflow_provider_dblog.core.event import JsonValue, TableRef
from airflow_provider_dblog.state import (
    DumpStatus,
    StateStore,
    StateStoreUnavailable,
    TailerHealth,
    WindowStatus,
)
from airflow_provider_dblog.state.compactor import CompactorHealth

WINDOW_HORIZON_MS = 120_000
"""Ended windows older than this (Redis clock) are left out of the snapshot."""
MAX_WINDOWS = 300
MAX_DUMPS = 20


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

    def __init__(self, client: redis.Redis, source: str) -> None:
        self._r = client
        self.store = StateStore(client, source)
        self._windows: dict[str, WindowStatus] = {}
        self._dumps: dict[str, _CachedDump] = {}
        self._first_keys: dict[tuple[str, TableRef], tuple[int, int]] = {}
        self._beat: tuple[int, dict[str, dict[str, int]]] | None = None
        self._rates: dict[str, float] = {}

    def snapshot(self) -> dict[str, JsonValue]:
        """The source now; `error` says why parts are missing when Redis is away."""
        snapshot: dict[str, JsonValue] = {"source": self.store.source, "error": None}
        try:
            seconds, micros = self._r.time()
            now_ms = seconds * 1000 + micros // 1000
            snapshot["now_ms"] = now_ms
            snapshot["tailer"] = self._tailer(self.store.tailer.health())
            snapshot["compaction"] = compaction_json(self.store.compactor.health())
            snapshot["windows"] = self._window_list(now_ms)
            snapshot["dumps"] = self._dump_list()
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

    # -- dumps ---------------------------------------------------------------------------------

    def _dump_list(self) -> list[JsonValue]:
        ids = self.store.dumps.ids()[-MAX_DUMPS:]
        for gone in self._dumps.keys() - set(ids):
            del self._dumps[gone]
        for seen in [s for s in self._first_keys if s[0] not in ids]:
            del self._first_keys[seen]
        listed: list[JsonValue] = []
        for dump_id in reversed(ids):
            status = self.store.dumps.status(dump_id)
            if status is None:
                continue
            cached = self._dumps.get(dump_id)
            fresh = cached is not None and cached.updated_ms == status.updated_ms
            if not (fresh and status.state.finished):
                cached = _CachedDump(status.updated_ms, self._dump_json(dump_id, status))
                self._dumps[dump_id] = cached
            assert cached is not None
            listed.append(cached.json)
        return listed

    def _dump_json(self, dump_id: str, status: DumpStatus) -> dict[str, JsonValue]:
        stored = self.store.dumps.get(dump_id)
        progress = self.store.dumps.load_progress(dump_id)
        controls = self.store.dumps.controls(dump_id)
        tables: list[JsonValue] = []
        if stored is not None:
            keys_requested = len(stored.request.keys)
            for table in stored.request.tables:
                done = progress.get(table) or TableProgress(table)
                first = self._first_key(dump_id, done)
                fraction = estimated_fraction(done, keys_requested, first)
                tables.append(
                    {
                        "table": str(table),
                        "rows": done.rows_done,
                        "chunks": done.chunks_done,
                        "started": done.started,
                        "done": done.done,
                        "fraction": None if fraction is None else round(fraction, 4),
                    }
                )
        return {
            "dump_id": dump_id,
            "state": status.state.value,
            "reason": status.reason,
            "chunks": status.chunks,
            "rows": status.rows,
            "windows_retried": status.windows_retried,
            "created_ms": status.created_ms,
            "started_ms": status.started_ms,
            "finished_ms": status.finished_ms,
            "updated_ms": status.updated_ms,
            "driver": self.store.dumps.driver(dump_id),
            "controls": None
            if controls is None
            else {
                "paused": controls.paused,
                "cancelled": controls.cancelled,
                "chunk_size": controls.chunk_size,
                "delay_ms": controls.delay_ms,
                "max_rows_per_s": controls.max_rows_per_s,
            },
            "tables": tables,
            "where": None if stored is None else stored.request.where,
        }

    def _first_key(self, dump_id: str, progress: TableProgress) -> tuple[int, int] | None:
        """The first (integer key, rows done) this view saw of a table: its estimate's base."""
        seen = (dump_id, progress.table)
        key = integer_key(progress.after)
        if seen not in self._first_keys and key is not None:
            self._first_keys[seen] = (key, progress.rows_done)
        return self._first_keys.get(seen)


def compaction_json(health: CompactorHealth | None) -> JsonValue:
    """The compaction follower's line: who folds, how fresh the lake is (`follow_metrics`);
    None when no follower beats (a lake compacted in batches, or none)."""
    if health is None:
        return None
    m = health.metrics
    return {
        "owner": health.owner,
        "age_ms": health.age_ms,
        "freshness_s": m.get("freshness_s"),
        "events": m.get("events", 0),
        "pending_bytes": m.get("pending_bytes", 0),
    }


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
