"""Which MySQL/MariaDB errors mean "this session is gone" and which are the server's answer.

A session that is gone is an outage: the caller (the tailer, a dump) waits and connects again,
so it raises `SourceUnavailable`. That is the server gone or the connection lost (2006, 2013,
and PyMySQL's `InterfaceError` on a closed connection), refused (2003) or full (1040), the
server shutting down (1053), the session killed (1927: MariaDB's KILL CONNECTION) or dropped
for inactivity (4031, MySQL 8), and a failover target that is still read-only (1290 naming
--read-only or --super-read-only, 1836). Anything else (a missing table, a missing grant, a
wrong setting) is the server's answer and no retry changes it: a `SourceError` saying so in
one line. So is a login the server refuses (`LOGIN_REFUSED_CODES`: a wrong password, a user
or host it does not know, a database it does not have or denies), though PyMySQL raises it as
the same `OperationalError` as a server that is down.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pymysql

from airflow_provider_dblog.sources.base import SourceError, SourceUnavailable

LOST_SERVER_CODES = frozenset((1040, 1053, 1927, 2003, 2006, 2013, 4031))
LOGIN_REFUSED_CODES = frozenset((1044, 1045, 1049, 1130, 1251, 1698))
"""Database access denied, access denied (the password), unknown database, host not allowed,
client cannot use the user's authentication plugin, access denied to a user without password."""
_READ_ONLY_CODES = frozenset((1290, 1836))
"""1290 is "running with the --X option" for any X: read-only only when X says so."""


def session_lost(exc: pymysql.err.MySQLError) -> bool:
    """Whether `exc` means the session is gone (see the module's list)."""
    if isinstance(exc, pymysql.err.InterfaceError):
        return True
    code = exc.args[0] if exc.args else None
    if code in LOST_SERVER_CODES:
        return True
    return code in _READ_ONLY_CODES and "read-only" in cause(exc).lower()


def cause(exc: pymysql.err.MySQLError) -> str:
    """The server's (or PyMySQL's) words for `exc`, on one line. PyMySQL has none for a
    connection it already closed (a kill or a lost socket met before)."""
    text = str(exc.args[-1]) if exc.args else ""
    said = " ".join(text.split())
    if not said and isinstance(exc, pymysql.err.InterfaceError):
        return "the connection is closed"
    return said or type(exc).__name__


@contextmanager
def source_errors(doing: str) -> Iterator[None]:
    """PyMySQL's errors in the block as the source's, `doing` (what the block does, naming
    the source) and the server's words on one line: `SourceUnavailable` when the session is
    gone, `SourceError` otherwise."""
    try:
        yield
    except pymysql.err.MySQLError as exc:
        if session_lost(exc):
            raise SourceUnavailable(f"{doing}: the session was lost: {cause(exc)}") from exc
        raise SourceError(f"{doing}: {cause(exc)}") from None
