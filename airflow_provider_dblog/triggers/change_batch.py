"""Batches of the change stream, as the change trigger fires them: pure, no Redis, no clock.

The trigger reads stream entries (`table`, `op`, `position` fields of the Redis Stream output)
and hands them to a `ChangeBatcher`. A batch closes when it holds `max_changes` entries, or
`max_wait_s` after its first *watched* change (a table and op the trigger watches), whichever
comes first; a batch with no watched change closes at once, so entries of other tables are
acknowledged without delay and never hold a watched change back. A closed batch is summarised
per watched table (`TableChanges`): counts by op and the first and last position. Those
summaries become the asset events' payloads.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_dblog.core.event import Op, TableRef
from airflow_provider_dblog.core.position import Position

OPS = frozenset(op.value for op in Op)
"""The ops a trigger can watch: c, u, d (log changes) and r (rows re-sent by a dump)."""


@dataclass(frozen=True, slots=True)
class StreamEntry:
    """One entry of a change stream: where it is (stream key, entry id) and what it says.
    `table` and `op` are None for an entry trimmed away before it was read (its id is still
    in the consumer group's pending list and must be acknowledged)."""

    stream: str
    entry_id: str
    table: str | None
    op: str | None
    position: Position | None

    @classmethod
    def from_fields(
        cls, stream: str, entry_id: str, fields: Mapping[str, str] | None
    ) -> StreamEntry:
        """An entry from its Redis fields as the Redis Stream output writes them; `fields` is
        None or empty for a trimmed entry."""
        if not fields:
            return cls(stream, entry_id, None, None, None)
        position = Position.from_json(json.loads(fields["position"]))
        return cls(stream, entry_id, fields["table"], fields["op"], position)


@dataclass(frozen=True, slots=True)
class TableChanges:
    """The changes of one watched table in one batch: the asset event's payload."""

    source: str
    table: str
    ops: dict[str, int]
    first_position: Position
    last_position: Position

    @property
    def count(self) -> int:
        return sum(self.ops.values())

    def to_payload(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "table": self.table,
            "ops": dict(sorted(self.ops.items())),
            "count": self.count,
            "first_position": self.first_position.to_json(),
            "last_position": self.last_position.to_json(),
        }


@dataclass(frozen=True)
class Watch:
    """What a trigger watches: tables of one source, and ops."""

    source: str
    tables: frozenset[str]
    ops: frozenset[str]

    @classmethod
    def of(cls, source: str, tables: Iterable[str], ops: Iterable[str]) -> Watch:
        """Checked: raises ValueError naming a malformed table, an unknown op, or nothing to
        watch."""
        names = frozenset(str(TableRef.parse(t)) for t in tables)
        wanted = frozenset(ops)
        if not source:
            raise ValueError("a change watch needs a source name")
        if not names:
            raise ValueError("a change watch needs at least one table")
        unknown = sorted(wanted - OPS)
        if unknown or not wanted:
            raise ValueError(
                f"ops must be some of {', '.join(sorted(OPS))}, got {', '.join(sorted(wanted))}"
            )
        return cls(source, names, wanted)

    def matches(self, entry: StreamEntry) -> bool:
        return entry.table in self.tables and entry.op in self.ops


@dataclass
class ChangeBatch:
    """Entries read together: every entry is acknowledged with the batch, whether or not it is
    watched. `watched` are the entries the trigger fires for, in stream order."""

    entries: list[StreamEntry] = field(default_factory=list)
    watched: list[StreamEntry] = field(default_factory=list)

    def ids_by_stream(self) -> dict[str, list[str]]:
        ids: dict[str, list[str]] = {}
        for entry in self.entries:
            ids.setdefault(entry.stream, []).append(entry.entry_id)
        return ids

    def summaries(self, source: str) -> list[TableChanges]:
        """One summary per watched table with changes here, in table-name order."""
        by_table: dict[str, list[StreamEntry]] = {}
        for entry in self.watched:
            assert entry.table is not None and entry.op is not None
            by_table.setdefault(entry.table, []).append(entry)
        summaries = []
        for table in sorted(by_table):
            entries = by_table[table]
            ops: dict[str, int] = {}
            for entry in entries:
                assert entry.op is not None
                ops[entry.op] = ops.get(entry.op, 0) + 1
            positions = [e.position for e in entries if e.position is not None]
            summaries.append(TableChanges(source, table, ops, min(positions), max(positions)))
        return summaries


class ChangeBatcher:
    """Collects entries into bounded batches. The caller reads at most `room()` entries at a
    time, adds them with the time it read them, and takes the batch once `due(now)`; between
    reads it blocks at most `wait_s(now)` (None: no batch is open, block as long as it likes).
    """

    def __init__(self, watch: Watch, max_changes: int, max_wait_s: float) -> None:
        if max_changes < 1:
            raise ValueError(f"max_changes must be at least 1, got {max_changes}")
        if max_wait_s < 0:
            raise ValueError(f"max_wait_s must not be negative, got {max_wait_s}")
        self.watch = watch
        self.max_changes = max_changes
        self.max_wait_s = max_wait_s
        self._batch = ChangeBatch()
        self._deadline: float | None = None

    def room(self) -> int:
        return self.max_changes - len(self._batch.entries)

    def add(self, entries: Sequence[StreamEntry], now: float) -> None:
        if len(entries) > self.room():
            raise ValueError(f"{len(entries)} entries do not fit: room for {self.room()}")
        for entry in entries:
            self._batch.entries.append(entry)
            if self.watch.matches(entry):
                self._batch.watched.append(entry)
                if self._deadline is None:
                    self._deadline = now + self.max_wait_s

    def due(self, now: float) -> bool:
        if not self._batch.entries:
            return False
        if self._deadline is None or self.room() == 0:
            return True
        return now >= self._deadline

    def wait_s(self, now: float) -> float | None:
        """How long the next read may block: until the open batch's deadline."""
        if self._deadline is None:
            return None
        return max(0.0, self._deadline - now)

    def take(self) -> ChangeBatch:
        batch, self._batch, self._deadline = self._batch, ChangeBatch(), None
        return batch
