"""The tailer's Prometheus metrics: their names, types and labels as scraped, read from what
the tailer counts; a registry per tailer; the backlog left out when the source cannot say."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from airflow_provider_dblog.core.event import Op
from airflow_provider_dblog.core.log import TransactionEnd
from airflow_provider_dblog.core.reconciler import FailureReason
from airflow_provider_dblog.outputs.base import OutputError, OutputFenced, OutputUnavailable
from airflow_provider_dblog.sources.base import LogBacklog, SourceUnavailable
from airflow_provider_dblog.tailer import TailerSettings
from airflow_provider_dblog.tailer.metrics import (
    OUTPUT_FAILURES,
    STATES,
    TailerMetrics,
    TailerStats,
)
from airflow_provider_dblog.tailer.writer import STOP, Writer
from tests.unit.tailer.test_writer import Failing, Journal, event

pytestmark = pytest.mark.unit
REPO = Path(__file__).resolve().parents[3]

EXPECTED = {
    # name (as the text format spells a family), type, labels of its samples
    "dblog_tailer_events": ("counter", {"schema", "table", "op"}),
    "dblog_tailer_chunk_rows_emitted": ("counter", {"schema", "table"}),
    "dblog_tailer_chunk_rows_dropped": ("counter", {"schema", "table"}),
    "dblog_tailer_windows_opened": ("counter", set()),
    "dblog_tailer_windows_closed": ("counter", set()),
    "dblog_tailer_windows_failed": ("counter", {"reason"}),
    "dblog_tailer_windows_replayed": ("counter", set()),
    "dblog_tailer_windows_open": ("gauge", set()),
    "dblog_tailer_output_batch_seconds": ("histogram", set()),
    "dblog_tailer_output_batch_seconds_created": ("gauge", set()),  # the client's own
    "dblog_tailer_output_batches_failed": ("counter", {"reason"}),
    "dblog_tailer_lag_seconds": ("gauge", set()),
    "dblog_tailer_log_behind_bytes": ("gauge", set()),
    "dblog_tailer_log_retained_bytes": ("gauge", set()),
    "dblog_tailer_state": ("gauge", {"state"}),
    "dblog_tailer_lease_token": ("gauge", set()),
}


def scrape(
    metrics: TailerMetrics,
) -> dict[str, tuple[str, dict[tuple[tuple[str, str], ...], float]]]:
    """{family: (type, {sorted sample labels + sample name: value})} as Prometheus reads it."""
    text = generate_latest(metrics.registry).decode()
    families = {}
    for family in text_string_to_metric_families(text):
        samples = {
            (("__name__", s.name), *sorted(s.labels.items())): s.value for s in family.samples
        }
        families[family.name] = (family.type, samples)
    return families


def counted_stats() -> TailerStats:
    stats = TailerStats(state="leading", lease_token=7, open_windows=2, windows_opened=5)
    stats.windows_closed = 3
    stats.windows_replayed = 6
    stats.events_by_table[("public", "orders", Op.UPDATE)] = 4
    stats.events_by_table[("public", "orders", Op.READ)] = 90
    stats.chunk_rows_emitted[("public", "orders")] = 90
    stats.chunk_rows_dropped[("public", "orders")] = 10
    stats.windows_failed_by_reason[FailureReason.EXPIRED] = 1
    stats.output_batch_seconds.observe(0.02)
    return stats


def test_names_types_and_labels_as_scraped() -> None:
    families = scrape(TailerMetrics(counted_stats(), lambda: LogBacklog(0, 4096)))
    assert {n: (t, _labels(s)) for n, (t, s) in families.items()} == EXPECTED

    def value(name: str, sample: str | None = None, **labels: str) -> float:
        key = (("__name__", sample or f"{name}_total"), *sorted(labels.items()))
        return families[name][1][key]

    assert value("dblog_tailer_events", schema="public", table="orders", op="u") == 4
    assert value("dblog_tailer_events", schema="public", table="orders", op="r") == 90
    assert value("dblog_tailer_chunk_rows_dropped", schema="public", table="orders") == 10
    assert value("dblog_tailer_windows_opened") == 5
    assert value("dblog_tailer_windows_closed") == 3
    assert value("dblog_tailer_windows_replayed") == 6
    reasons = {
        dict(k[1:])["reason"]: v
        for k, v in families["dblog_tailer_windows_failed"][1].items()
        if k[0][1].endswith("_total")
    }
    assert reasons == {r.value: (1 if r is FailureReason.EXPIRED else 0) for r in FailureReason}
    assert value("dblog_tailer_windows_open", "dblog_tailer_windows_open") == 2
    assert (
        value("dblog_tailer_output_batch_seconds", "dblog_tailer_output_batch_seconds_count") == 1
    )
    assert value("dblog_tailer_log_behind_bytes", "dblog_tailer_log_behind_bytes") == 0
    assert value("dblog_tailer_log_retained_bytes", "dblog_tailer_log_retained_bytes") == 4096
    assert value("dblog_tailer_lease_token", "dblog_tailer_lease_token") == 7
    states = {s: value("dblog_tailer_state", "dblog_tailer_state", state=s) for s in STATES}
    assert states == {s: (1 if s == "leading" else 0) for s in STATES}
    failed = {r: value("dblog_tailer_output_batches_failed", reason=r) for r in OUTPUT_FAILURES}
    assert failed == dict.fromkeys(OUTPUT_FAILURES, 0), "each reason is there before a failure"


def _labels(samples: dict[tuple[tuple[str, str], ...], float]) -> set[str]:
    names = {label for key in samples for label, _ in key[1:]}
    return names - {"le"}  # the histogram's bucket bound


def test_an_unavailable_state_is_named_without_its_detail() -> None:
    stats = TailerStats(state="source unavailable: connection refused\nLINE 1: ...")
    families = scrape(TailerMetrics(stats, lambda: None))
    states = {dict(k[1:])["state"]: v for k, v in families["dblog_tailer_state"][1].items()}
    assert states == {s: (1 if s == "source_unavailable" else 0) for s in STATES}


def test_the_backlog_is_left_out_when_the_source_cannot_say() -> None:
    def away() -> LogBacklog:
        raise SourceUnavailable("connection refused")

    for backlog in (away, lambda: None):
        families = scrape(TailerMetrics(TailerStats(), backlog))
        assert "dblog_tailer_log_behind_bytes" not in families
        assert "dblog_tailer_log_retained_bytes" not in families
        assert "dblog_tailer_events" in families, "the rest is scraped as usual"


def test_two_tailers_in_one_process_have_registries_of_their_own() -> None:
    first, second = TailerStats(lease_token=1), TailerStats(lease_token=2)
    tokens = [
        scrape(TailerMetrics(s, lambda: None))["dblog_tailer_lease_token"][1]
        for s in (first, second)
    ]
    assert [list(t.values()) for t in tokens] == [[1], [2]]


def test_the_writer_times_each_output_write_once() -> None:
    stats = TailerStats()
    journal = Journal()
    writer = Writer(
        journal,
        journal.windows,
        1,
        TailerSettings(batch_events=2, buffer_items=100),
        schemas=journal.windows,
        directs=journal.windows,
        batch_seconds=stats.output_batch_seconds,
    )
    for item in [event(1, 0), event(1, 1), event(1, 2), TransactionEnd(1), STOP]:
        writer.put(item)
    writer.run()
    assert writer.failure is None
    assert len(journal.entries) == 2
    families = scrape(TailerMetrics(stats, lambda: None))
    count = (("__name__", "dblog_tailer_output_batch_seconds_count"),)
    assert families["dblog_tailer_output_batch_seconds"][1][count] == 2


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (OutputUnavailable("connection refused"), "unavailable"),
        (OutputFenced("the stream", 1, 2), "fenced"),
        (OutputError("column missing"), "error"),
        (OSError("disk full"), "error"),
    ],
)
def test_the_writer_counts_a_batch_whose_write_raised_by_reason(
    error: BaseException, reason: str
) -> None:
    """One failed write, one count under its reason; the writer still fails with the error
    (the session handles it as before) and times no write that did not finish."""
    stats = TailerStats()
    output = Failing(error)
    writer = Writer(
        output,
        output.windows,
        1,
        TailerSettings(batch_events=2, buffer_items=100),
        schemas=output.windows,
        directs=output.windows,
        batch_seconds=stats.output_batch_seconds,
        batches_failed=stats.output_batches_failed,
    )
    for item in [event(1, 0), event(1, 1), event(1, 2), STOP]:
        writer.put(item)
    writer.run()
    assert writer.failure is error
    families = scrape(TailerMetrics(stats, lambda: None))
    counts = {
        dict(k[1:])["reason"]: v
        for k, v in families["dblog_tailer_output_batches_failed"][1].items()
    }
    assert counts == {r: (1 if r == reason else 0) for r in OUTPUT_FAILURES}
    count = (("__name__", "dblog_tailer_output_batch_seconds_count"),)
    assert families["dblog_tailer_output_batch_seconds"][1][count] == 0


def test_every_metric_is_documented_and_every_documented_one_exists() -> None:
    scraped = {
        f"{name}_total" if kind == "counter" else name
        for name, (kind, _) in EXPECTED.items()
        if not name.endswith("_created")
    }
    for doc in (REPO / "docs" / "operations.md", REPO / "docs" / "architecture.md"):
        named = set(re.findall(r"`(dblog_tailer_\w+)`", doc.read_text()))
        assert named == scraped, doc.name
