"""The MySQL source's preflight rules on values as MySQL 8 and MariaDB report them (the
integration tests meet them on a real MariaDB; MySQL-only rules are checked here), and where a
read-only source's snapshot lies."""

from __future__ import annotations

import logging

import pytest

from airflow_provider_dblog.sources.base import ReadSnapshot, SourceError
from airflow_provider_dblog.sources.mysql.chunks import snapshot_position
from airflow_provider_dblog.sources.mysql.coordinates import mysql_commit
from airflow_provider_dblog.sources.mysql.setup import (
    check_binlog,
    check_binlog_retained,
    check_grants,
    check_snapshot_positions,
    row_metadata_is_full,
)

MYSQL8 = {
    "version": "8.0.36",
    "log_bin": "ON",
    "binlog_format": "ROW",
    "binlog_row_image": "FULL",
    "binlog_row_metadata": "FULL",
    "binlog_order_commits": "ON",
}


def test_a_mysql_8_source_as_recommended_passes() -> None:
    check_binlog(MYSQL8)
    assert row_metadata_is_full(MYSQL8)
    check_grants("'dblog'@'%'", {"REPLICATION SLAVE", "REPLICATION CLIENT", "SELECT"})


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"log_bin": "OFF"}, "binary log is off"),
        ({"binlog_format": "MIXED"}, "binlog_format is MIXED"),
        ({"binlog_row_image": "MINIMAL"}, "binlog_row_image is MINIMAL"),
        ({"binlog_order_commits": "OFF"}, "binlog_order_commits is OFF"),
    ],
)
def test_each_unusable_binlog_setting_is_named(change: dict[str, str], message: str) -> None:
    with pytest.raises(SourceError, match=message):
        check_binlog({**MYSQL8, **change})


def test_mariadb_has_no_binlog_order_commits_to_check() -> None:
    mariadb = {**MYSQL8, "version": "10.11.19-MariaDB-log"}
    del mariadb["binlog_order_commits"]
    check_binlog(mariadb)


def test_without_full_row_metadata_a_warning_names_the_fallback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING):
        assert not row_metadata_is_full({**MYSQL8, "binlog_row_metadata": "MINIMAL"})
    assert "information_schema" in caplog.text


def test_binlog_monitor_or_super_stands_for_replication_client() -> None:
    check_grants("u", {"REPLICATION SLAVE", "BINLOG MONITOR"})
    check_grants("u", {"REPLICATION SLAVE", "SUPER"})
    with pytest.raises(SourceError, match="GRANT REPLICATION CLIENT ON"):
        check_grants("u", {"REPLICATION SLAVE"})


def test_a_purged_checkpoint_file_is_named_with_the_oldest_kept() -> None:
    check_binlog_retained("binlog.000007", ["binlog.000007", "binlog.000008"])
    with pytest.raises(SourceError, match=r"binlog\.000003 .*oldest kept: binlog\.000007"):
        check_binlog_retained("binlog.000003", ["binlog.000008", "binlog.000007"])


def test_a_read_only_source_needs_mariadb() -> None:
    check_snapshot_positions({"version": "10.11.6-MariaDB-0+deb12u1"})
    with pytest.raises(SourceError, match=r"read_only needs MariaDB.*binlog_snapshot_position"):
        check_snapshot_positions(MYSQL8)


def test_the_snapshot_position_bounds_the_commits_the_read_saw() -> None:
    """A snapshot at offset 1000 of binlog 3 saw the transactions whose first event starts
    below 1000; hw, one below, is what an idle reader's `Idle` reaches (the end less one)."""
    found = snapshot_position(
        {"binlog_snapshot_file": "mariadb-bin.000003", "binlog_snapshot_position": "1000"}
    )
    assert found == ReadSnapshot(mysql_commit(3, 999), exact=True)
    assert snapshot_position({}) is None  # MySQL: no such status
