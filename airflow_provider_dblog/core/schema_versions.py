"""The rule that numbers a table's schemas: `schema_version` grows by one per real change.

A log reader describes a table's columns whenever it learns they may have changed (pgoutput
resends a Relation message on every new stream and after every ALTER; MySQL has its DDL). The
tailer keeps, per table, the description it last emitted with its version and log position
(`KnownSchema`, persisted in the state store once the schema event is durable), and
`SchemaTracker` decides which descriptions are changes worth a schema event.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from airflow_provider_dblog.core.event import TableRef
from airflow_provider_dblog.core.position import Position
from airflow_provider_dblog.core.schema import TableSchema


@dataclass(frozen=True, slots=True)
class KnownSchema:
    """A table's schema as last emitted: its version and the log position of its event."""

    table: TableRef
    version: int
    schema: TableSchema
    position: Position


class SchemaTracker:
    """The tailer's schema versions: one table's version grows by one per real change.

    `known` is what the store kept: schema events that were made durable, for each table the
    one in effect at the checkpoint and every later one (`replayable`). `resume` is that
    checkpoint: a restarted tailer reads the log again after it, and the rows it reads there
    take the version then in effect. A description at or before the latest known position is
    a replay of log already emitted (the tailer restarted from an older checkpoint): it
    changes nothing but the version in effect, so a replayed row carries the version it
    carried when first read, which the SQL target needs to drop a column the replay crosses.
    A later description whose columns (`TableSchema.signature`) differ from the latest ones
    is a change, which takes the next version. Comparing only what the log itself says keeps
    a replay's decisions those of the first reading, whatever the catalog says by then.
    """

    def __init__(self, known: Iterable[KnownSchema] = (), resume: int | None = None) -> None:
        self._history: dict[TableRef, list[KnownSchema]] = {}
        for schema in sorted(known, key=lambda k: k.version):
            self._history.setdefault(schema.table, []).append(schema)
        self._current: dict[TableRef, KnownSchema | None] = {}
        self._versions: dict[TableRef, int] = {}
        for table, history in self._history.items():
            in_effect = history[-1] if resume is None else _in_effect(history, (resume, math.inf))
            self._use(table, in_effect)

    @property
    def versions(self) -> Mapping[TableRef, int]:
        """Each described table's version in effect, kept current as `observe` goes: a log
        reader that builds row events with them is handed this (see
        `sources.base.StampsSchemaVersions`)."""
        return self._versions

    def version(self, table: TableRef) -> int:
        """The table's version in effect; 0 before any description of it."""
        return self._versions.get(table, 0)

    def schema(self, table: TableRef) -> TableSchema | None:
        """The table's schema in effect; None before any description of it (or when the
        store no longer keeps the one in effect at the checkpoint)."""
        current = self._current.get(table)
        return None if current is None else current.schema

    def observe(
        self, table: TableRef, schema: TableSchema, position: Position
    ) -> KnownSchema | None:
        """The schema to emit at `position`, if `schema` changes the table's; None otherwise."""
        history = self._history.setdefault(table, [])
        latest = history[-1] if history else None
        if latest is not None and position <= latest.position:
            self._use(table, _in_effect(history, (position.commit, position.seq)))
            return None
        if latest is not None and schema.signature == latest.schema.signature:
            self._use(table, latest)
            return None
        change = KnownSchema(table, 1 if latest is None else latest.version + 1, schema, position)
        history.append(change)
        self._use(table, change)
        return change

    def _use(self, table: TableRef, schema: KnownSchema | None) -> None:
        self._current[table] = schema
        self._versions[table] = (
            schema.version if schema is not None else self._history[table][0].version - 1
        )


def _in_effect(history: Sequence[KnownSchema], at: tuple[int, float]) -> KnownSchema | None:
    """The last of `history` (oldest first) at or before `at`, a position's `(commit, seq)`;
    None when all come later."""
    earlier = [k for k in history if (k.position.commit, k.position.seq) <= at]
    return earlier[-1] if earlier else None


def replayable(history: Sequence[KnownSchema], checkpoint: int | None) -> list[KnownSchema]:
    """What of a table's `history` (oldest first) a tailer restarting from `checkpoint` can
    still meet: the schema in effect at the checkpoint and every later one."""
    if checkpoint is None:
        return list(history)
    in_effect = _in_effect(history, (checkpoint, math.inf))
    return list(history if in_effect is None else history[history.index(in_effect) :])
