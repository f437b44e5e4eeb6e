"""Events handed over as their lines (each with its newline) joined in one bytes.

The tailer's thread handles such lines as one item, and the NDJSON output writes their bytes as
they are: nothing a line between the reader and the file. Three kinds: a page of a dump chunk's
rows (`core.encoded_rows.PageLines`), a run of one transaction's changes a log reader read
together (`LogLines`), and the runs of transactions it read one after another (`LogRuns`). An
output that takes events gets one a line (`events`).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import chain, repeat
from typing import Self

from airflow_provider_dblog.core.event import (
    EncodedLogEvent,
    Event,
    LogOrigin,
    Op,
    Row,
    RowsInLineLogEvent,
    TableRef,
)
from airflow_provider_dblog.core.position import Position


class Lines:
    """Events at increasing positions, one line each, in order, in `data`. Not an `ABC`: the
    writer and the outputs ask `isinstance(item, Lines)` of every item they get, which for an
    `ABC` is a Python-level call."""

    __slots__ = ()

    data: bytes

    @abstractmethod
    def events(self) -> list[Event]:
        """One event a line."""

    @abstractmethod
    def __len__(self) -> int: ...

    @property
    @abstractmethod
    def first_position(self) -> Position: ...

    @property
    @abstractmethod
    def last_position(self) -> Position: ...

    @abstractmethod
    def after(self, position: Position) -> Self | None:
        """The lines positioned after `position` (a replay's end), None if none is."""

    @abstractmethod
    def cut(self, size: int) -> tuple[Self, Self | None]:
        """The first lines that fit in `size` bytes (at least one) and the rest (None if
        every line fits)."""


class SeqLines(Lines):
    """Seqs `first` to `last` of one commit, `step` apart."""

    __slots__ = ()

    first: int
    last: int
    step: int = 1

    @abstractmethod
    def _part(self, first: int, last: int, data: bytes) -> Self:
        """The run of seqs `first` to `last` of these, whose lines are `data`."""

    def __len__(self) -> int:
        return (self.last - self.first) // self.step + 1

    def after(self, position: Position) -> Self | None:
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
class LogLines(SeqLines):
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
    change, as `keys`. With `rows_in_lines`, both are None and each event reads its rows back
    from its line when asked (`RowsInLineLogEvent`): a reader that spelled them need not keep
    them, and the writer need not free them. Nothing changes one once built; not a frozen
    dataclass, whose `__init__` costs several times as much, as one is built for every rows
    event, most of one row."""

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
    rows_in_lines: bool = False

    @property
    def first_position(self) -> Position:
        return Position.trusted(self.commit, self.first)  # a reader's, in range

    @property
    def last_position(self) -> Position:
        return Position.trusted(self.commit, self.last)

    def events(self) -> list[Event]:
        lines = self.data.splitlines(keepends=True)  # JSON escapes every CR and LF it holds
        count = len(lines)
        ops = repeat(self.op, count) if self.ops is None else self.ops
        seqs = range(self.first, self.last + 1, self.step)
        positions = map(Position, repeat(self.commit, count), seqs)
        origins = repeat(self.origin, count) if self.tables is None else self._origins()
        versions = repeat(self.schema_version, count) if self.versions is None else self.versions
        if self.rows_in_lines:
            return list(
                map(RowsInLineLogEvent, lines, ops, self.keys, positions, origins, versions)
            )
        return list(
            map(
                EncodedLogEvent,
                lines,
                ops,
                self.keys,
                repeat(None, count) if self.befores is None else self.befores,
                repeat(None, count) if self.afters is None else self.afters,
                positions,
                origins,
                versions,
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
            self.rows_in_lines,
        )


@dataclass(slots=True)
class LogRuns(Lines):
    """The runs of changes (`LogLines`) of whole transactions a log reader read one after
    another, in log order, and `data`, their lines joined: the tailer looks at their keys,
    hands them over and writes them once for all, so a load of small transactions costs it
    about what one large transaction does. `changes` is how many lines there are; `counts`,
    when the reader counted them, how many are of each (schema, table, operation). Not empty;
    the reader follows it with the last transaction's end."""

    runs: Sequence[LogLines]
    data: bytes
    changes: int
    counts: Mapping[tuple[str, str, Op], int] | None = None

    @classmethod
    def of(cls, runs: Sequence[LogLines]) -> LogRuns:
        return cls(runs, b"".join(run.data for run in runs), sum(len(run.keys) for run in runs))

    def __len__(self) -> int:
        return self.changes

    @property
    def first_position(self) -> Position:
        return self.runs[0].first_position

    @property
    def last_position(self) -> Position:
        return self.runs[-1].last_position

    def events(self) -> list[Event]:
        return list(chain.from_iterable(run.events() for run in self.runs))

    def after(self, position: Position) -> LogRuns | None:
        for index, run in enumerate(self.runs):
            rest = run.after(position)
            if rest is run and index == 0:
                return self
            if rest is not None:
                return LogRuns.of([rest, *self.runs[index + 1 :]])
        return None

    def cut(self, size: int) -> tuple[LogRuns, LogRuns | None]:
        if len(self.data) <= size:
            return self, None
        runs, index, used = self.runs, 0, 0
        while used + len(runs[index].data) <= size:  # the run in which `size` falls
            used += len(runs[index].data)
            index += 1
        fits, rest = runs[index].cut(size - used)
        if index and (rest is None or len(fits.data) > size - used):
            head, tail = runs[:index], runs[index:]  # not even its first line fits: cut before
        else:
            head = [*runs[:index], fits]
            tail = [*([] if rest is None else [rest]), *runs[index + 1 :]]
        return LogRuns.of(head), LogRuns.of(tail) if tail else None
