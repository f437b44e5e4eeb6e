"""docker/setup_demo_source.py on a real PostgreSQL: the least-privilege `dblog` role it leaves
(docs/operations.md) is enough for the tailer to set itself up and pass its preflight, and the
script can run again on a set-up database without changing anything."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from airflow_provider_dblog.demo.postgres import TABLES
from airflow_provider_dblog.devservices.postgres import PostgresInfo
from airflow_provider_dblog.sources.factory import source_for
from airflow_provider_dblog.sources.postgres.config import PostgresSourceConfig

SCRIPT = Path(__file__).resolve().parents[2] / "docker" / "setup_demo_source.py"
PASSWORD_ENV = "DOCKER_SETUP_TEST_PASSWORD"


@pytest.fixture
def database(pg15: PostgresInfo) -> Iterator[str]:
    name = f"shop_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg15.admin_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    yield name
    with psycopg.connect(pg15.admin_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


def _run_setup(pg15: PostgresInfo, database: str) -> str:
    env = {
        **os.environ,
        "PGHOST": str(pg15.socket_dir),
        "PGPORT": str(pg15.port),
        "PGUSER": "postgres",
        "PGDATABASE": database,
        "DBLOG_SOURCE_PASSWORD": pg15.password,
        "DBLOG_DEMO_ROWS": "20",
    }
    done = subprocess.run(
        [sys.executable, str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert pg15.password not in done.stdout + done.stderr
    return done.stdout


def test_the_role_it_leaves_is_enough_for_the_tailer_and_no_more(
    pg15: PostgresInfo, database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert "seeding 60 rows" in _run_setup(pg15, database)
    assert "seeding" not in _run_setup(pg15, database)  # the second run changes nothing
    monkeypatch.setenv(PASSWORD_ENV, pg15.password)
    slot = f"docker_{uuid.uuid4().hex[:8]}"
    config = PostgresSourceConfig(
        name="shop",
        dsn=f"host={pg15.host} port={pg15.port} dbname={database} user={pg15.user}",
        password_env=PASSWORD_ENV,
        tables=TABLES,
        slot=slot,
    )
    source = source_for(config)
    try:
        source.ensure_setup()  # watermark table, publication membership, slot: as `dblog`
        source.preflight()
        chunks = source.chunk_source()
        try:
            chunks.check_ready()
            assert [chunks.max_key(t) is not None for t in TABLES] == [True, True, True]
        finally:
            chunks.close()
        with config.connect() as conn:
            owns, superuser = conn.execute(
                "SELECT pubowner::regrole::text = current_user, rolsuper FROM pg_publication, "
                "pg_roles WHERE pubname = 'dblog' AND rolname = current_user"
            ).fetchone() or (None, None)
            assert (owns, superuser) == (True, False)
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute("DELETE FROM public.accounts")
    finally:
        with psycopg.connect(pg15.admin_dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
