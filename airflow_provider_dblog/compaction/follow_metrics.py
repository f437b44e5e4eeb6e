"""What the compaction follower counts, for its heartbeat (`dblog status`, the live view) and
its Prometheus endpoint (`--metrics-port`, `/metrics`; a registry of its own, never the global
one). Every name starts with `dblog_compact_`; docs/operations.md ("Metrics") lists them.

Freshness is the lake's side of the tailer's lag: the seconds between the source's commit of
the oldest event a run folded (`source.ts_ms`, which every log event carries) and the end of
that run's last commit, so the longest any event of the run waited to reach the lake, on the
follower's clock against the source's. A run of dump rows only (no commit time) leaves it as
it was. Each run's freshness also goes into a histogram (`dblog_compact_run_freshness_seconds`),
so a quantile over an hour says how fresh the lake was, not only how fresh the last run left it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import accumulate
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from airflow_provider_dblog.compaction.run import CompactReport
from airflow_provider_dblog.core.event import JsonValue

log = logging.getLogger(__name__)

STATES = ("starting", "standby", "leading")
"""The values of `dblog_compact_state`'s label."""

FRESHNESS_BUCKETS_S = (1.0, 2.5, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)
"""Upper bounds of the run freshness histogram, around the 30 s a follower should keep."""


@dataclass
class FreshnessHistogram:
    """Runs by freshness: counts per bucket (not cumulative) and their sum."""

    counts: list[int] = field(default_factory=lambda: [0] * (len(FRESHNESS_BUCKETS_S) + 1))
    sum_s: float = 0.0

    def observe(self, seconds: float) -> None:
        bucket = next(
            (i for i, bound in enumerate(FRESHNESS_BUCKETS_S) if seconds <= bound),
            len(FRESHNESS_BUCKETS_S),
        )
        self.counts[bucket] += 1
        self.sum_s += seconds

    def family(self) -> HistogramMetricFamily:
        bounds = [str(b) for b in FRESHNESS_BUCKETS_S] + ["+Inf"]
        return HistogramMetricFamily(
            "dblog_compact_run_freshness_seconds",
            "Freshness of each run that folded log events (see dblog_compact_freshness_seconds).",
            buckets=list(zip(bounds, accumulate(self.counts), strict=True)),
            sum_value=self.sum_s,
        )


@dataclass
class FollowStats:
    """The follower's counters and its last run, kept across leaderships."""

    state: str = "starting"
    lease_token: int = 0
    """The fencing token of the lease held; 0 when none."""
    runs: int = 0
    runs_locked: int = 0
    """Runs not started because another holder of the lake's lock (`dblog lake maintain`, a
    batch compaction) had it: tried again an interval later."""
    events: int = 0
    pending_bytes: int = 0
    """Complete event bytes the tailer wrote that no run has read yet (at the last look)."""
    freshness_s: float | None = None
    freshness: FreshnessHistogram = field(default_factory=FreshnessHistogram)
    last_fold_ms: int = 0
    """When the last run that folded events ended (Unix time, ms)."""
    position: list[int] | None = None

    def folded(self, report: CompactReport) -> None:
        """Count a run that ended now."""
        now_ms = int(time.time() * 1000)
        self.runs += 1
        self.events += report.events
        self.position = report.state.position
        if report.events:
            self.last_fold_ms = now_ms
        if report.committed is not None:
            self.freshness_s = max(0.0, (now_ms - report.committed[0]) / 1000)
            self.freshness.observe(self.freshness_s)

    def metrics(self) -> dict[str, JsonValue]:
        """What each heartbeat carries."""
        return {
            "state": self.state,
            "runs": self.runs,
            "runs_locked": self.runs_locked,
            "events": self.events,
            "pending_bytes": self.pending_bytes,
            "freshness_s": self.freshness_s,
            "last_fold_ms": self.last_fold_ms,
            "position": self.position,
        }


class FollowMetrics:
    """The follower's metrics, in a registry of its own."""

    def __init__(self, stats: FollowStats) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_StatsCollector(stats))

    def serve(self, address: str, port: int) -> WSGIServer:
        """Serve `/metrics` in a daemon thread until the returned server is shut down."""
        server, _ = start_http_server(port, addr=address, registry=self.registry)
        log.info("serving Prometheus metrics on http://%s:%d/metrics", address, port)
        return server


class _StatsCollector(Collector):
    def __init__(self, stats: FollowStats) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        stats = self._stats
        if stats.freshness_s is not None:
            yield GaugeMetricFamily(
                "dblog_compact_freshness_seconds",
                "Seconds from the source's commit of the oldest event the last run folded to "
                "the end of that run.",
                stats.freshness_s,
            )
        yield stats.freshness.family()
        yield GaugeMetricFamily(
            "dblog_compact_last_fold_timestamp_seconds",
            "When the last run that folded events ended (Unix time); 0 before the first.",
            stats.last_fold_ms / 1000,
        )
        yield GaugeMetricFamily(
            "dblog_compact_pending_bytes",
            "Complete event bytes written by the tailer that no run has read yet.",
            stats.pending_bytes,
        )
        yield CounterMetricFamily(
            "dblog_compact_events",
            "Events folded into the lake (replays not counted).",
            stats.events,
        )
        runs = CounterMetricFamily(
            "dblog_compact_runs",
            "Compaction runs, by outcome (locked: another holder of the lake's lock had it).",
            labels=["outcome"],
        )
        runs.add_metric(["folded"], stats.runs)
        runs.add_metric(["locked"], stats.runs_locked)
        yield runs
        state = GaugeMetricFamily(
            "dblog_compact_state", "1 for what the follower is doing now.", labels=["state"]
        )
        for name in STATES:
            state.add_metric([name], 1 if name == stats.state else 0)
        yield state
        yield GaugeMetricFamily(
            "dblog_compact_lease_token",
            "Fencing token of the compaction lease this follower holds; 0 when it holds none.",
            stats.lease_token,
        )
