"""Makes the compose stack's PostgreSQL a DBLog source with the demo's seeded tables, as its
administrator, once (run again, it changes nothing).

It creates the `dblog` role with only what the tailer and the dumps need (docs/operations.md,
"Least-privilege roles"): LOGIN REPLICATION, SELECT on the captured tables, its own `dblog`
schema for the watermark table, and the publication, owned by `dblog` so that `dblog tail` can
add its watermark table to it. The tables and their rows are the demo's own (`demo.seed`).

The administrator logs in through libpq's PG* environment variables (PGHOST, PGUSER,
PGPASSWORD, PGDATABASE); the role's password comes from $DBLOG_SOURCE_PASSWORD. Neither is
ever on a command line or in a log line.
"""

from __future__ import annotations

import os
import random

import psycopg
from psycopg import sql

from airflow_provider_dblog.demo.postgres import TABLES, seed
from airflow_provider_dblog.sources.postgres.setup import PUBLISH

ROLE = "dblog"
PUBLICATION = "dblog"
WATERMARK_SCHEMA = "dblog"
ROWS = int(os.environ.get("DBLOG_DEMO_ROWS", "10000"))


def main() -> None:
    with psycopg.connect(autocommit=True) as conn:
        conn.execute("SET log_statement = 'none'")
        if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (ROLE,)).fetchone() is None:
            conn.execute(
                sql.SQL("CREATE ROLE {} LOGIN REPLICATION PASSWORD {}").format(
                    sql.Identifier(ROLE), sql.Literal(os.environ["DBLOG_SOURCE_PASSWORD"])
                )
            )
        seeded = conn.execute("SELECT to_regclass('public.accounts')").fetchone()
        if seeded is None or seeded[0] is None:
            with conn.transaction():
                print(f"seeding {seed(conn, ROWS, random.Random(7))} rows")
        tables = sql.SQL(", ").join(sql.Identifier(t.schema, t.name) for t in TABLES)
        role = sql.Identifier(ROLE)
        conn.execute(sql.SQL("GRANT SELECT ON {} TO {}").format(tables, role))
        conn.execute(
            sql.SQL("CREATE SCHEMA IF NOT EXISTS {} AUTHORIZATION {}").format(
                sql.Identifier(WATERMARK_SCHEMA), role
            )
        )
        database = conn.info.dbname
        conn.execute(
            sql.SQL("GRANT CREATE ON DATABASE {} TO {}").format(sql.Identifier(database), role)
        )
        published = conn.execute(
            "SELECT 1 FROM pg_publication WHERE pubname = %s", (PUBLICATION,)
        ).fetchone()
        if published is None:
            conn.execute(
                sql.SQL("CREATE PUBLICATION {} FOR TABLE {} WITH (publish = {})").format(
                    sql.Identifier(PUBLICATION), tables, sql.Literal(PUBLISH)
                )
            )
            conn.execute(
                sql.SQL("ALTER PUBLICATION {} OWNER TO {}").format(
                    sql.Identifier(PUBLICATION), role
                )
            )
    print("source ready: role dblog, tables", ", ".join(str(t) for t in TABLES))


if __name__ == "__main__":
    main()
