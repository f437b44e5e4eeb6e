"""Verify runs as Prometheus metrics, served with the tailer's (`[tailer] metrics_port`): a verify
run lives in a `dblog verify` process or an Airflow task, too short for a scrape, while the
tailer runs all along beside the same store.

At each scrape the most recent `MAX_RUNS` runs are read from the store (their summaries, as
`dblog status` shows them), so the series stay few however many runs the store keeps. While
the store is away the families are left out; `dblog_tailer_state` says why.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from airflow_provider_dblog.state import StateStore, StateStoreUnavailable, VerifyState
from airflow_provider_dblog.state.verifies import COUNTERS

log = logging.getLogger(__name__)

MAX_RUNS = 10
"""The most recent verify runs a scrape reports."""


class VerifyCollector(Collector):
    """`dblog_verify_keys` (a run's keys by what was found: checked, in_flux, missing, extra,
    changed), `dblog_verify_state` (1 for the run's state) and
    `dblog_verify_finished_timestamp_seconds` of the most recent runs."""

    def __init__(self, store: StateStore) -> None:
        self._store = store  # looked into at a scrape only

    def collect(self) -> Iterator[Metric]:
        verifies = self._store.verifies
        try:
            ids = list(reversed(verifies.ids()))[:MAX_RUNS]
            runs = [run for v in ids if (run := verifies.summary(v)) is not None]
        except StateStoreUnavailable as exc:
            log.debug("verify metrics left out: %s", exc)
            return
        keys = GaugeMetricFamily(
            "dblog_verify_keys",
            "Keys of a recent verify run by what was found (missing, extra, changed: differences).",
            labels=["verify_id", "found"],
        )
        state = GaugeMetricFamily(
            "dblog_verify_state",
            "1 for a recent verify run's state.",
            labels=["verify_id", "state"],
        )
        finished = GaugeMetricFamily(
            "dblog_verify_finished_timestamp_seconds",
            "When a recent verify run finished (done, failed or cancelled).",
            labels=["verify_id"],
        )
        for run in runs:
            verify_id = str(run["verify_id"])
            for counter in COUNTERS:
                keys.add_metric([verify_id, counter], float(str(run[counter])))
            for value in VerifyState:
                state.add_metric([verify_id, value.value], float(run["state"] == value.value))
            if run["finished_ms"] is not None:
                finished.add_metric([verify_id], float(str(run["finished_ms"])) / 1000)
        yield from (keys, state, finished)
