"""How to reach a MySQL/MariaDB source, and the one way to connect to it.

The DSN (`mysql://user@host:port/database`) never holds the password: it comes from the
environment variable named by `password_env`, so a config can be logged and stored. Every
connection pins the session settings that shape how values come back (UTC, utf8mb4), so the
binlog reader and the dump see a value alike.

TLS: with `ssl_ca` every connection (queries, the binlog stream, the Spark tasks' reads, the
read replica) verifies the server's certificate against that CA and, unless
`ssl_verify_identity = false`, that it names the DSN's host; `ssl_cert`/`ssl_key` present a
client certificate. A certificate that does not verify is a configuration error
(`SourceError`), not an outage. Without `ssl_ca`, PyMySQL uses TLS when the server offers it
but verifies nothing.
"""

from __future__ import annotations

import os
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit

import pymysql
from pymysql.constants import CR

from airflow_provider_dblog.core.event import TableRef
from airflow_provider_dblog.sources.base import SourceError, SourceUnavailable
from airflow_provider_dblog.sources.mysql.errors import LOGIN_REFUSED_CODES
from airflow_provider_dblog.sources.section import check_common, read_section

DEFAULT_PORT = 3306
# Both the query connections and the binlog reader's connection use these.
SESSION_INIT = "SET time_zone = '+00:00', NAMES utf8mb4 COLLATE utf8mb4_bin"

_IDENTIFIER = re.compile(r"[A-Za-z0-9_$]{1,64}")
_U32 = 1 << 32


