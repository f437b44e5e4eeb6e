"""How to reach a PostgreSQL source, and the one way to connect to it.

The DSN never holds the password: it comes from the environment variable named by
`password_env` (or libpq's own PGPASSWORD / .pgpass), so a config can be logged and stored.
Every connection pins the session settings that shape how values print (time zone, date style,
float digits, bytea format): the log and the dump must print a value the same way.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import TupleRow

from airflow_provider_dblog.core.event import TableRef
from airflow_provider_dblog.sources.base import SourceError, SourceUnavailable

# Output settings shared by the replication connection (pgoutput prints values in the walsender
# session) and the query connection (the dump), so both print every value alike.
SESSION_OPTIONS = (
    "-c TimeZone=UTC -c DateStyle=ISO,MDY -c IntervalStyle=postgres "
    "-c extra_float_digits=1 -c bytea_output=hex -c client_encoding=UTF8"
)

_SLOT_NAME = re.compile(r"[a-z0-9_]{1,63}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


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

    @property
    def type(self) -> str:
        return "postgres"

    def __post_init__(self) -> None:
        if not self.name:
            raise SourceError("the PostgreSQL source needs a name (it goes into every event)")
        try:
            params = conninfo_to_dict(self.dsn)
        except psycopg.ProgrammingError as exc:
            raise SourceError(f"the PostgreSQL dsn is malformed: {exc}") from None
        if "password" in params:
            raise SourceError(
                "the PostgreSQL dsn must not hold the password: put it in an environment "
                "variable and name that variable in password_env"
            )
        if self.password_env is not None and not _ENV_NAME.fullmatch(self.password_env):
            raise SourceError(
                f"password_env must name an environment variable: {self.password_env!r}"
            )
        if not self.tables:
            raise SourceError("the PostgreSQL source captures no table: list at least one")
        if not all(isinstance(t, TableRef) for t in self.tables):
            raise SourceError("tables must be TableRef values ('schema.table')")
        if len(set(self.tables)) != len(self.tables):
            raise SourceError("a captured table is listed twice")
        if not _SLOT_NAME.fullmatch(self.slot):
            raise SourceError(
                f"slot {self.slot!r}: a replication slot name is 1 to 63 lower-case letters, "
                "digits or underscores"
            )
        for what, value in (
            ("publication", self.publication),
            ("watermark_schema", self.watermark_schema),
            ("watermark_table", self.watermark_table),
        ):
            if not value:
                raise SourceError(f"{what} must not be empty")
        if self.watermark in self.tables:
            raise SourceError(f"the watermark table {self.watermark} cannot also be captured")

    @classmethod
    def from_section(cls, section: Mapping[str, Any]) -> PostgresSourceConfig:
        """The `[source]` table of the TOML file (`type` already read by the factory).

        Table names without a schema are in `public`."""
        for required in ("name", "dsn", "tables"):
            if required not in section:
                raise SourceError(f"[source] needs '{required}'")
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(section) - fields - {"type"})
        if unknown:
            raise SourceError(
                f"[source] has unknown option(s) {', '.join(unknown)}; "
                f"known for postgres: {', '.join(sorted(fields))}"
            )
        for name, value in section.items():
            wanted = bool if name == "replica_identity_full" else str
            if name != "tables" and not isinstance(value, wanted):
                what = "true or false" if wanted is bool else "text"
                raise SourceError(f"[source] {name} must be {what}, got {value!r}")
        tables = section["tables"]
        if (
            isinstance(tables, str)
            or not isinstance(tables, list | tuple)
            or not all(isinstance(t, str) for t in tables)
        ):
            raise SourceError(f"[source] tables must be a list of 'schema.table', got {tables!r}")
        try:
            refs = tuple(TableRef.parse(t, default_schema="public") for t in tables)
        except (ValueError, AttributeError) as exc:
            raise SourceError(f"[source] tables: {exc}") from None
        options = {k: v for k, v in section.items() if k not in ("type", "tables")}
        return cls(tables=refs, **options)

    @property
    def watermark(self) -> TableRef:
        return TableRef(self.watermark_schema, self.watermark_table)

    def connect(self, *, replication: bool = False) -> psycopg.Connection[TupleRow]:
        """An autocommit connection; `replication=True` opens a logical replication one.

        A connection that cannot be made raises SourceUnavailable (retry later)."""
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
        extra = conninfo_to_dict(self.dsn).get("options")
        kwargs["options"] = f"{extra} {SESSION_OPTIONS}" if extra else SESSION_OPTIONS
        if replication:
            kwargs["replication"] = "database"
        try:
            return psycopg.connect(self.dsn, **kwargs)
        except psycopg.OperationalError as exc:
            raise SourceUnavailable(
                f"cannot connect to PostgreSQL source {self.name} (check [source] dsn and "
                f"password_env): {exc}"
            ) from exc
