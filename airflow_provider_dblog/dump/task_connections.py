"""What a Python worker of a Spark dump keeps from one task to the next: the source's chunk
connection (with the catalog it has read), the Redis client, and the direct target.

PySpark runs tasks one at a time in Python workers it reuses for every job of the application,
which is one dump. A task that opened all of these anew spent 20 to 40 ms on it here (two
connections, their password exchanges, the table's catalog) before it read a row; now the next
task on the same worker takes them over. A task that fails, or finds the source gone, does not
hand them on: the next one opens new ones, so a restarted server is never read through a dead
connection.
"""

from __future__ import annotations

import atexit
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import redis

from airflow_provider_dblog.config import Config
from airflow_provider_dblog.direct_target import DirectTarget
from airflow_provider_dblog.sources.base import ChunkSource
from airflow_provider_dblog.sources.factory import source_for
from airflow_provider_dblog.state import WindowStore


@dataclass
class TaskConnections:
    """One worker's connections for one deployment (`config`)."""

    config: Config
    source: ChunkSource
    client: redis.Redis
    windows: WindowStore
    direct: DirectTarget | None = None
    healthy: bool = True
    """A task sets it to False when it found a connection broken: they are not kept."""

    @classmethod
    def open(cls, config: Config) -> TaskConnections:
        client = config.redis_client()
        try:
            source = source_for(config.source).chunk_source()
        except BaseException:
            client.close()
            raise
        return cls(config, source, client, WindowStore(client, config.source.name))

    def target(self, open_target: Callable[[Config], DirectTarget]) -> DirectTarget:
        """The direct target, opened by `open_target` (`targets.direct_target_for`) at the
        first task that needs it."""
        if self.direct is None:
            self.direct = open_target(self.config)
        return self.direct

    def close(self) -> None:
        if self.direct is not None:
            self.direct.close()
        self.source.close()
        self.client.close()


_kept: TaskConnections | None = None
"""What the last task of this worker handed on (one deployment at a time)."""


@contextmanager
def task_connections(config: Config) -> Iterator[TaskConnections]:
    """The connections the worker kept for `config`, or new ones; kept for the next task when
    this one ends without an error and `healthy`, closed otherwise."""
    global _kept
    connections, _kept = _kept, None
    if connections is not None and connections.config != config:
        connections.close()
        connections = None
    if connections is None:
        connections = TaskConnections.open(config)
    try:
        yield connections
    except BaseException:
        connections.close()
        raise
    if connections.healthy:
        _kept = connections
    else:
        connections.close()


@atexit.register
def _close_kept() -> None:
    if _kept is not None:
        _kept.close()
