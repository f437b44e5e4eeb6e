"""The tailer's Prometheus endpoint serves the most recent verify runs' counts and states, read
from a real Redis at each scrape; with Redis away the verify families are left out and the
tailer's own are still served."""

from __future__ import annotations

import uuid

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from airflow_provider_dblog.core.event import TableRef
from airflow_provider_dblog.core.verify import ChunkVerdict, Difference
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.sources.base import LogBacklog
from airflow_provider_dblog.state import StateStore, VerifyState
from airflow_provider_dblog.tailer.metrics import TailerMetrics, TailerStats
from airflow_provider_dblog.verify.metrics import MAX_RUNS, VerifyCollector

pytestmark = pytest.mark.integration
ORDERS = TableRef("shop", "orders")


LABELS = ("verify_id", "found", "state")


def scrape(metrics: TailerMetrics) -> dict[str, dict[tuple[str, ...], float]]:
    """{family: {its samples' label values, in the order of `LABELS`: value}}."""
    text = generate_latest(metrics.registry).decode()
    return {
        family.name: {
            tuple(s.labels[name] for name in LABELS if name in s.labels): s.value
            for s in family.samples
        }
        for family in text_string_to_metric_families(text)
    }


def test_recent_verify_runs_are_served_with_the_tailer_s_metrics(redis_server: RedisInfo) -> None:
    with redis_server.client() as client:
        store = StateStore(client, f"metrics-{uuid.uuid4().hex[:12]}")
        metrics = TailerMetrics(TailerStats(), lambda: LogBacklog(0, 0), VerifyCollector(store))
        assert scrape(metrics)["dblog_verify_keys"] == {}
        for n in range(MAX_RUNS + 2):
            store.verifies.create(f"v{n:02}", {"tables": [str(ORDERS)], "chunk_size": 10})
        differs = ((3,), Difference.MISSING), ((4,), Difference.CHANGED), ((5,), Difference.CHANGED)
        store.verifies.chunk_done("v11", ORDERS, {"after": [9]}, ChunkVerdict(9, 1, differs))
        store.verifies.finish("v11", VerifyState.DONE)
        families = scrape(metrics)

    keys = families["dblog_verify_keys"]
    assert {run for run, _ in keys} == {f"v{n:02}" for n in range(2, MAX_RUNS + 2)}
    assert {found: value for (run, found), value in keys.items() if run == "v11"} == {
        "checked": 9,
        "in_flux": 1,
        "missing": 1,
        "extra": 0,
        "changed": 2,
    }
    states = families["dblog_verify_state"]
    assert states[("v11", "done")] == 1 and states[("v11", "running")] == 0
    assert states[("v10", "running")] == 1
    finished = families["dblog_verify_finished_timestamp_seconds"]
    assert list(finished) == [("v11",)] and finished[("v11",)] > 1.7e9


def test_a_scrape_with_redis_away_leaves_the_verify_runs_out(redis_server: RedisInfo) -> None:
    import redis

    unreachable = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=1)
    store = StateStore(unreachable, "away")
    metrics = TailerMetrics(TailerStats(), lambda: None, VerifyCollector(store))
    families = scrape(metrics)
    assert "dblog_verify_keys" not in families
    assert "dblog_tailer_windows_opened" in families