@dataclass(frozen=True, slots=True)
class MysqlSourceConfig:
    """A MySQL 8 or MariaDB 10.6+ source. `name` goes into every event's `source.name`.

    `server_id` is the replica id the binlog reader announces; two readers with the same id
    kick each other off, so each reader adds a random offset below `server_id_span` unless
    `server_id_span` is 1 (then it is exactly `server_id`)."""

    name: str
    dsn: str
    tables: tuple[TableRef, ...]
    password_env: str | None = None
    watermark_database: str = "dblog"
    watermark_table: str = "watermark"
    server_id: int = 0x5DB10000
    server_id_span: int = 1 << 16
    unique_keys: Mapping[TableRef, str] = field(default_factory=dict)
    """For a captured table without a primary key, the unique index (on NOT NULL columns) that
    keys its rows, by name; needed only when it has several (`catalog.choose_row_key`)."""
    read_only: bool = False
    """Never write to the source: no watermark table, watermarks are binlog positions
    (`state/positional.py`). MariaDB only: MySQL does not say where a snapshot lies."""
    read_replica: str | None = None
    """The DSN (`mysql://user@host:port/database`) of a MariaDB replica of this server by GTID
    (the same user and password): chunk reads go there, each once the replica has applied
    the primary's GTID position of the moment its window opened (`MASTER_GTID_WAIT`)."""
    replica_wait_s: int = 60
    """How long a chunk waits for the replica before the window is retried (the dump waits
    for a lagging replica as for a source away, saying its lag)."""
    ssl_ca: str | None = None
    """The CA file (PEM) the server's certificate must be signed by: TLS, verified."""
    ssl_verify_identity: bool | None = None
    """Whether the certificate must name the host the DSN connects to; true unless set."""
    ssl_cert: str | None = None
    """A client certificate (PEM) to present, for a user created `REQUIRE X509`."""
    ssl_key: str | None = None
    """The client certificate's key, unless `ssl_cert` holds it too."""

    @property
    def type(self) -> str:
        return "mysql"

    def __post_init__(self) -> None:
        if _dsn_parts(self.dsn).password is not None:
            raise SourceError(
                "the MySQL dsn must not hold the password: put it in an environment variable "
                "and name that variable in password_env"
            )
        check_common(
            label="MySQL",
            name=self.name,
            password_env=self.password_env,
            tables=self.tables,
            watermark=self.watermark,
            table_word="database",
        )
        for what, value in (
            ("watermark_database", self.watermark_database),
            ("watermark_table", self.watermark_table),
        ):
            if not _IDENTIFIER.fullmatch(value):
                raise SourceError(f"{what} {value!r}: 1 to 64 letters, digits, '_' or '$'")
        if self.read_replica is not None and _dsn_parts(self.read_replica).password is not None:
            raise SourceError(
                "the read_replica dsn must not hold the password: the source's password_env is used"
            )
        if self.replica_wait_s < 1:
            raise SourceError(f"replica_wait_s must be at least 1, got {self.replica_wait_s}")
        self._check_tls()
        if not (self.server_id_span >= 1 and 1 <= self.server_id < _U32 - self.server_id_span):
            raise SourceError(
                f"server_id {self.server_id} with server_id_span {self.server_id_span}: "
                "the ids must stay within 1 .. 2^32-1"
            )

    def _check_tls(self) -> None:
        """TLS options that only mean something together, and never unverified."""
        for option in ("ssl_ca", "ssl_cert", "ssl_key"):
            if getattr(self, option) == "":
                raise SourceError(f"[source] {option} is empty: name a PEM file or leave it out")
        if self.ssl_ca is None:
            for option in ("ssl_verify_identity", "ssl_cert", "ssl_key"):
                if getattr(self, option) is not None:
                    raise SourceError(
                        f"[source] {option} needs ssl_ca, the CA file that signed the "
                        "server's certificate (TLS here always verifies the server)"
                    )
        if self.ssl_key is not None and self.ssl_cert is None:
            raise SourceError("[source] ssl_key needs ssl_cert, the client certificate it signs")

    @classmethod
    def from_section(cls, section: Mapping[str, Any]) -> MysqlSourceConfig:
        """The `[source]` table of the TOML file (`type` already read by the factory).

        Table names without a database are in the DSN's database."""
        dsn = section.get("dsn")
        default_schema = _dsn_parts(dsn).database if isinstance(dsn, str) else None
        options, tables = read_section(
            section,
            cls,
            kind="mysql",
            typed={
                "server_id": int,
                "server_id_span": int,
                "unique_keys": dict,
                "read_only": bool,
                "replica_wait_s": int,
                "ssl_verify_identity": bool,
            },
            table_word="database",
            default_schema=default_schema,
        )
        if "unique_keys" in options:
            options["unique_keys"] = _unique_keys(options["unique_keys"], tables, default_schema)
        return cls(tables=tables, **options)

    @property
    def watermark(self) -> TableRef:
        return TableRef(self.watermark_database, self.watermark_table)

    @property
    def host(self) -> str:
        return _dsn_parts(self.dsn).host

    @property
    def port(self) -> int:
        return _dsn_parts(self.dsn).port

    @property
    def database(self) -> str | None:
        return _dsn_parts(self.dsn).database

    def connect_kwargs(self, *, replica: bool = False) -> dict[str, Any]:
        """Keyword arguments for `pymysql.connect` (to the `read_replica` with `replica`),
        password included: never log them.

        The binlog stream (`wire.BinlogStream`) connects with them too."""
        parts = _dsn_parts(self.read_replica if replica and self.read_replica else self.dsn)
        kwargs: dict[str, Any] = {
            "host": parts.host,
            "port": parts.port,
            "user": parts.user,
            "charset": "utf8mb4",
            "init_command": SESSION_INIT,
        }
        if parts.database is not None:
            kwargs["database"] = parts.database
        if self.password_env is not None:
            password = os.environ.get(self.password_env)
            if password is None:
                raise SourceError(
                    f"the environment variable {self.password_env} (password_env) is not set"
                )
            kwargs["password"] = password
        return {**kwargs, **self._tls_kwargs()}

    def _tls_kwargs(self) -> dict[str, Any]:
        """PyMySQL's TLS arguments; each file named must be there (on a Spark worker too)."""
        if self.ssl_ca is None:
            return {}
        kwargs: dict[str, Any] = {
            "ssl_ca": self.ssl_ca,
            # PyMySQL checks the chain only if told so when the host name is not checked.
            "ssl_verify_cert": True,
            "ssl_verify_identity": self.ssl_verify_identity is not False,
        }
        for option in ("ssl_ca", "ssl_cert", "ssl_key"):
            path = getattr(self, option)
            if path is not None:
                if not os.path.isfile(path):
                    raise SourceError(f"[source] {option}: no such file {path!r}")
                kwargs[option] = path
        return kwargs

    def connect(self, *, replica: bool = False) -> pymysql.connections.Connection[Any]:
        """An autocommit connection (to the `read_replica` with `replica`). One that cannot be
        made raises SourceUnavailable."""
        kwargs = self.connect_kwargs(replica=replica)
        which = "the read replica of " if replica and self.read_replica else ""
        try:
            return pymysql.connect(**kwargs, autocommit=True, connect_timeout=10)
        except ssl.SSLError as exc:  # raised before connecting: the client's own files
            raise SourceError(
                f"cannot use the TLS files of MySQL source {self.name} "
                f"([source] ssl_ca, ssl_cert, ssl_key): {exc}"
            ) from None
        except pymysql.err.OperationalError as exc:
            refused = _tls_refusal(exc)
            if refused is not None:
                raise SourceError(
                    f"cannot connect to {which}MySQL source {self.name} over TLS: {refused} "
                    f"(check [source] ssl_ca, ssl_verify_identity and the dsn's host): "
                    f"{exc.args[-1]}"
                ) from None
            if exc.args and exc.args[0] in LOGIN_REFUSED_CODES:
                where = "read_replica" if which else "dsn"
                password = (
                    f"the password in the environment variable {self.password_env} (password_env)"
                    if self.password_env is not None
                    else "the password (password_env is not set)"
                )
                raise SourceError(
                    f"{which}MySQL source {self.name} refuses the login (check the user and "
                    f"database in [source] {where} and {password}): {exc.args[-1]}"
                ) from None
            raise SourceUnavailable(
                f"cannot connect to {which}MySQL source {self.name}: {exc.args[-1]}"
            ) from exc


