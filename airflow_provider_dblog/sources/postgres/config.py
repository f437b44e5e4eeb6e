"""How to reach a PostgreSQL source, and the one way to connect to it.

The DSN never holds the password: it comes from the environment variable named by
`password_env` (or libpq's own PGPASSWORD / .pgpass), so a config can be logged and stored.
TLS is libpq's: `sslmode=verify-full sslrootcert=...` (and `sslcert`/`sslkey`) in the DSN hold
for every connection made here, the replication stream's and the Spark tasks' included; a
certificate that does not verify is a configuration error (`SourceError`), not an outage.
Every connection pins the session settings that shape how values print (time zone, date style,
float digits, bytea format): the log and the dump must print a value the same way.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import TupleRow

from airflow_provider_dblog.core.event import TableRef
from airflow_provider_dblog.libpq_tls import tls_refusal
from airflow_provider_dblog.sources.base import SourceError, SourceUnavailable
from airflow_provider_dblog.sources.postgres.errors import login_refused
from airflow_provider_dblog.sources.section import check_common, read_section

# Output settings shared by the replication connection (pgoutput prints values in the walsender
# session) and the query connection (the dump), so both print every value alike.
SESSION_OPTIONS = (
    "-c TimeZone=UTC -c DateStyle=ISO,MDY -c IntervalStyle=postgres "
    "-c extra_float_digits=1 -c bytea_output=hex -c client_encoding=UTF8"
)

_SLOT_NAME = re.compile(r"[a-z0-9_]{1,63}")


@dataclass(frozen=True, slots=True)
class PostgresSourceConfig:
    """A PostgreSQL source. `name` goes into every event's `source.name`."""

    name: str
    dsn: str
    tables: tuple[TableRef, ...]
    password_env: str | None = None
    slot: str = "dblog"
    publication: str = "dblog"
    watermark_schema: str = "dblog"
    watermark_table: str = "watermark"
    replica_identity_full: bool = False
    read_only: bool = False
    """Never write to the source: no watermark table, watermarks are WAL positions
    (`state/positional.py`); the publication must exist (creating one takes owning the
    tables)."""
    read_replica: str | None = None
    """The DSN of a hot standby of this server (the same role and password): chunk reads go
    there, each once the standby has replayed what the primary had flushed when its window
    opened, so the dump's reads cost the primary nothing but a position a chunk."""
    replica_wait_s: int = 60
    """How long a chunk waits for the standby to replay up to its window before the window is
    retried (the dump waits for a lagging standby as for a source away, saying its lag)."""

    @property
    def type(self) -> str:
        return "postgres"

    def __post_init__(self) -> None:
        for option, dsn in (("dsn", self.dsn), ("read_replica", self.read_replica)):
            if dsn is not None:
                _check_dsn(option, dsn)
        check_common(
            label="PostgreSQL",
            name=self.name,
            password_env=self.password_env,
            tables=self.tables,
            watermark=self.watermark,
            table_word="schema",
        )
        if not _SLOT_NAME.fullmatch(self.slot):
            raise SourceError(
                f"slot {self.slot!r}: a replication slot name is 1 to 63 lower-case letters, "
                "digits or underscores"
            )
        if self.replica_wait_s < 1:
            raise SourceError(f"replica_wait_s must be at least 1, got {self.replica_wait_s}")
        if self.read_only and self.replica_identity_full:
            raise SourceError(
                "replica_identity_full alters the captured tables, read_only never writes: "
                "set the replica identity yourself (ALTER TABLE ... REPLICA IDENTITY FULL)"
            )
        for what, value in (
            ("publication", self.publication),
            ("watermark_schema", self.watermark_schema),
            ("watermark_table", self.watermark_table),
        ):
            if not value:
                raise SourceError(f"{what} must not be empty")

    @classmethod
    def from_section(cls, section: Mapping[str, Any]) -> PostgresSourceConfig:
        """The `[source]` table of the TOML file (`type` already read by the factory).

        Table names without a schema are in `public`."""
        options, tables = read_section(
            section,
            cls,
            kind="postgres",
            typed={"replica_identity_full": bool, "read_only": bool, "replica_wait_s": int},
            table_word="schema",
            default_schema="public",
        )
        return cls(tables=tables, **options)

    @property
    def watermark(self) -> TableRef:
        return TableRef(self.watermark_schema, self.watermark_table)

    def connect(
        self, *, replication: bool = False, replica: bool = False
    ) -> psycopg.Connection[TupleRow]:
        """An autocommit connection; `replication=True` opens a logical replication one,
        `replica=True` one to the `read_replica`.

        A connection that cannot be made raises SourceUnavailable (retry later)."""
        dsn = self.read_replica if replica and self.read_replica is not None else self.dsn
        # Any: psycopg.connect's keywords differ in type (autocommit is a bool, the rest
        # connection parameters), so one dict of them can be typed no closer.
        kwargs: dict[str, Any] = {"autocommit": True, "connect_timeout": 10}
        if self.password_env is not None:
            password = os.environ.get(self.password_env)
            if password is None:
                raise SourceError(
                    f"the environment variable {self.password_env} (password_env) is not set"
                )
            kwargs["password"] = password
        extra = conninfo_to_dict(dsn).get("options")
        kwargs["options"] = f"{extra} {SESSION_OPTIONS}" if extra else SESSION_OPTIONS
        if replication:
            kwargs["replication"] = "database"
        try:
            return psycopg.connect(dsn, **kwargs)
        except psycopg.OperationalError as exc:
            which = "read_replica" if dsn is not self.dsn else "dsn"
            refused = tls_refusal(str(exc))
            if refused is not None:
                raise SourceError(
                    f"cannot connect to PostgreSQL source {self.name} over TLS: {refused} "
                    f"(check sslmode, sslrootcert and the host in [source] {which}): {exc}"
                ) from None
            if login_refused(exc):
                raise SourceError(
                    f"PostgreSQL source {self.name} refuses the login (check the user and "
                    f"database in [source] {which} and {_password_of(self.password_env)}): "
                    f"{_server_words(exc)}"
                ) from None
            raise SourceUnavailable(
                f"cannot connect to PostgreSQL source {self.name} (check the host and port in "
                f"[source] {which}): {exc}"
            ) from exc


def _password_of(password_env: str | None) -> str:
    """Where the password a refused login used came from."""
    if password_env is None:
        return "the password (password_env is not set)"
    return f"the password in the environment variable {password_env} (password_env)"


def _server_words(exc: psycopg.Error) -> str:
    """libpq's message for a refused login, without its "connection failed: connection to
    server at ..." preamble, on one line."""
    text = " ".join(str(exc).split())
    _, fatal, said = text.rpartition("FATAL: ")
    return said if fatal else text


def _check_dsn(option: str, dsn: str) -> None:
    """A DSN that parses and holds no password (it comes from `password_env`)."""
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as exc:
        raise SourceError(f"the PostgreSQL {option} is malformed: {exc}") from None
    if "password" in params:
        raise SourceError(
            f"the PostgreSQL {option} must not hold the password: put it in an environment "
            "variable and name that variable in password_env"
        )
