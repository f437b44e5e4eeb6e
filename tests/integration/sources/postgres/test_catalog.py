"""The catalog questions the PostgreSQL log path asks, on a real server: a column added in a
transaction the log delivered before the server shows it to other sessions is asked for again
until it shows (the default and NOT NULL it was added with), and a column gone for good is
described after a bounded wait (`VISIBLE_WAIT_S`)."""

from __future__ import annotations

import time
import uuid

import psycopg
import pytest

from airflow_provider_dblog.devservices.postgres import PostgresInfo
from airflow_provider_dblog.sources.postgres.catalog import describe_relation

pytestmark = pytest.mark.integration

INT4 = 23


def test_a_column_not_visible_yet_is_asked_for_until_it_shows(pg15: PostgresInfo) -> None:
    table = f"visible_{uuid.uuid4().hex[:8]}"
    with (
        psycopg.connect(pg15.admin_dsn, autocommit=True) as admin,
        psycopg.connect(pg15.admin_dsn) as altering,
        psycopg.connect(pg15.admin_dsn, autocommit=True) as catalog,
    ):
        admin.execute(f"CREATE TABLE {table} (id int PRIMARY KEY)")
        row = admin.execute("SELECT %s::regclass::oid", (table,)).fetchone()
        assert row is not None
        oid = row[0]
        altering.execute(f"ALTER TABLE {table} ADD COLUMN flag int NOT NULL DEFAULT 7")
        asked: list[float] = []

        def commit_at_second_ask(seconds: float) -> None:
            # The log has delivered the ALTER's commit; the server shows it a moment later.
            asked.append(seconds)
            if len(asked) == 2:
                altering.commit()

        columns = (("id", INT4, -1), ("flag", INT4, -1))
        schema = describe_relation(catalog, oid, columns, sleep=commit_at_second_ask)
        flag = schema.column("flag")
        assert flag is not None and (flag.default, flag.nullable) == ("7", False)
        assert len(asked) == 2, "asked again until the column showed, then no more"

        # A column dropped since (a replay of older log): asked for again, then given up.
        gone = (("id", INT4, -1), ("legacy", INT4, -1))
        waited: list[float] = []

        def sleep(seconds: float) -> None:
            waited.append(seconds)
            time.sleep(seconds)

        legacy = describe_relation(catalog, oid, gone, sleep=sleep).column("legacy")
        assert legacy is not None and (legacy.default, legacy.nullable) == (None, True)
        assert len(waited) > 1
        admin.execute(f"DROP TABLE {table}")
