"""docker/mariadb/10-dblog-source.sql on a real MariaDB: the `dblog` user it leaves (with what
the image's entrypoint gives it: every right on its own `dblog` database) passes the MySQL
source's set-up and preflight, can dump the demo table, and cannot write it."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import pymysql
import pytest

from airflow_provider_dblog.core.event import TableRef
from airflow_provider_dblog.devservices.mariadb import MariaDBInfo
from airflow_provider_dblog.sources.factory import source_for
from airflow_provider_dblog.sources.mysql.config import MysqlSourceConfig

SQL = Path(__file__).resolve().parents[2] / "docker" / "mariadb" / "10-dblog-source.sql"
PASSWORD_ENV = "DOCKER_MARIADB_TEST_PASSWORD"


def _statements(database: str) -> list[str]:
    """The script's statements, its demo database renamed (the server is shared by the tests)."""
    text = "\n".join(line for line in SQL.read_text().splitlines() if not line.startswith("--"))
    text = re.sub(r"\bshop\b", database, text)
    return [s.strip() for s in text.split(";") if s.strip()]


def test_the_user_it_leaves_is_enough_for_the_source_and_no_more(
    mariadb: MariaDBInfo, monkeypatch: pytest.MonkeyPatch
) -> None:
    database = f"shop_{uuid.uuid4().hex[:8]}"
    with (
        pymysql.connect(**mariadb.admin_connect_kwargs(), autocommit=True) as admin,
        admin.cursor() as cursor,
    ):
        for statement in _statements(database):
            cursor.execute(statement)
    monkeypatch.setenv(PASSWORD_ENV, mariadb.password)
    table = TableRef(database, "accounts")
    config = MysqlSourceConfig(
        name="shop_mysql",
        dsn=f"mysql://{mariadb.user}@{mariadb.host}:{mariadb.port}/{database}",
        password_env=PASSWORD_ENV,
        tables=(table,),
    )
    source = source_for(config)
    source.ensure_setup()
    source.preflight()
    chunks = source.chunk_source()
    try:
        chunks.check_ready()
        assert chunks.max_key(table) == (10000,)
    finally:
        chunks.close()
    with (
        config.connect() as conn,
        conn.cursor() as cursor,
        pytest.raises(pymysql.err.OperationalError, match="DELETE command denied"),
    ):
        cursor.execute(f"DELETE FROM `{database}`.accounts")
