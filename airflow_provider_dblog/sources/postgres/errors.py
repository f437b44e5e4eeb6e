"""Which PostgreSQL errors mean "this session is gone" and which are the server's answer.

A session that is gone is an outage: the caller (the tailer, a dump) waits and connects again,
so it raises `SourceUnavailable`. That is a connection exception (SQLSTATE class 08, or libpq
losing the socket, which has no SQLSTATE), the server ending the session (57P01 admin_shutdown:
`pg_terminate_backend` or a fast shutdown; 57P02 crash_shutdown; 57P05 idle_session_timeout),
a server starting up or shutting down (57P03 cannot_connect_now), a failover target that is
still a standby (25006 read_only_sql_transaction), and any error after which the connection is
closed (a FATAL one: a standby ending a read that conflicts with recovery). Anything else (a
missing table, a missing grant, a wrong setting) is the server's answer and no retry changes
it: a `SourceError` saying so in one line. So is a login the server refuses (`login_refused`:
a wrong password, an unknown role or database, no pg_hba.conf line for the client), though
libpq reports it as a failed connection like a server that is down.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg

from airflow_provider_dblog.sources.base import SourceError, SourceUnavailable

_LOST_STATES = frozenset(("57P01", "57P02", "57P03", "57P05", "25006"))
_LOGIN_STATES = frozenset(("28000", "28P01", "3D000"))
"""invalid_authorization_specification, invalid_password, invalid_catalog_name."""
_LOGIN_WORDS = (
    "password authentication failed",
    "no pg_hba.conf entry",
    "pg_hba.conf rejects connection",
    "is not permitted to log in",
    "no password supplied",
)
_LOGIN_MISSING = re.compile(r'FATAL:\s+(role|database) "[^"]*" does not exist')
"""libpq gives no SQLSTATE for a failed connection: its words are all there is."""


def lost_sqlstate(sqlstate: str | None) -> bool:
    """Whether an error with `sqlstate` means the session is gone (see the module's list)."""
    return sqlstate is not None and (sqlstate.startswith("08") or sqlstate in _LOST_STATES)


def session_lost(exc: psycopg.Error, conn: psycopg.Connection[Any] | None = None) -> bool:
    """Whether `exc`, met on `conn`, means the session is gone: its SQLSTATE says so, it has
    none but is an `OperationalError` (libpq lost the connection), the connection is closed
    (`InterfaceError`), or `conn` is closed after it."""
    if isinstance(exc, psycopg.InterfaceError) or (conn is not None and conn.closed):
        return True
    if exc.sqlstate is None:
        return isinstance(exc, psycopg.OperationalError)
    return lost_sqlstate(exc.sqlstate)


def login_refused(exc: psycopg.Error) -> bool:
    """Whether `exc`, met connecting, is the server refusing the login itself: no retry can
    change it (a session that is gone, a server starting or down, can)."""
    if exc.sqlstate is not None:
        return exc.sqlstate in _LOGIN_STATES
    text = str(exc)
    return any(words in text for words in _LOGIN_WORDS) or bool(_LOGIN_MISSING.search(text))


@contextmanager
def source_errors(doing: str) -> Iterator[None]:
    """psycopg's errors in the block as the source's, `doing` (what the block does, naming
    the source) and the server's words on one line: `SourceUnavailable` when the session is
    gone, `SourceError` otherwise."""
    try:
        yield
    except psycopg.Error as exc:
        cause = " ".join(str(exc).split()) or type(exc).__name__
        if session_lost(exc):
            raise SourceUnavailable(f"{doing}: the session was lost: {cause}") from exc
        raise SourceError(f"{doing}: {cause}") from None
