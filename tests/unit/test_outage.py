"""An outage is two lines in the log, however many retries it takes: a WARNING naming the cause
when it starts, an INFO saying how long it lasted when it ends; the retries between are DEBUG.
Checked on `Outage` itself and on a dump's chunk that waits for its source, on a fake clock."""

from __future__ import annotations

import logging

import pytest

from airflow_provider_dblog.dump.retry import ChunkRetries, Patience
from airflow_provider_dblog.dump.runner import retry_chunk
from airflow_provider_dblog.outage import Outage
from airflow_provider_dblog.sources.base import SourceUnavailable
from airflow_provider_dblog.state import StateStoreUnavailable
from tests.unit.dump.test_retry import DONE, Clock, failed_window, scripted

pytestmark = pytest.mark.unit
LOGGER = "airflow_provider_dblog"


def lines(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    return [(r.levelname, r.getMessage()) for r in caplog.records]


def test_an_outage_of_many_retries_is_one_warning_and_one_line_when_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    clock = Clock()
    outage = Outage(logging.getLogger(f"{LOGGER}.test"), clock)
    outage.back()  # nothing was away: nothing to say
    for n in range(5):
        outage.away("source", SourceUnavailable(f"refused {n}"))
        clock.sleep(2)
    outage.back()
    outage.back()
    assert lines(caplog) == [
        ("WARNING", "source unavailable (refused 0); retrying until it is back"),
        *[("DEBUG", f"source still unavailable (refused {n})") for n in range(1, 5)],
        ("INFO", "source back after 10 s"),
    ]


def test_a_chunk_waiting_through_an_outage_logs_it_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Thirty failed tries of a chunk (over two minutes of backoff) are one warning naming the
    chunk and the cause, and one line once the source answers; a second spell, after a window
    that reached the servers, is a second pair."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    clock = Clock()
    restart = [SourceUnavailable("terminating connection due to administrator command")] * 30
    redis = [StateStoreUnavailable("redis at x:1 cannot be reached")] * 3
    retried: list[str] = []
    outcome = retry_chunk(
        scripted(clock, *restart, failed_window(), *redis),
        ChunkRetries(5, Patience(300, clock, label="chunk 3 of public.t")),
        "chunk 3 of public.t",
        on_retry=retried.append,
        on_pause=retried.append,
        ending=lambda: False,
        sleep=clock.sleep,
    )
    assert outcome == DONE and len(retried) == 34
    outage_lines = [line for line in lines(caplog) if "retried" not in line[1]]
    assert outage_lines == [
        (
            "WARNING",
            "chunk 3 of public.t: source unavailable (terminating connection due to "
            "administrator command); retrying until it is back",
        ),
        ("INFO", "chunk 3 of public.t: source back after 163 s"),
        (
            "WARNING",
            "chunk 3 of public.t: state store unavailable (redis at x:1 cannot be reached); "
            "retrying until it is back",
        ),
        ("INFO", "chunk 3 of public.t: state store back after 5 s"),
    ]
