"""The tailer's Prometheus metrics: what it counts, turned into metric families when scraped.

Opt-in: `[tailer] metrics_port` serves them over HTTP at `/metrics` (bound to
`metrics_address`, 127.0.0.1 unless set). Each tailer has a `CollectorRegistry` of its own,
never the global one, so two tailers in one process (or in one test run) do not clash.

Nothing here is on the read path. The session counts in plain `TailerStats` fields and dicts
(one dict increment per log event, one per chunk), and a collector reads them only when
scraped; a `prometheus_client` counter per event would cost several times more. The writer
observes the output batch latency histogram once per batch, and counts a batch whose write
raised (`output_failure` says why). The log backlog is asked of the current session's reader
at scrape time, on a connection of its own (see `ReportsLogBacklog`).

The metrics, their types, labels and meaning are listed in docs/operations.md ("Metrics");
`dblog_tailer_` is every name's prefix.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Histogram, start_http_server
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from airflow_provider_dblog.core.errors import DBLogError
from airflow_provider_dblog.core.event import JsonValue, Op
from airflow_provider_dblog.core.reconciler import FailureReason
from airflow_provider_dblog.outputs.base import OutputFenced, OutputUnavailable
from airflow_provider_dblog.sources.base import LogBacklog

log = logging.getLogger(__name__)

STATES = (
    "starting",
    "standby",
    "leading",
    "source_unavailable",
    "state_store_unavailable",
    "output_unavailable",
)
"""The values of `dblog_tailer_state`'s label: `TailerStats.state` up to its colon."""

OUTPUT_FAILURES = ("unavailable", "fenced", "error")
"""The values of `dblog_tailer_output_batches_failed_total`'s label (`output_failure`)."""


def _batch_histogram() -> Histogram:
    """Registered by `TailerMetrics` in the tailer's own registry (never the global one)."""
    return Histogram(
        "dblog_tailer_output_batch_seconds",
        "One output write of a batch, until durable.",
        registry=None,
    )


def output_failure(exc: BaseException) -> str:
    """Why an output write failed, as `dblog_tailer_output_batches_failed_total` says it:
    `unavailable` (the session starts again after a backoff and writes the batch again),
    `fenced` (a newer leader wrote there: this tailer stands by), `error` (anything else: the
    tailer stops)."""
    if isinstance(exc, OutputUnavailable):
        return "unavailable"
    if isinstance(exc, OutputFenced):
        return "fenced"
    return "error"


@dataclass
class TailerStats:
    """What the tailer counts, kept across sessions: the heartbeat reports the totals, the
    metrics endpoint (`TailerMetrics`) all of it."""

    events: int = 0
    dump_rows: int = 0
    last_commit: int = 0
    last_ts_ms: int = 0
    caught_up: bool = False
    """The source had nothing more to send and everything handed over was durable."""
    windows_closed: int = 0
    windows_failed: int = 0
    windows_replayed: int = 0
    """hws met again after a restart, of windows an earlier session opened or ended: not
    failures (`OpenWindows._replayed`)."""
    open_windows: int = 0
    state: str = "starting"
    """What the tailer is doing: leading, standby, or why it cannot lead right now."""
    lease_token: int = 0
    """The fencing token of the lease held; 0 when none."""
    events_by_table: dict[tuple[str, str, Op], int] = field(default_factory=dict)
    """Events handed over by (schema, table, op)."""
    chunk_rows_emitted: dict[tuple[str, str], int] = field(default_factory=dict)
    """Chunk rows emitted at hw, by (schema, table)."""
    chunk_rows_dropped: dict[tuple[str, str], int] = field(default_factory=dict)
    """Chunk rows whose key changed in their window, by (schema, table)."""
    windows_opened: int = 0
    windows_failed_by_reason: dict[FailureReason, int] = field(default_factory=dict)
    output_batch_seconds: Histogram = field(default_factory=_batch_histogram)
    output_batches_failed: dict[str, int] = field(default_factory=dict)
    """Output writes that raised, by `output_failure` (the writer's thread counts them)."""

    def count(self, schema: str, table: str, op: Op, events: int = 1) -> None:
        key = (schema, table, op)
        self.events_by_table[key] = self.events_by_table.get(key, 0) + events

    def metrics(self) -> dict[str, JsonValue]:
        """What each heartbeat carries (`dblog status`, `dblog ui`, Airflow's health checks)."""
        lag_ms = 0
        if self.last_ts_ms and not self.caught_up:
            lag_ms = max(0, int(time.time() * 1000) - self.last_ts_ms)
        return {
            "state": self.state,
            "events": self.events,
            "dump_rows": self.dump_rows,
            "last_commit": self.last_commit,
            "lag_ms": lag_ms,
            "open_windows": self.open_windows,
            "windows_closed": self.windows_closed,
            "windows_failed": self.windows_failed,
            "tables": self.table_counts(),
        }

    def table_counts(self) -> dict[str, JsonValue]:
        """{"schema.table": {op: events, "dropped": chunk rows dropped}}, what `dblog ui` shows
        flowing per table: a copy of the counters once per heartbeat, nothing per event."""
        tables: dict[str, dict[str, JsonValue]] = {}
        # list(): one C call, safe while the session thread adds a key (metrics scrapes).
        for (schema, table, op), count in list(self.events_by_table.items()):
            tables.setdefault(f"{schema}.{table}", {})[str(op)] = count
        for (schema, table), count in list(self.chunk_rows_dropped.items()):
            tables.setdefault(f"{schema}.{table}", {})["dropped"] = count
        return dict(tables)