def _tls_refusal(exc: pymysql.err.OperationalError) -> str | None:
    """What is wrong with TLS, if the connection failed on it: retrying would only meet the
    same refusal, so it stops at once instead of waiting for the server."""
    cause = getattr(exc, "original_exception", None)
    if isinstance(cause, ssl.SSLCertVerificationError):
        if "mismatch" in str(cause.verify_message):
            return "the server's certificate is for another host name"
        return "the server's certificate does not verify against the CA in ssl_ca"
    if exc.args and exc.args[0] == CR.CR_SSL_CONNECTION_ERROR:
        return "the server does not speak TLS"
    return None


@dataclass(frozen=True, slots=True)
class _DsnParts:
    user: str
    password: str | None
    host: str
    port: int
    database: str | None


def _dsn_parts(dsn: str) -> _DsnParts:
    """`mysql://user@host:port/database`; port and database are optional."""
    try:
        url = urlsplit(dsn)
        port = url.port or DEFAULT_PORT
    except ValueError as exc:
        raise SourceError(f"the MySQL dsn is malformed: {exc}") from None
    if url.scheme not in ("mysql", "mariadb") or not url.hostname or not url.username:
        raise SourceError(
            f"the MySQL dsn must look like mysql://user@host:port/database, got {_redact(dsn)!r}"
        )
    database = unquote(url.path.lstrip("/")) or None
    password = unquote(url.password) if url.password is not None else None
    return _DsnParts(unquote(url.username), password, url.hostname, port, database)


def _redact(dsn: str) -> str:
    """The dsn with anything between ':' and '@' in its authority hidden."""
    return re.sub(r"(//[^:/@]*):[^@]*@", r"\1:***@", dsn)


def _unique_keys(
    given: Mapping[str, Any], tables: tuple[TableRef, ...], default_schema: str | None
) -> dict[TableRef, str]:
    """`unique_keys = { "db.table" = "index" }`: each a captured table and an index name."""
    chosen = {}
    for name, index in given.items():
        try:
            table = TableRef.parse(name, default_schema=default_schema)
        except ValueError as exc:
            raise SourceError(f"[source] unique_keys: {exc}") from None
        if table not in tables:
            raise SourceError(f"[source] unique_keys names {table}, which is not captured")
        if not isinstance(index, str) or not index:
            raise SourceError(f"[source] unique_keys: {table} needs an index name, got {index!r}")
        chosen[table] = index
    return chosen
