"""Making a MySQL/MariaDB database a DBLog source, and checking that it is one.

`ensure_setup` creates what is missing (the watermark database and table with its one row) and
is safe to run again; a read-only source has none. `preflight` only reads, and raises a
SourceError subclass whose message says what to change. `check_binlog_retained` is for the log
reader: can it resume from its checkpoint's binlog file? The `check_*` functions are the pure
rules, taking values read from the server. A session lost meanwhile raises `SourceUnavailable`,
any other refusal of the server (a missing grant) a one-line `SourceError`
(`errors.source_errors`).
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import pymysql

from airflow_provider_dblog.core.event import TableRef
from airflow_provider_dblog.sources.base import SourceError, UnknownTable
from airflow_provider_dblog.sources.mysql.catalog import row_key
from airflow_provider_dblog.sources.mysql.config import MysqlSourceConfig
from airflow_provider_dblog.sources.mysql.converters import quote_name
from airflow_provider_dblog.sources.mysql.errors import source_errors

log = logging.getLogger(__name__)

_VARIABLES = """
SHOW GLOBAL VARIABLES WHERE Variable_name IN
 ('version', 'log_bin', 'binlog_format', 'binlog_row_image', 'binlog_row_metadata',
  'binlog_order_commits')
"""

_TABLE_TYPE = """
SELECT TABLE_TYPE FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s
"""

_REPLICATION_CLIENT = ("REPLICATION CLIENT", "BINLOG MONITOR", "SUPER")
"""Any of these lets a user list and read the binlog's position (MariaDB 10.5+ calls
REPLICATION CLIENT BINLOG MONITOR)."""


def is_mariadb(variables: Mapping[str, str]) -> bool:
    return "mariadb" in variables.get("version", "").lower()


def check_binlog(variables: Mapping[str, str]) -> None:
    """The server writes a binlog the reader can use: ROW format, FULL images, and (MySQL)
    commits in binlog order, which the chunk reads rely on (see `chunks`)."""
    if variables.get("log_bin", "OFF").upper() not in ("ON", "1"):
        raise SourceError(
            "the binary log is off: start the server with log_bin (--log-bin=binlog) and "
            "server_id set, binlog_format = ROW and binlog_row_image = FULL"
        )
    binlog_format = variables.get("binlog_format", "")
    if binlog_format.upper() != "ROW":
        raise SourceError(
            f"binlog_format is {binlog_format}: DBLog reads row events only; "
            "SET GLOBAL binlog_format = 'ROW' (and in the server's configuration), then "
            "reconnect the applications, whose sessions keep the old format"
        )
    row_image = variables.get("binlog_row_image", "")
    if row_image.upper() != "FULL":
        raise SourceError(
            f"binlog_row_image is {row_image}: updates and deletes must log every column; "
            "SET GLOBAL binlog_row_image = 'FULL' (and in the server's configuration)"
        )
    order = variables.get("binlog_order_commits")
    if not is_mariadb(variables) and order is not None and order.upper() not in ("ON", "1"):
        raise SourceError(
            "binlog_order_commits is OFF: a chunk read could miss a transaction the binlog "
            "shows before its low watermark; SET GLOBAL binlog_order_commits = ON"
        )


def row_metadata_is_full(variables: Mapping[str, str]) -> bool:
    """False (with a warning) when the binlog lacks column names: the reader then takes them
    from information_schema, which is wrong for a moment after an ALTER TABLE."""
    metadata = variables.get("binlog_row_metadata", "MINIMAL")
    if metadata.upper() == "FULL":
        return True
    log.warning(
        "binlog_row_metadata is %s: column names come from information_schema instead of the "
        "binlog, which can mislabel rows logged before an ALTER TABLE; "
        "SET GLOBAL binlog_row_metadata = 'FULL' to avoid it",
        metadata,
    )
    return False


def check_grants(user: str, privileges: Collection[str]) -> None:
    """`privileges` are the user's global privileges (information_schema.USER_PRIVILEGES)."""
    missing = []
    if "REPLICATION SLAVE" not in privileges:
        missing.append("REPLICATION SLAVE")
    if not any(p in privileges for p in _REPLICATION_CLIENT):
        missing.append("REPLICATION CLIENT")
    if missing:
        raise SourceError(
            f"user {user} may not read the binlog: GRANT {', '.join(missing)} ON *.* TO {user} "
            "(REPLICATION CLIENT is BINLOG MONITOR on MariaDB 10.5+)"
        )


def check_snapshot_positions(variables: Mapping[str, str]) -> None:
    """A read-only source's chunk reads say where their snapshot lies in the binlog: MariaDB's
    binlog_snapshot_position does; MySQL has no such thing."""
    if not is_mariadb(variables):
        raise SourceError(
            "read_only needs MariaDB: its chunk reads take the binlog position of their "
            "snapshot (binlog_snapshot_position), which MySQL does not give; set read_only = "
            "false and grant the watermark table's writes"
        )