class TailerMetrics:
    """The metrics of one tailer, in a registry of its own.

    `backlog` returns the current reader's `LogBacklog`, or None when there is no reader (not
    leading) or it cannot say; it is called once per scrape. `served_with` are other families
    the tailer's endpoint serves (the verify runs')."""

    def __init__(
        self,
        stats: TailerStats,
        backlog: Callable[[], LogBacklog | None],
        *served_with: Collector,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_StatsCollector(stats, backlog))
        self.registry.register(stats.output_batch_seconds)
        for collector in served_with:
            self.registry.register(collector)

    def serve(self, address: str, port: int) -> WSGIServer:
        """Serve `/metrics` in a daemon thread until the returned server is shut down."""
        server, _ = start_http_server(port, addr=address, registry=self.registry)
        log.info("serving Prometheus metrics on http://%s:%d/metrics", address, port)
        return server


class _StatsCollector(Collector):
    def __init__(self, stats: TailerStats, backlog: Callable[[], LogBacklog | None]) -> None:
        self._stats = stats
        self._backlog = backlog

    def collect(self) -> Iterator[Metric]:
        stats = self._stats
        events = CounterMetricFamily(
            "dblog_tailer_events",
            "Events handed to the output, by table and op (r: chunk rows).",
            labels=["schema", "table", "op"],
        )
        # list(): one C call, safe while the session thread adds a key.
        for (schema, table, op), count in list(stats.events_by_table.items()):
            events.add_metric([schema, table, str(op)], count)
        yield events
        for name, counts, help_text in (
            ("emitted", stats.chunk_rows_emitted, "Chunk rows emitted at their window's hw."),
            (
                "dropped",
                stats.chunk_rows_dropped,
                "Chunk rows dropped because their key changed in the window (collision).",
            ),
        ):
            rows = CounterMetricFamily(
                f"dblog_tailer_chunk_rows_{name}", help_text, labels=["schema", "table"]
            )
            for (schema, table), count in list(counts.items()):
                rows.add_metric([schema, table], count)
            yield rows
        yield CounterMetricFamily(
            "dblog_tailer_windows_opened", "Windows opened (lw met).", stats.windows_opened
        )
        yield CounterMetricFamily(
            "dblog_tailer_windows_closed",
            "Windows closed (hw met, chunk rows emitted).",
            stats.windows_closed,
        )
        failed = CounterMetricFamily(
            "dblog_tailer_windows_failed",
            "Windows ended without emitting their chunk, by reason (expired: no hw in time).",
            labels=["reason"],
        )
        by_reason = dict(stats.windows_failed_by_reason)
        for reason in FailureReason:
            failed.add_metric([reason.value], by_reason.get(reason, 0))
        yield failed
        yield CounterMetricFamily(
            "dblog_tailer_windows_replayed",
            "Windows whose hw a restarted tailer met again, opened or ended before the restart: "
            "not counted as failed (an open one is ended so that its dump retries the chunk).",
            stats.windows_replayed,
        )
        yield GaugeMetricFamily(
            "dblog_tailer_windows_open", "Windows open now.", stats.open_windows
        )
        batches = CounterMetricFamily(
            "dblog_tailer_output_batches_failed",
            "Output writes of a batch that raised, by reason (nothing of it acknowledged).",
            labels=["reason"],
        )
        # Every reason from the start, at 0: a first failure is then an increase Prometheus sees.
        failed_batches = dict(stats.output_batches_failed)
        for why in OUTPUT_FAILURES:
            batches.add_metric([why], failed_batches.get(why, 0))
        yield batches
        heartbeat = stats.metrics()
        yield GaugeMetricFamily(
            "dblog_tailer_lag_seconds",
            "Age of the last event read; 0 once the tailer has caught up.",
            int(heartbeat["lag_ms"]) / 1000,
        )
        yield from self._log_backlog()
        state = GaugeMetricFamily(
            "dblog_tailer_state", "1 for what the tailer is doing now.", labels=["state"]
        )
        now = stats.state.split(":", 1)[0].replace(" ", "_")
        for name in STATES:
            state.add_metric([name], 1 if name == now else 0)
        yield state
        yield GaugeMetricFamily(
            "dblog_tailer_lease_token",
            "Fencing token of the lease this tailer holds; 0 when it holds none.",
            stats.lease_token,
        )

    def _log_backlog(self) -> Iterator[Metric]:
        """The backlog gauges, or none when the reader cannot say now (not leading, a source
        without `log_backlog`, or the server away)."""
        try:
            backlog = self._backlog()
        except DBLogError as exc:
            log.warning("log backlog unknown for the metrics: %s", exc)
            return
        if backlog is None:
            return
        yield GaugeMetricFamily(
            "dblog_tailer_log_behind_bytes",
            "Log bytes from the acknowledged position to the server's current one.",
            backlog.behind_bytes,
        )
        if backlog.retained_bytes is not None:
            yield GaugeMetricFamily(
                "dblog_tailer_log_retained_bytes",
                "Log bytes the server keeps for this capture (PostgreSQL: slot WAL retained).",
                backlog.retained_bytes,
            )
