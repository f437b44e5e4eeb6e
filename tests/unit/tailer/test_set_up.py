"""A tailer sets its source up before it leads: a server that is away then (still starting, or
restarting) is waited for with the sessions' backoff and logged once, a source that refuses
its setup ends it at once, and a stop ends the wait."""

from __future__ import annotations

import logging
import threading
from typing import cast

import pytest

from airflow_provider_dblog.outputs import Output
from airflow_provider_dblog.sources.base import Source, SourceError, SourceUnavailable
from airflow_provider_dblog.state import StateStore
from airflow_provider_dblog.tailer import Tailer, TailerSettings

pytestmark = pytest.mark.unit


class Failing:
    """A source whose setup raises `failures` in turn, then succeeds."""

    def __init__(self, *failures: Exception) -> None:
        self.failures = list(failures)
        self.tries = 0

    def ensure_setup(self) -> None:
        self.tries += 1
        if self.failures:
            raise self.failures.pop(0)


class Waits(threading.Event):
    """A stop that is never set; its waits return at once and are kept, or set it after
    `stop_after` of them."""

    def __init__(self, stop_after: int | None = None) -> None:
        super().__init__()
        self.waits: list[float] = []
        self.stop_after = stop_after

    def wait(self, timeout: float | None = None) -> bool:
        assert timeout is not None
        self.waits.append(timeout)
        return len(self.waits) == self.stop_after


def tailer(source: Failing) -> Tailer:
    def no_output() -> Output:
        raise AssertionError("set_up opens no output")

    return Tailer(
        cast(Source, source),
        cast(StateStore, None),
        no_output,
        owner="t",
        settings=TailerSettings(reconnect_max_s=4),
    )


def test_a_source_away_at_start_is_waited_for_with_backoff_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="airflow_provider_dblog.tailer")
    source = Failing(*[SourceUnavailable(f"connection refused {n}") for n in range(6)])
    stop = Waits()
    assert tailer(source).set_up(stop)
    assert source.tries == 7
    assert stop.waits == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    levels = [(r.levelname, r.getMessage()) for r in caplog.records if r.levelname != "DEBUG"]
    assert levels[0] == (
        "WARNING",
        "source unavailable (connection refused 0); retrying until it is back",
    )
    assert levels[1][0] == "INFO" and levels[1][1].startswith("source back after ")
    assert len(levels) == 2


def test_a_source_that_refuses_its_setup_ends_the_tailer_at_once() -> None:
    source = Failing(SourceUnavailable("refused"), SourceError("wal_level is replica"))
    stop = Waits()
    with pytest.raises(SourceError, match="wal_level is replica"):
        tailer(source).set_up(stop)
    assert source.tries == 2


def test_a_stop_ends_the_wait() -> None:
    source = Failing(*[SourceUnavailable("refused")] * 100)
    assert not tailer(source).set_up(Waits(stop_after=3))
    assert source.tries == 3
