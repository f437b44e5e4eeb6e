"""Events handed over as their lines: a run of one commit's events at evenly spaced seqs,
their lines (each with its newline) joined in one bytes.

The tailer's thread handles such a run as one item, and the NDJSON output writes its bytes as
they are: nothing a line between the reader and the file. Two kinds: a page of a dump chunk's
rows (`core.encoded_rows.PageLines`) and a run of one transaction's changes a log reader read
together (`LogLines`). An output that takes events gets one a line (`events`).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Self

from airflow_provider_dblog.core.event import EncodedLogEvent, Event, LogOrigin, Op, Row, TableRef
from airflow_provider_dblog.core.position import Position


class Lines:
    """Seqs `first` to `last` of one commit, `step` apart, one line each, in order, in `data`.
    Not an `ABC`: the writer and the outputs ask `isinstance(item, Lines)` of every item they
    get, which for an `ABC` is a Python-level call."""

    __slots__ = ()

    first: int
    last: int
    data: bytes
    step: int = 1

    @abstractmethod
    def events(self) -> list[Event]:
        """One event a line."""

    @abstractmethod
    def _part(self, first: int, last: int, data: bytes) -> Self:
        """The run of seqs `first` to `last` of these, whose lines are `data`."""

    def __len__(self) -> int:
        return (self.last - self.first) // self.step + 1

    @property
    @abstractmethod
    def first_position(self) -> Position: ...

    @property
    @abstractmethod
    def last_position(self) -> Position: ...

    def after(self, position: Position) -> Self | None:
        """The lines positioned after `position` (a replay's end), None if none is."""
        commit, seq, own = position.commit, position.seq, self.first_position.commit
        if commit != own:
            return self if commit < own else None
        if seq < self.first:
            return self
        if seq >= self.last:
            return None
        skipped = (seq - self.first) // self.step + 1
        rest = self.data.split(b"\n", skipped)[-1]
        return self._part(self.first + skipped * self.step, self.last, rest)

    def cut(self, size: int) -> tuple[Self, Self | None]:
        """The first lines that fit in `size` bytes (at least one) and the rest (None if
        every line fits)."""
        if len(self.data) <= size:
            return self, None
        end = self.data.rfind(b"\n", 0, size) + 1 or self.data.find(b"\n") + 1
        if end == len(self.data):
            return self, None
        split = self.first + self.data.count(b"\n", 0, end) * self.step
        return (
            self._part(self.first, split - self.step, self.data[:end]),
            self._part(split, self.last, self.data[end:]),
        )


@dataclass(slots=True)
class LogLines(Lines):
    """The changes a log reader read together in one transaction (a binlog rows event's rows,
    of one table; a run of a pgoutput transaction's changes), at seqs `first` to `last` of
    `commit`, `step` apart, with their lines as `event_codec.log_line_format` spells them. A
    log item (`core.log`): the tailer hands it to the reconciler (every row's key) and to the
    writer as one, and builds no object a row.

    Every change is an `op`, unless `ops` names each one's; every change is of `origin`'s
    table at `schema_version`, unless `tables` and `versions` name each one's (a run over
    several tables of one transaction: `origin` is the first's, and each table's is
    `origin.for_table`, built only for `events`). `befores` is None where no change has a row
    before it (creates), `afters` where none has one after (deletes); else one row or None a
    change, as `keys`. Nothing changes one once built; not a frozen dataclass, whose
    `__init__` costs several times as much, as one is built for every rows event, most of one
    row."""

    origin: LogOrigin
    schema_version: int
    op: Op
    commit: int
    first: int
    last: int
    keys: Sequence[Row]
    befores: Sequence[Row | None] | None
    afters: Sequence[Row | None] | None
    data: bytes
    ops: Sequence[Op] | None = None
    step: int = 1
    tables: Sequence[TableRef] | None = None
    versions: Sequence[int] | None = None

    @property
    def first_position(self) -> Position:
        return Position.trusted(self.commit, self.first)  # a reader's, in range

    @property
    def last_position(self) -> Position:
        return Position.trusted(self.commit, self.last)

    def events(self) -> list[Event]:
        lines = self.data.splitlines(keepends=True)  # JSON escapes every CR and LF it holds
        count = len(lines)
        return list(
            map(
                EncodedLogEvent,
                lines,
                repeat(self.op, count) if self.ops is None else self.ops,
                self.keys,
                repeat(None, count) if self.befores is None else self.befores,
                repeat(None, count) if self.afters is None else self.afters,
                map(
                    Position,
                    repeat(self.commit, count),
                    range(self.first, self.last + 1, self.step),
                ),
                repeat(self.origin, count) if self.tables is None else self._origins(),
                repeat(self.schema_version, count) if self.versions is None else self.versions,
            )
        )

    def _origins(self) -> list[LogOrigin]:
        """Each change's origin, one made a table (`tables` is not None)."""
        assert self.tables is not None
        made = {self.origin.table: self.origin}
        for table in self.tables:
            if table not in made:
                made[table] = self.origin.for_table(table)
        return [made[table] for table in self.tables]

    def _part(self, first: int, last: int, data: bytes) -> LogLines:
        start, stop = (first - self.first) // self.step, (last - self.first) // self.step + 1
        befores, afters, ops = self.befores, self.afters, self.ops
        tables, versions = self.tables, self.versions
        return LogLines(
            self.origin if tables is None else self.origin.for_table(tables[start]),
            self.schema_version if versions is None else versions[start],
            self.op if ops is None else ops[start],
            self.commit,
            first,
            last,
            self.keys[start:stop],
            None if befores is None else befores[start:stop],
            None if afters is None else afters[start:stop],
            data,
            None if ops is None else ops[start:stop],
            self.step,
            None if tables is None else tables[start:stop],
            None if versions is None else versions[start:stop],
        )
