"""Direct dumps into SQL apply (`SqlDirectTarget`): a chunk's rows written from the dump's
driver, not through the tailer, with the same monotonic statements as the tailer's batches.

Each chunk is a transaction of its own: a row positioned at its window's hw loses to any event
of its key at a higher position, whichever commits first. Those transactions take no fence:
they do not come from a tailer, and the row locks of `dblog_positions` order them against the
tailer's batches (a deadlock between the two is tried again: `batch.retry_on_conflict`).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from airflow_provider_dblog.core.direct import DirectRecord
from airflow_provider_dblog.core.dump_plan import Chunk
from airflow_provider_dblog.core.event import (
    Event,
    Op,
    Origin,
    PlainEvent,
    Row,
    SourceInfo,
    TableRef,
)
from airflow_provider_dblog.core.position import Position
from airflow_provider_dblog.direct_target import StagedRead, stage_rows_read
from airflow_provider_dblog.outputs.base import TargetTableMissing
from airflow_provider_dblog.outputs.sql_apply.batch import TargetConnection, retry_on_conflict
from airflow_provider_dblog.outputs.sql_apply.statements import prune_tombstones
from airflow_provider_dblog.outputs.sql_apply.target import Target
from airflow_provider_dblog.sources.base import ChunkSource


def _dump_event(
    source_name: str, table: TableRef, target: Target, row: Row, position: Position
) -> Event:
    """A direct dump's row as the `r` event the tailer would have emitted for it."""
    try:
        key_row = {c: row[c] for c in target.key}
    except KeyError as missing:
        raise TargetTableMissing(
            f"target table {target.ref} is keyed by ({', '.join(target.key)}) but a dumped row "
            f"of {table} has no column {missing}"
        ) from None
    source = SourceInfo(source_name, "", table.schema, table.name, position, Origin.DUMP)
    return PlainEvent(Op.READ, key_row, None, row, source, 0)


class SqlDirectTarget:
    """The `DirectTarget` (`direct_target.py`) of SQL apply in monotonic mode: `stage` keeps
    its part as the handle itself (the rows as JSON), and `commit` upserts the chunk's survivors
    from the driver in one transaction, each refused where the target holds a higher position.
    The rows pass through the driver (one chunk at a time), not through the tailer; one
    database takes the writes however many tasks read."""

    def __init__(
        self,
        dsn: str,
        source_name: str,
        *,
        table_map: Mapping[str, str] | None = None,
        connect_timeout: int = 10,
    ) -> None:
        self._source_name = source_name
        self._options: dict[str, Any] = {
            "monotonic": True,
            "table_map": table_map,
            "connect_timeout": connect_timeout,
        }
        self._dsn = dsn
        self._local = threading.local()
        self._connections: list[TargetConnection] = []
        self._lock = threading.Lock()

    @property
    def _target(self) -> TargetConnection:
        """This thread's connection: a connection is used by one thread at a time, and a dump's
        chunks in flight run in threads of their own."""
        target: TargetConnection | None = getattr(self._local, "target", None)
        if target is None:
            target = self._local.target = TargetConnection(self._dsn, **self._options)
            with self._lock:
                self._connections.append(target)
        return target

    def stage(self, table: TableRef, rows: Sequence[Row]) -> str:
        """The handle of `rows`: the rows themselves, as JSON."""
        return json.dumps(rows, separators=(",", ":"))

    def stage_chunk(
        self, source: ChunkSource, chunk: Chunk, key_columns: Sequence[str]
    ) -> StagedRead:
        return stage_rows_read(self.stage, source, chunk, key_columns)

    def commit(
        self,
        table: TableRef,
        handles: Sequence[str],
        record: DirectRecord,
        key_columns: Sequence[str],
    ) -> int:
        rows = [row for handle in handles for row in json.loads(handle)]
        survivors = record.survivors(rows, key_columns)
        return self._write(table, survivors, record.rows_position)

    def _write(self, table: TableRef, rows: Sequence[Row], position: Position) -> int:
        """Upsert rows of `table`, all at `position`, in one transaction of their own; the rows
        applied (a key an event at a higher position reached is left alone)."""
        if not rows:
            return 0
        target = self._target

        def attempt() -> int:
            try:
                with target.transaction() as conn:
                    described = target.describe(conn, table)
                    events = [
                        _dump_event(self._source_name, table, described, row, position)
                        for row in rows
                    ]
                    return target.apply_counted(conn, events)
            finally:
                # The next chunk describes the table again (the tailer may alter it): no
                # statement built for this one may serve it.
                target.forget()

        return retry_on_conflict(attempt)

    def discard(self, table: TableRef, handles: Sequence[str]) -> None:
        """Nothing to forget: the rows were in the handles."""

    def prune_tombstones(self, table: TableRef, before: Position) -> int:
        """Forget the deleted keys of `table` positioned before `before`: no older image of
        them can come any more (see `core.direct.tombstone_horizon`). Tried again when it
        deadlocks with the tailer's batch on the same positions."""

        def attempt() -> int:
            with self._target.transaction() as conn:
                return prune_tombstones(conn, self._source_name, table, before)

        return retry_on_conflict(attempt)

    def close(self) -> None:
        with self._lock:
            connections, self._connections = self._connections, []
        for connection in connections:
            connection.close()
