"""The triggers' pure parts: what they serialize builds them again (the triggerer rebuilds
them from the database), and what counts as a healthy tailer."""

from __future__ import annotations

import importlib
import json

import pytest

from airflow_provider_dblog.core.event import JsonValue
from airflow_provider_dblog.state import TailerHealth
from airflow_provider_dblog.triggers.dblog import (
    DBLogDumpTrigger,
    DBLogTailerHealthTrigger,
    health_ok,
)
from airflow_provider_dblog.triggers.outcome import TailerHealthy


def test_triggers_serialize_to_what_builds_them_again() -> None:
    for trigger in (
        DBLogDumpTrigger("c", "d-1", poll_interval=0.5, driver_timeout_s=9, cancel_on_kill=True),
        DBLogTailerHealthTrigger("c", max_lag_ms=5, poll_interval=2),
    ):
        classpath, kwargs = trigger.serialize()
        module, _, name = classpath.rpartition(".")
        again = getattr(importlib.import_module(module), name)(**kwargs)
        assert again.serialize() == (classpath, kwargs)
        json.dumps(kwargs)  # stored in the database as JSON


@pytest.mark.parametrize(
    ("metrics", "healthy"),
    [
        (None, False),  # no heartbeat
        ({}, False),
        ({"lag_ms": 101}, False),
        ({"lag_ms": "5"}, False),
        ({"lag_ms": 100}, True),
        ({"lag_ms": 0}, True),
    ],
)
def test_a_tailer_is_healthy_when_it_beats_with_a_lag_within_the_limit(
    metrics: dict[str, JsonValue] | None, healthy: bool
) -> None:
    health = None if metrics is None else TailerHealth("t", at_ms=1, age_ms=0, metrics=metrics)
    assert health_ok(health, max_lag_ms=100) is healthy


def test_the_health_payload_survives_the_trip_through_airflows_database() -> None:
    health = TailerHealth("tailer-1", at_ms=1_700_000_000_000, age_ms=12, metrics={"lag_ms": 5})
    stored = json.loads(json.dumps(TailerHealthy(health).to_event()))
    assert stored == {
        "healthy": True,
        "health": {
            "owner": "tailer-1",
            "at_ms": 1_700_000_000_000,
            "age_ms": 12,
            "metrics": {"lag_ms": 5},
        },
    }
    assert TailerHealthy.from_event(stored).health == health
