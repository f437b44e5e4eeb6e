"""The PostgreSQL `Source`: what the factory hands out for `[source] type = "postgres"`."""

from __future__ import annotations

from contextlib import closing

from psycopg.conninfo import conninfo_to_dict

from airflow_provider_dblog.core.event import TableRef
from airflow_provider_dblog.core.schema import TableSchema
from airflow_provider_dblog.sources.postgres import setup
from airflow_provider_dblog.sources.postgres.catalog import describe_table
from airflow_provider_dblog.sources.postgres.chunks import PostgresChunkSource
from airflow_provider_dblog.sources.postgres.config import PostgresSourceConfig
from airflow_provider_dblog.sources.postgres.errors import source_errors
from airflow_provider_dblog.sources.postgres.replication import PostgresLogReader


class PostgresSource:
    """pgoutput over logical replication for the log, keyset reads for chunks."""

    def __init__(self, config: PostgresSourceConfig) -> None:
        self.config = config

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def tables(self) -> tuple[TableRef, ...]:
        return self.config.tables

    def chunk_source(self, *, read_only: bool = False) -> PostgresChunkSource:
        return PostgresChunkSource(self.config, read_only=read_only)

    def log_reader(self, resume: str | None = None) -> PostgresLogReader:
        """The slot is the resume point, so `resume` (always None from this reader) is unused."""
        return PostgresLogReader(self.config)

    def ensure_setup(self) -> None:
        setup.ensure_setup(self.config)

    def preflight(self) -> None:
        setup.preflight(self.config)

    def database(self) -> str:
        with source_errors(f"cannot name the database of {self.name}"), self.config.connect() as c:
            row = c.execute("SELECT current_database()").fetchone()
        assert row is not None
        return str(row[0])

    def describe(self, table: TableRef) -> TableSchema:
        with (
            source_errors(f"cannot describe {table} of {self.name}"),
            closing(self.config.connect()) as conn,
        ):
            return describe_table(conn, table)

    def lineage_name(self, table: TableRef) -> tuple[str, str]:
        """`postgres://host:port` and `database.schema.table`; the database is libpq's default
        (the user name) when the DSN names none."""
        dsn = conninfo_to_dict(self.config.dsn)
        namespace = f"postgres://{dsn.get('host', 'localhost')}:{dsn.get('port', 5432)}"
        database = dsn.get("dbname", dsn.get("user", "postgres"))
        return namespace, f"{database}.{table.schema}.{table.name}"
