"""Helpers for the PostgreSQL source tests: a server without logical decoding, and reading log
items until a condition holds (with a deadline, never a sleep)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from airflow_provider_dblog.core.log import LogItem, single_changes
from airflow_provider_dblog.devservices.postgres import PostgresServer
from tests.deadlines import deadline_s


class ReplicaWalServer(PostgresServer):
    """A throwaway PostgreSQL 15 whose wal_level is 'replica': not a possible DBLog source."""

    def _command(self) -> list[str]:
        return [*super()._command(), "-c", "wal_level=replica"]


def read_until(
    items: Iterator[LogItem],
    done: Callable[[list[LogItem]], bool],
    timeout: float = 30.0,
) -> list[LogItem]:
    """Items from `items` until `done(items so far)`, each run of changes as a `Change` a row
    (`single_changes`); fails after `timeout` seconds. The reader yields Idle when nothing
    happens, so the deadline is checked often."""
    deadline = time.monotonic() + timeout
    seen: list[LogItem] = []
    for item in single_changes(items):
        seen.append(item)
        if done(seen):
            return seen
        if time.monotonic() > deadline:
            break
    raise AssertionError(f"condition not met in {timeout}s; read {seen[-20:]}")


def wait_for(condition: Callable[[], bool], timeout: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + deadline_s(timeout)
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met in {deadline_s(timeout)}s")
        time.sleep(0.05)
