"""Which PostgreSQL errors are outages (`errors.session_lost`) and which are the server's answer,
on psycopg's own error classes built by SQLSTATE, as psycopg raises them."""

from __future__ import annotations

import psycopg
import psycopg.errors
import pytest

from airflow_provider_dblog.sources.base import SourceError, SourceUnavailable
from airflow_provider_dblog.sources.postgres.errors import (
    login_refused,
    session_lost,
    source_errors,
)

LOST = {
    "57P01": "terminating connection due to administrator command",
    "57P02": "terminating connection because of crash of another server process",
    "57P03": "the database system is shutting down",
    "57P05": "terminating connection due to idle-session timeout",
    "08006": "connection failure",
    "08003": "connection does not exist",
    "25006": "cannot execute UPDATE in a read-only transaction",
}
ANSWERS = {
    "42P01": 'relation "dblog.watermark" does not exist',
    "42501": "permission denied for table watermark",
    "55000": "logical decoding requires wal_level >= logical",
    "57P04": "database is being dropped",
    "57014": "canceling statement due to statement timeout",
    "22P02": "invalid input syntax for type bigint",
}


def error(sqlstate: str, message: str) -> psycopg.Error:
    made = psycopg.errors.lookup(sqlstate)(message)
    assert made.sqlstate == sqlstate
    return made


@pytest.mark.parametrize("sqlstate", sorted(LOST))
def test_a_session_ended_by_the_server_is_lost(sqlstate: str) -> None:
    assert session_lost(error(sqlstate, LOST[sqlstate]))


@pytest.mark.parametrize("sqlstate", sorted(ANSWERS))
def test_the_servers_answers_are_not_outages(sqlstate: str) -> None:
    assert not session_lost(error(sqlstate, ANSWERS[sqlstate]))


def test_libpq_losing_the_socket_or_a_closed_connection_is_lost() -> None:
    assert session_lost(psycopg.OperationalError("server closed the connection unexpectedly"))
    assert session_lost(psycopg.InterfaceError("the connection is closed"))
    assert not session_lost(psycopg.ProgrammingError("query has no results"))


class _Closed:
    closed = True


def test_any_error_that_closed_the_connection_is_lost() -> None:
    """A standby ends a read that conflicts with recovery with a FATAL 40001: the session is
    gone, whatever its SQLSTATE says."""
    conflict = error("40001", "terminating connection due to conflict with recovery")
    assert not session_lost(conflict)
    assert session_lost(conflict, _Closed())  # type: ignore[arg-type]


def test_source_errors_says_outage_or_answer_in_one_line() -> None:
    with pytest.raises(SourceUnavailable) as lost, source_errors("cannot set up source shop"):
        raise error("57P01", LOST["57P01"])
    assert str(lost.value) == (
        "cannot set up source shop: the session was lost: "
        "terminating connection due to administrator command"
    )
    assert isinstance(lost.value.__cause__, psycopg.errors.AdminShutdown)
    with pytest.raises(SourceError) as refused, source_errors("cannot set up source shop"):
        raise error("42501", "permission denied for database shop\nHINT: ask")
    assert not isinstance(refused.value, SourceUnavailable)
    assert str(refused.value) == (
        "cannot set up source shop: permission denied for database shop HINT: ask"
    )


REFUSED_LOGINS = [
    'FATAL:  password authentication failed for user "dblog"',
    'FATAL:  no pg_hba.conf entry for host "10.0.0.7", user "dblog", database "shop", no '
    "encryption",
    'FATAL:  pg_hba.conf rejects connection for host "10.0.0.7", user "dblog"',
    'FATAL:  role "dblgo" does not exist',
    'FATAL:  database "shpo" does not exist',
    'FATAL:  role "dblog" is not permitted to log in',
    "fe_sendauth: no password supplied",
]
NOT_LOGINS = [
    "connection refused\n\tIs the server running on that host and accepting TCP/IP connections?",
    "FATAL:  the database system is starting up",
    "FATAL:  sorry, too many clients already",
    "server closed the connection unexpectedly",
]


@pytest.mark.parametrize("said", REFUSED_LOGINS)
def test_a_login_the_server_refuses_is_told_by_libpqs_words(said: str) -> None:
    """libpq raises a failed connection without a SQLSTATE: its words are what tells a login
    refused (never worth a retry) from a server that is down or starting (an outage)."""
    message = f'connection failed: connection to server at "127.0.0.1", port 5432 failed: {said}'
    assert login_refused(psycopg.OperationalError(message))


@pytest.mark.parametrize("said", NOT_LOGINS)
def test_a_server_down_starting_or_full_is_not_a_refused_login(said: str) -> None:
    assert not login_refused(psycopg.OperationalError(f"connection failed: {said}"))


def test_a_refused_logins_sqlstate_is_enough_when_there_is_one() -> None:
    assert login_refused(error("28P01", "password authentication failed for user x"))
    assert login_refused(error("28000", "no pg_hba.conf entry"))
    assert not login_refused(error("57P03", "the database system is starting up"))
