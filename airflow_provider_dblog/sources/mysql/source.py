"""The MySQL/MariaDB `Source`: what the factory hands out for `[source] type = "mysql"`."""

from __future__ import annotations

from contextlib import closing

from airflow_provider_dblog.core.event import TableRef
from airflow_provider_dblog.core.schema import TableSchema
from airflow_provider_dblog.sources.mysql import setup
from airflow_provider_dblog.sources.mysql.binlog import MysqlLogReader
from airflow_provider_dblog.sources.mysql.catalog import table_schema, table_shape
from airflow_provider_dblog.sources.mysql.chunks import MysqlChunkSource
from airflow_provider_dblog.sources.mysql.config import MysqlSourceConfig
from airflow_provider_dblog.sources.mysql.errors import source_errors


class MysqlSource:
    """The binlog (read and decoded by `binlog.MysqlLogReader`) for the log, keyset reads with
    PyMySQL for chunks."""

    def __init__(self, config: MysqlSourceConfig) -> None:
        self.config = config

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def tables(self) -> tuple[TableRef, ...]:
        return self.config.tables

    def chunk_source(self, *, read_only: bool = False) -> MysqlChunkSource:
        return MysqlChunkSource(self.config, read_only=read_only)

    def log_reader(self, resume: str | None = None) -> MysqlLogReader:
        """The binlog reader from `resume`, what its last saved checkpoint's `acknowledge`
        returned (None: from where the source's setup says to start)."""
        return MysqlLogReader(self.config, resume)

    def ensure_setup(self) -> None:
        setup.ensure_setup(self.config)

    def preflight(self) -> None:
        setup.preflight(self.config)

    def database(self) -> str:
        """The DSN's database, else the server's default for the session (DATABASE())."""
        if self.config.database is not None:
            return self.config.database
        with (
            source_errors(f"cannot name the database of {self.name}"),
            self.config.connect() as conn,
            conn.cursor() as cursor,
        ):
            cursor.execute("SELECT DATABASE()")
            row = cursor.fetchone()
        return "" if row is None or row[0] is None else str(row[0])

    def describe(self, table: TableRef) -> TableSchema:
        with (
            source_errors(f"cannot describe {table} of {self.name}"),
            closing(self.config.connect()) as conn,
        ):
            return table_schema(conn, table_shape(conn, table, self.config.unique_keys.get(table)))

    def lineage_name(self, table: TableRef) -> tuple[str, str]:
        """`mysql://host:port` and `database.table` (OpenLineage's MySQL naming): a MySQL
        database is the table's `schema` here."""
        return f"mysql://{self.config.host}:{self.config.port}", f"{table.schema}.{table.name}"
