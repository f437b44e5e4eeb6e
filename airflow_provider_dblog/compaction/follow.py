"""The compaction as a service beside the tailer (`dblog lake compact --follow`): it folds the
tailer's event files into the lake as they grow, one run (`run.compact`) whenever there are
new complete lines, looking every `interval_s`.

One follower of a source folds at a time: it holds the compaction's lease
(`CompactorStore.lease`, a fencing token per holder) and renews it from a thread of its own,
so a run longer than the lease keeps it; the others stand by and take the lease when it
expires (its holder was killed) or is released (its holder stopped). The holder also renews
the lease just before each run, so one that stalled past the lease (a standby holds it now)
starts no run: it stands by, after ending the run in progress if the thread's renewal was the
one refused. Should a stalled holder's run overlap the new holder's, the lake's lock
(`run.output_lock`) refuses one of them on a shared host, and either way each table's
progress commits with its data: nothing is folded twice.

Each run holds the lake's lock only while it runs, so `dblog lake maintain` (and a batch
compaction) take it between runs; a run that finds it held is tried again an interval later.
Freshness and the other figures: `follow_metrics`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import SparkSession

from airflow_provider_dblog.compaction.follow_metrics import FollowMetrics, FollowStats
from airflow_provider_dblog.compaction.run import CompactionLocked, CompactOptions, compact
from airflow_provider_dblog.compaction.segments import CompactState, plan_segments
from airflow_provider_dblog.core.errors import DBLogError
from airflow_provider_dblog.leased_service import lead_while_leased, metrics_served
from airflow_provider_dblog.state import CompactorStore, StateStoreUnavailable

log = logging.getLogger(__name__)


class FollowFailed(DBLogError):
    """The follower stopped on an error it cannot ride through; the cause is chained."""


@dataclass(frozen=True)
class FollowSettings:
    """How often the follower looks for new events, how long its lease lasts unrenewed, and
    where it serves its metrics (no endpoint without a port)."""

    interval_s: float = 1.0
    lease_ttl_ms: int = 15_000
    metrics_port: int | None = None
    metrics_address: str = "127.0.0.1"

    def __post_init__(self) -> None:
        if not self.interval_s > 0:
            raise ValueError(f"the interval must be above 0 seconds, got {self.interval_s}")
        if self.lease_ttl_ms < 100:
            raise ValueError(f"the lease TTL must be 100 ms or more, got {self.lease_ttl_ms}")


class Follower:
    """Folds `input_dir` (the tailer's NDJSON directory) into the lake at `output` until
    `stop` is set, while it holds the lease of `store`'s source. `options` gives each run's
    options (called per run: a prune horizon is read afresh); `spark` starts the session a
    large backlog folds on (None: every run folds in the driver)."""

    def __init__(
        self,
        store: CompactorStore,
        input_dir: Path,
        output: Path,
        options: Callable[[], CompactOptions],
        spark: Callable[[], SparkSession] | None,
        *,
        owner: str | None = None,
        settings: FollowSettings | None = None,
    ) -> None:
        self._store, self._input, self._output = store, input_dir, output
        self._options, self._spark = options, spark
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}"
        self._settings = settings or FollowSettings()
        self.stats = FollowStats()
        self.metrics = FollowMetrics(self.stats)

    def run(self, stop: threading.Event) -> None:
        """Fold while holding the lease; after losing it, wait again as a standby."""
        settings = self._settings
        with metrics_served(
            self.metrics, settings.metrics_port, settings.metrics_address, FollowFailed
        ):
            lead_while_leased(
                self._store.lease,
                self.owner,
                settings.lease_ttl_ms,
                stop,
                lambda token: self._lead(stop, token),
                self._stand_by,
                log,
            )

    def _stand_by(self) -> None:
        self.stats.state = "standby"
        log.info("compaction %s stands by: another follower folds", self.owner)

    def _lead(self, stop: threading.Event, token: int) -> None:
        log.info("compaction %s holds the lease (token %d)", self.owner, token)
        self.stats.state, self.stats.lease_token = "leading", token
        lost = threading.Event()
        renewer = threading.Thread(
            target=self._renew, args=(token, stop, lost), name="dblog-compact-lease", daemon=True
        )
        renewer.start()
        try:
            while not stop.is_set() and not lost.is_set():
                self._fold_new(token, lost)
                self._beat()
                stop.wait(self._settings.interval_s)
            if lost.is_set():
                log.warning("compaction %s lost its lease (token %d)", self.owner, token)
        except Exception as exc:
            log.exception("compaction %s stopped: %s", self.owner, exc)
            raise FollowFailed(
                f"compaction {self.owner} stopped: {type(exc).__name__}: {exc}"
            ) from exc
        finally:
            lost.set()
            renewer.join()
            self.stats.lease_token = 0
            with contextlib.suppress(StateStoreUnavailable):
                self._store.lease.release(self.owner, token)

    def _renew(self, token: int, stop: threading.Event, lost: threading.Event) -> None:
        """Renew the lease every quarter of its TTL until `lost` is set; set it when the lease
        is no longer ours, or Redis stayed away for a whole TTL (a standby may hold it now)."""
        ttl = self._settings.lease_ttl_ms
        renewed = time.monotonic()
        while not lost.wait(ttl / 4000):
            try:
                if not self._store.lease.renew(self.owner, token, ttl):
                    lost.set()
                    return
                renewed = time.monotonic()
            except StateStoreUnavailable as exc:
                log.warning("cannot renew the compaction lease: %s", exc)
                if time.monotonic() - renewed > ttl / 1000:
                    lost.set()
                    return

    def _fold_new(self, token: int, lost: threading.Event) -> None:
        """A run if the event files hold complete lines no run has read and the lease is
        still ours; none otherwise."""
        try:
            segments, _ = plan_segments(self._input, CompactState.load(self._output).files)
        except FileNotFoundError:  # no event files yet: the tailer has not written
            segments = []
        self.stats.pending_bytes = sum(s.end - s.start for s in segments)
        if not segments or not self._still_ours(token, lost):
            return
        try:
            report = compact(self._spark, self._input, self._output, self._options())
        except CompactionLocked as exc:
            self.stats.runs_locked += 1
            log.info("%s; folding again in %g s", exc, self._settings.interval_s)
            return
        except StateStoreUnavailable as exc:  # the prune horizon could not be read
            log.warning("no run now: %s", exc)
            return
        self.stats.folded(report)
        self.stats.pending_bytes = 0
        log.info(
            "folded %d events into %d tables (position %s)",
            report.events,
            len(report.tables),
            report.state.position,
        )

    def _still_ours(self, token: int, lost: threading.Event) -> bool:
        """Renew the lease now, before a run: a holder that stalled past its TTL folds nothing
        more (and one that cannot tell, Redis being away, waits)."""
        try:
            if self._store.lease.renew(self.owner, token, self._settings.lease_ttl_ms):
                return True
            lost.set()
        except StateStoreUnavailable as exc:
            log.warning("no run now, the lease cannot be checked: %s", exc)
        return False

    def _beat(self) -> None:
        ttl_s = max(10.0, 3 * self._settings.interval_s)
        with contextlib.suppress(StateStoreUnavailable):
            self._store.beat(self.owner, self.stats.metrics(), ttl_s)
