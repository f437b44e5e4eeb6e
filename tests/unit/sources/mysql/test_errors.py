"""Which MySQL/MariaDB errors are outages (`errors.session_lost`) and which are the server's
answer, on PyMySQL's error classes with the codes and words the servers send."""

from __future__ import annotations

import pymysql
import pytest

from airflow_provider_dblog.sources.base import SourceError, SourceUnavailable
from airflow_provider_dblog.sources.mysql.errors import (
    LOGIN_REFUSED_CODES,
    cause,
    session_lost,
    source_errors,
)

LOST = {
    2006: "MySQL server has gone away",
    2013: "Lost connection to MySQL server during query",
    2003: "Can't connect to MySQL server on '127.0.0.1' ([Errno 111] Connection refused)",
    1053: "Server shutdown in progress",
    1927: "Connection was killed",
    4031: "The client was disconnected by the server because of inactivity.",
    1290: "The MariaDB server is running with the --read-only option so it cannot execute "
    "this statement",
    1836: "Running in read-only mode",
}
ANSWERS = {
    1045: "Access denied for user 'dblog'@'localhost' (using password: YES)",
    1142: "UPDATE command denied to user 'dblog'@'localhost' for table `watermark`",
    1146: "Table 'shop.orders' doesn't exist",
    1290: "The MariaDB server is running with the --secure-file-priv option so it cannot "
    "execute this statement",
    1236: "Could not find first log file name in binary log index file",
}


@pytest.mark.parametrize("code", sorted(LOST))
def test_a_session_the_server_ended_is_lost(code: int) -> None:
    assert session_lost(pymysql.err.OperationalError(code, LOST[code]))


@pytest.mark.parametrize("code", sorted(ANSWERS))
def test_the_servers_answers_are_not_outages(code: int) -> None:
    assert not session_lost(pymysql.err.OperationalError(code, ANSWERS[code]))


def test_a_closed_connection_is_lost() -> None:
    assert session_lost(pymysql.err.InterfaceError(0, ""))
    assert not session_lost(pymysql.err.ProgrammingError(1064, "You have an error in your SQL"))


def test_source_errors_says_outage_or_answer_in_one_line() -> None:
    with pytest.raises(SourceUnavailable) as lost, source_errors("cannot check source shop"):
        raise pymysql.err.OperationalError(1927, LOST[1927])
    assert (
        str(lost.value) == "cannot check source shop: the session was lost: Connection was killed"
    )
    with pytest.raises(SourceError) as refused, source_errors("cannot check source shop"):
        raise pymysql.err.OperationalError(1142, ANSWERS[1142] + "\n")
    assert not isinstance(refused.value, SourceUnavailable)
    assert str(refused.value) == f"cannot check source shop: {ANSWERS[1142]}"


REFUSED_LOGINS = {
    1044: "Access denied for user 'dblog'@'%' to database 'shop'",
    1045: ANSWERS[1045],
    1049: "Unknown database 'shpo'",
    1130: "Host '10.0.0.7' is not allowed to connect to this MariaDB server",
    1698: "Access denied for user 'root'@'localhost'",
}


@pytest.mark.parametrize("code", sorted(REFUSED_LOGINS))
def test_a_refused_login_is_neither_lost_nor_retried(code: int) -> None:
    """A login the server refuses is no outage: no retry changes the password."""
    assert code in LOGIN_REFUSED_CODES
    assert not session_lost(pymysql.err.OperationalError(code, REFUSED_LOGINS[code]))
    assert not LOGIN_REFUSED_CODES & set(LOST)


def test_a_closed_connection_is_named_not_left_as_a_class_name() -> None:
    """PyMySQL's error for a connection it already closed has no words of its own."""
    assert cause(pymysql.err.InterfaceError(0, "")) == "the connection is closed"