def check_table(table: TableRef, kind: str | None) -> None:
    """`kind` is the table's TABLE_TYPE, None when the table is unknown. Its key is checked
    apart (`catalog.row_key`)."""
    if kind is None:
        raise UnknownTable(f"captured table {table} does not exist: create it or stop capturing it")
    if kind not in ("BASE TABLE", "SYSTEM VERSIONED"):
        raise UnknownTable(f"{table} is a {kind.lower()}, not a table: capture tables only")


def check_binlog_retained(binlog_file: str, available: Sequence[str]) -> None:
    """The checkpoint's binlog file is still on the server (`available`: SHOW BINARY LOGS)."""
    if binlog_file in available:
        return
    oldest = min(available, default=None)
    raise SourceError(
        f"binlog file {binlog_file} of the checkpoint is gone from the server (oldest kept: "
        f"{oldest or 'none'}): the changes since cannot be read. Keep binlogs longer "
        "(binlog_expire_logs_seconds), then start the tailer afresh and dump every table again"
    )


def preflight(config: MysqlSourceConfig) -> None:
    """Raise the first reason `config` cannot be used as a source; return if it can."""
    with source_errors(f"cannot check source {config.name}"), config.connect() as conn:
        _check_server(conn)
        _check_captured(conn, config)
        if config.read_only:
            check_snapshot_positions(server_variables(conn))
        elif _table_type(conn, config.watermark) is None:
            raise SourceError(
                f"watermark table {config.watermark} does not exist: run ensure_setup"
            )


def ensure_setup(config: MysqlSourceConfig) -> None:
    """Create the watermark database and table (with its one row) if missing; check the rest.
    A read-only source creates nothing: it is only checked."""
    if config.read_only:
        preflight(config)
        return
    with source_errors(f"cannot set up source {config.name}"), config.connect() as conn:
        _check_server(conn)
        _check_captured(conn, config)
        watermark = f"{quote_name(config.watermark_database)}.{quote_name(config.watermark_table)}"
        with conn.cursor() as cursor:
            # Asked first: CREATE DATABASE IF NOT EXISTS needs the global CREATE privilege
            # even when the database exists.
            cursor.execute(
                "SELECT 1 FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = %s",
                (config.watermark_database,),
            )
            if cursor.fetchone() is None:
                cursor.execute(f"CREATE DATABASE {quote_name(config.watermark_database)}")
            cursor.execute(
                f"CREATE TABLE IF NOT EXISTS {watermark} (id int PRIMARY KEY, value varchar(255)"
                " CHARACTER SET utf8mb4 COLLATE utf8mb4_bin) ENGINE = InnoDB"
            )
            cursor.execute(f"INSERT IGNORE INTO {watermark} (id, value) VALUES (1, NULL)")


def binlog_retained(config: MysqlSourceConfig, binlog_file: str) -> None:
    """`check_binlog_retained` against the server's binlogs, for the log reader's checkpoint."""
    with (
        source_errors(f"cannot list the binlogs of {config.name}"),
        config.connect() as conn,
        conn.cursor() as cursor,
    ):
        cursor.execute("SHOW BINARY LOGS")
        available = [str(row[0]) for row in cursor.fetchall()]
    check_binlog_retained(binlog_file, available)


def server_variables(conn: pymysql.connections.Connection[Any]) -> dict[str, str]:
    """The global variables the checks read (absent ones are left out: older servers)."""
    with conn.cursor() as cursor:
        cursor.execute(_VARIABLES)
        return {str(name): str(value) for name, value in cursor.fetchall()}


def _check_server(conn: pymysql.connections.Connection[Any]) -> None:
    variables = server_variables(conn)
    check_binlog(variables)
    row_metadata_is_full(variables)
    with conn.cursor() as cursor:
        cursor.execute("SELECT CURRENT_USER()")
        row = cursor.fetchone()
        assert row is not None
        user, _, host = str(row[0]).rpartition("@")
        cursor.execute(
            "SELECT PRIVILEGE_TYPE FROM information_schema.USER_PRIVILEGES WHERE GRANTEE = %s",
            (f"'{user}'@'{host}'",),
        )
        privileges = {str(p) for (p,) in cursor.fetchall()}
    check_grants(f"'{user}'@'{host}'", privileges)


def _table_type(conn: pymysql.connections.Connection[Any], table: TableRef) -> str | None:
    with conn.cursor() as cursor:
        cursor.execute(_TABLE_TYPE, (table.schema, table.name))
        row = cursor.fetchone()
    return None if row is None else str(row[0])


def _check_captured(conn: pymysql.connections.Connection[Any], config: MysqlSourceConfig) -> None:
    """Every captured table exists and has a key (`catalog.row_key`)."""
    for table in config.tables:
        check_table(table, _table_type(conn, table))
        row_key(conn, table, config.unique_keys.get(table))
