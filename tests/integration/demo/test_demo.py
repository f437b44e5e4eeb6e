"""`dblog demo`, the README's first command, on small sizes, on PostgreSQL and on MariaDB: it
must end with target == source."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_provider_dblog.cli import main
from airflow_provider_dblog.demo.mariadb import MariaDBDemo
from airflow_provider_dblog.demo.postgres import PostgresDemo
from airflow_provider_dblog.demo.story import DemoBackend, run_demo

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(
    ("backend", "rows", "repair_said"),
    [(PostgresDemo, 600, "corrupted 20 rows"), (MariaDBDemo, 400, "repairing 20 keys")],
    ids=["postgres", "mariadb"],
)
def test_demo_converges_under_writes(
    tmp_path: Path, backend: type[DemoBackend], rows: int, repair_said: str
) -> None:
    """On PostgreSQL the SQL target equals the source; on MariaDB the binlog tailer's NDJSON,
    replayed, does."""
    said: list[str] = []
    summary = run_demo(
        backend,
        tmp_path,
        rows=rows,
        chunk_size=50,
        parallelism=3,
        write_seconds=2.0,
        say=said.append,
    )
    assert summary.equal, summary.differences
    assert summary.writes > 0, "the workload must write while the dump runs"
    # Rows that existed before capture started reach the target only through the dump.
    assert summary.dump_rows >= summary.rows_seeded * 0.9
    assert summary.dump_chunks >= 3 * rows // 50
    assert summary.repaired_keys == 20
    assert any(repair_said in line for line in said)


@pytest.mark.parametrize(
    ("argv", "seeded", "target"),
    [
        (["--rows", "200", "--chunk-size", "40"], "600 rows seeded", "(the SQL target)"),
        (
            ["--source", "mariadb", "--rows", "100", "--replica"],
            "chunks are read from a replica",
            "(the NDJSON replayed)",
        ),
        (
            ["--rows", "200", "--read-only", "--replica"],
            "chunks are read from a replica",
            "(the SQL target)",
        ),
        (
            ["--source", "mariadb", "--rows", "100", "--read-only"],
            "read-only source",
            "(the NDJSON replayed)",
        ),
    ],
    ids=["postgres", "mariadb-replica", "postgres-read-only-replica", "mariadb-read-only"],
)
def test_demo_command_prints_a_verified_summary(
    capsys: pytest.CaptureFixture[str], argv: list[str], seeded: str, target: str
) -> None:
    code = main(["demo", *argv, "--write-seconds", "1"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "target == source" in out and target in out
    assert seeded in out
