"""`dblog demo`, the README's first command, on small sizes, on PostgreSQL and on MariaDB: it
must end with target == source."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_provider_dblog.cli import main
from airflow_provider_dblog.demo.mariadb import MariaDBDemo
from airflow_provider_dblog.demo.postgres import PostgresDemo
from airflow_provider_dblog.demo.story import run_demo

pytestmark = pytest.mark.integration


def test_demo_converges_under_writes(tmp_path: Path) -> None:
    said: list[str] = []
    summary = run_demo(
        PostgresDemo,
        tmp_path,
        rows=600,
        chunk_size=50,
        parallelism=3,
        write_seconds=2.0,
        say=said.append,
    )
    assert summary.equal, summary.differences
    assert summary.writes > 0, "the workload must write while the dump runs"
    # Rows that existed before capture started reach the target only through the dump.
    assert summary.dump_rows >= summary.rows_seeded * 0.9
    assert summary.dump_chunks >= 3 * 600 // 50
    assert summary.repaired_keys == 20
    assert any("corrupted 20 rows" in line for line in said)


def test_demo_command_prints_a_verified_summary(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["demo", "--rows", "200", "--chunk-size", "40", "--write-seconds", "1"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "target == source" in out
    assert "600 rows seeded" in out


def test_mariadb_demo_converges_under_writes(tmp_path: Path) -> None:
    """`dblog demo --source mariadb`: the binlog tailer's NDJSON, replayed, equals the source."""
    said: list[str] = []
    summary = run_demo(
        MariaDBDemo,
        tmp_path,
        rows=400,
        chunk_size=50,
        parallelism=3,
        write_seconds=2.0,
        say=said.append,
    )
    assert summary.equal, summary.differences
    assert summary.writes > 0, "the workload must write while the dump runs"
    assert summary.dump_rows >= summary.rows_seeded * 0.9
    assert summary.dump_chunks >= 3 * 400 // 50
    assert summary.repaired_keys == 20
    assert any("repairing 20 keys" in line for line in said)


def test_mariadb_demo_command_prints_a_verified_summary(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(["demo", "--source", "mariadb", "--rows", "100", "--write-seconds", "1"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "target == source" in out and "NDJSON" in out
    assert "300 rows seeded" in out
