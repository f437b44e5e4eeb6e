"""`dblog lake compact` without a server: the one-shot run folds what the tailer wrote since the
last one and prints its report, the TOML's paths and the options are refused by name when
wrong, and the follower counts a run's freshness from its events' commit times. The follower
on Redis, as processes: tests/integration/compaction/test_follow.py."""

from __future__ import annotations

import json
import time
from pathlib import Path

import duckdb
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from airflow_provider_dblog.cli import lake as lake_cli
from airflow_provider_dblog.cli import main
from airflow_provider_dblog.compaction import run
from airflow_provider_dblog.compaction.follow import FollowSettings
from airflow_provider_dblog.compaction.follow_metrics import FollowMetrics, FollowStats
from airflow_provider_dblog.compaction.run import CompactReport, compact
from airflow_provider_dblog.compaction.segments import CompactState
from airflow_provider_dblog.core.event import Event, Op, Origin, PlainEvent, SourceInfo, table_event
from airflow_provider_dblog.core.position import Position
from airflow_provider_dblog.core.schema import Column, TableSchema
from airflow_provider_dblog.lake.table import LakeTable
from airflow_provider_dblog.outputs.ndjson import NdjsonOutput
from tests.unit.compaction.test_maintenance import TABLE, write_config

pytestmark = pytest.mark.unit

SCHEMA = TableSchema(
    (Column("id", "integer", False, None), Column("n", "text", True, None)), ("id",)
)


def events(first: int, count: int, ts_ms: int | None = None) -> list[Event]:
    """Inserts of ids `first`.. at commits `first`.., the table's schema event first."""

    def source(commit: int) -> SourceInfo:
        position = Position(commit, 0)
        return SourceInfo("shop", "db", TABLE.schema, TABLE.name, position, Origin.LOG, ts_ms=ts_ms)

    made: list[Event] = [table_event(Op.SCHEMA, source(first), 1, SCHEMA)]
    for i in range(first, first + count):
        row = {"id": i, "n": f"v{i}"}
        made.append(PlainEvent(Op.CREATE, {"id": i}, None, row, source(i + 1), 1))
    return made


def lake_ids(lake: Path) -> list[int]:
    files = LakeTable.open(lake, TABLE).delta.file_uris()
    query = "SELECT id FROM read_parquet($files) WHERE NOT _dblog_deleted ORDER BY id"
    return [r[0] for r in duckdb.execute(query, {"files": files}).fetchall()]


def test_one_run_folds_the_new_events_and_prints_its_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(tmp_path)
    with NdjsonOutput(tmp_path / "events") as out:
        out.write(events(1, 3), 1)
    compact(None, tmp_path / "events", tmp_path / "lake")  # the table, from its schema event
    now_ms = int(time.time() * 1000)
    with NdjsonOutput(tmp_path / "events") as out:
        out.write(events(10, 5, ts_ms=now_ms), 1)
    assert main(["lake", "compact", "-c", str(config)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["events"] == 6 and report["committed_ms"] == [now_ms, now_ms]
    assert report["tables"][str(TABLE)]["rows"] == 5
    assert lake_ids(tmp_path / "lake") == [1, 2, 3, 10, 11, 12, 13, 14]
    assert CompactState.load(tmp_path / "lake").position == [15, 0]


def test_a_toml_without_ndjson_output_or_lake_is_refused_by_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(tmp_path, lake=False)
    assert main(["lake", "compact", "-c", str(config)]) == 2
    assert "has no [lake] root: no lake to fold into" in capsys.readouterr().err
    config.write_text(config.read_text().replace('type = "ndjson"', 'type = "redis_stream"'))
    assert main(["lake", "compact", "-c", str(config), "--follow"]) == 2
    said = capsys.readouterr().err
    assert "reads the tailer's NDJSON files, but [output] is type 'redis_stream'" in said


@pytest.mark.parametrize(
    ("flag", "value", "said"),
    [
        ("--interval", "0", "argument --interval: 0 must be above 0"),
        ("--interval", "soon", "argument --interval:"),
        ("--lease-ttl-ms", "50", "argument --lease-ttl-ms: must be at least 100, got 50"),
        ("--metrics-port", "70000", "argument --metrics-port: a TCP port is 1-65535, got 70000"),
        ("--local-below", "-1", "argument --local-below: must be at least 0, got -1"),
    ],
)
def test_bad_options_are_refused_naming_the_flag(
    flag: str, value: str, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as refused:
        main(["lake", "compact", "--follow", flag, value])
    assert refused.value.code == 2
    assert said in capsys.readouterr().err


def test_the_command_s_defaults_are_the_library_s() -> None:
    settings = FollowSettings()
    assert settings.interval_s == lake_cli.DEFAULT_INTERVAL_S
    assert settings.lease_ttl_ms == lake_cli.DEFAULT_LEASE_TTL_MS
    assert lake_cli.DEFAULT_LOCAL_BELOW == run.DEFAULT_LOCAL_BELOW
    with pytest.raises(ValueError, match="interval must be above 0 seconds"):
        FollowSettings(interval_s=0)
    with pytest.raises(ValueError, match="lease TTL must be 100 ms or more"):
        FollowSettings(lease_ttl_ms=10)


def test_freshness_is_the_oldest_folded_event_s_wait_and_a_run_without_one_keeps_it() -> None:
    stats = FollowStats()
    now_ms = int(time.time() * 1000)
    folded = CompactReport(CompactState([5, 0]), events=3, committed=(now_ms - 90_000, now_ms))
    stats.folded(folded)
    assert stats.freshness_s is not None and 90 <= stats.freshness_s < 120
    assert stats.last_fold_ms >= now_ms and stats.events == 3 and stats.runs == 1
    stats.folded(CompactReport(CompactState([6, 0]), events=2))  # dump rows: no commit time
    assert stats.freshness_s is not None and 90 <= stats.freshness_s < 120
    assert stats.metrics()["events"] == 5 and stats.metrics()["position"] == [6, 0]


def test_each_run_s_freshness_lands_in_its_histogram_bucket() -> None:
    """Runs 0.5 s, 20 s and an hour behind: the served histogram counts them cumulatively by
    bound (1 s, 30 s, +Inf), their sum is theirs, a run of dump rows adds nothing."""
    stats = FollowStats()
    now_ms = int(time.time() * 1000)
    for age_ms in (500, 20_000, 3_600_000):
        committed = (now_ms - age_ms, now_ms)
        stats.folded(CompactReport(CompactState([1, 0]), events=1, committed=committed))
    stats.folded(CompactReport(CompactState([2, 0]), events=4))
    text = generate_latest(FollowMetrics(stats).registry).decode()
    samples = {
        (sample.name, sample.labels.get("le")): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name.startswith("dblog_compact_run_freshness_seconds")
    }
    bucket = "dblog_compact_run_freshness_seconds_bucket"
    assert samples[(bucket, "1.0")] == 1
    assert samples[(bucket, "15.0")] == 1
    assert samples[(bucket, "30.0")] == 2
    assert samples[(bucket, "1800.0")] == 2
    assert samples[(bucket, "+Inf")] == 3
    assert samples[("dblog_compact_run_freshness_seconds_count", None)] == 3
    assert 3620 <= samples[("dblog_compact_run_freshness_seconds_sum", None)] < 3700
