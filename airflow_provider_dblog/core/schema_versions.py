"""The rule that numbers a table's schemas: `schema_version` grows by one per real change.

A log reader describes a table's columns whenever it learns they may have changed (pgoutput
resends a Relation message on every new stream and after every ALTER; MySQL has its DDL). The
tailer keeps, per table, the description it last emitted with its version and log position
(`KnownSchema`, persisted in the state store once the schema event is durable), and
`SchemaTracker` decides which descriptions are changes worth a schema event.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
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

    `known` is what the store kept: schema events that were made durable. A description at or
    before a known position is a replay of log already emitted (the tailer restarted from an
    older checkpoint) and changes nothing; a later one whose columns (`TableSchema.signature`)
    differ from the known ones is a change, which takes the next version. Comparing only what
    the log itself says keeps a replay's decisions those of the first reading, whatever the
    catalog says by then.
    """

    def __init__(self, known: Iterable[KnownSchema] = ()) -> None:
        self._known: dict[TableRef, KnownSchema] = {k.table: k for k in known}
        self._versions: dict[TableRef, int] = {k.table: k.version for k in self._known.values()}

    @property
    def versions(self) -> Mapping[TableRef, int]:
        """Each described table's current version, kept current as `observe` finds changes:
        a log reader that builds row events with them is handed this (see
        `sources.base.StampsSchemaVersions`)."""
        return self._versions

    def version(self, table: TableRef) -> int:
        """The table's current version; 0 before any description of it."""
        known = self._known.get(table)
        return 0 if known is None else known.version

    def schema(self, table: TableRef) -> TableSchema | None:
        known = self._known.get(table)
        return None if known is None else known.schema

    def observe(
        self, table: TableRef, schema: TableSchema, position: Position
    ) -> KnownSchema | None:
        """The schema to emit at `position`, if `schema` changes the table's; None otherwise."""
        known = self._known.get(table)
        if known is not None and (
            position <= known.position or schema.signature == known.schema.signature
        ):
            return None
        change = KnownSchema(table, 1 if known is None else known.version + 1, schema, position)
        self._known[table] = change
        self._versions[table] = change.version
        return change
