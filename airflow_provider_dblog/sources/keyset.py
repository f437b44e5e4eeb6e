"""The dump's keyset queries, built once for every source: a chunk's range or key list, the
greatest key, the split probe.

Keys are compared by the database (row-value comparison, in the key columns' collations) and
walked through the primary-key index, never by OFFSET over the rows. A dialect (`KeysetSql`'s
subclass in each source's package) spells the SQL its driver takes: how names are quoted, how
a key value travels (a parameter cast to its column's type, or a typed one), how a column is
selected so its value reads like the log's, and whether a bound on a row value also bounds
its first column alone (MySQL's range optimizer uses no row comparison; PostgreSQL's does).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from airflow_provider_dblog.core.dump_plan import Chunk
from airflow_provider_dblog.core.event import JsonValue, Key, TableRef
from airflow_provider_dblog.sources.base import SourceError


class NamedColumn(Protocol):
    """What the keyset queries need of a catalog's column: its name."""

    @property
    def name(self) -> str: ...


C = TypeVar("C", bound=NamedColumn)
Q = TypeVar("Q")
"""A dialect's SQL: psycopg's `sql.Composed` for PostgreSQL, text for MySQL."""


@dataclass(frozen=True, slots=True)
class TableShape(Generic[C]):
    """A table's columns as its catalog describes them, and its primary key."""

    table: TableRef
    columns: tuple[C, ...]
    """Every column in table order (as the log's row images list them)."""
    key: tuple[C, ...]
    """The primary-key columns in key order."""

    @property
    def key_columns(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.key)


class KeysetSql(ABC, Generic[Q, C]):
    """The keyset queries in one dialect's spelling. A subclass says how to spell SQL text,
    names, a key value's placeholder and parameter; the queries are built here."""

    bounds_first_column = False
    """A bound on a multi-column key also bounds its first column alone (`a >= x AND
    (a, b) > (x, y)`): the same rows, for a range optimizer that ignores row comparisons."""

    @abstractmethod
    def compose(self, template: str, *parts: Q) -> Q:
        """`template` with each `{}` replaced by one of `parts`."""

    @abstractmethod
    def join(self, parts: Sequence[Q], separator: str = ", ") -> Q: ...

    @abstractmethod
    def table(self, table: TableRef) -> Q:
        """The table's name, qualified and quoted."""

    @abstractmethod
    def name(self, column: C) -> Q:
        """The column's name, quoted."""

    @abstractmethod
    def number(self, value: int) -> Q:
        """An integer literal (a LIMIT, an OFFSET)."""

    @abstractmethod
    def placeholder(self, column: C) -> Q:
        """Where a key value of `column` goes, cast as its parameter needs."""

    @abstractmethod
    def param(self, column: C, value: JsonValue) -> Any:
        """A key value (as the converters give it) as the parameter its placeholder takes."""

    def selected(self, column: C) -> Q:
        """How a key column is selected so its converter reads its value as the log's."""
        return self.name(column)

    def names(self, columns: Sequence[C]) -> Q:
        return self.join([self.name(c) for c in columns])

    def max_key(self, shape: TableShape[C]) -> Q:
        """The greatest key's query (no parameters)."""
        descending = self.join([self.compose("{} DESC", self.name(c)) for c in shape.key])
        return self.compose(
            "SELECT {} FROM {} ORDER BY {} LIMIT 1",
            self.join([self.selected(c) for c in shape.key]),
            self.table(shape.table),
            descending,
        )

    def split_probe(
        self, shape: TableShape[C], after: Key | None, upto: Key, chunk_size: int
    ) -> tuple[Q, list[Any]]:
        """The query of the key of the `chunk_size`-th row after `after` (none beyond `upto`),
        and its parameters."""
        where, params = self.range(shape, after, upto)
        query = self.compose(
            "SELECT {} FROM {} WHERE {} ORDER BY {} LIMIT 1 OFFSET {}",
            self.join([self.selected(c) for c in shape.key]),
            self.table(shape.table),
            where,
            self.names(shape.key),
            self.number(chunk_size - 1),
        )
        return query, params

    @abstractmethod
    def condition(self, text: str) -> Q:
        """A filter's text (`Chunk.where`, checked by the source) as SQL among parameters."""

    def chunk(self, shape: TableShape[C], chunk: Chunk, columns: Q) -> tuple[Q, list[Any]]:
        """The query of `chunk`'s rows (`columns` selected) in key order, and its parameters:
        the rows of its key range or list, those matching its filter if it has one."""
        if chunk.keys is not None:
            where, params = self.in_keys(shape, chunk.keys)
        else:
            where, params = self.range(shape, chunk.after, chunk.upto)
        if chunk.where is not None:
            where = self.compose("{} AND ({})", where, self.condition(chunk.where))
        query = self.compose(
            "SELECT {} FROM {} WHERE {} ORDER BY {}",
            columns,
            self.table(shape.table),
            where,
            self.names(shape.key),
        )
        if chunk.limit is not None:
            query = self.compose("{} LIMIT {}", query, self.number(chunk.limit))
        return query, params

    def range(
        self, shape: TableShape[C], after: Key | None, upto: Key | None
    ) -> tuple[Q, list[Any]]:
        """`key > after AND key <= upto` as row comparisons (TRUE without bounds)."""
        conditions: list[Q] = []
        params: list[Any] = []
        columns = self.compose("({})", self.names(shape.key))
        first = self.name(shape.key[0])
        for op, loose, bound in ((">", ">=", after), ("<=", "<=", upto)):
            if bound is None:
                continue
            values, values_params = self._values(shape.key, bound)
            if self.bounds_first_column and len(shape.key) > 1:
                conditions.append(
                    self.compose("{} " + loose + " {}", first, self.placeholder(shape.key[0]))
                )
                params.append(values_params[0])
            conditions.append(self.compose("{} " + op + " {}", columns, values))
            params += values_params
        if not conditions:
            return self.compose("TRUE"), params
        return self.join(conditions, " AND "), params

    def in_keys(self, shape: TableShape[C], keys: Sequence[Key]) -> tuple[Q, list[Any]]:
        """`key IN (...)` of `keys` (FALSE for none)."""
        if not keys:
            return self.compose("FALSE"), []
        params: list[Any] = []
        tuples = []
        for key in keys:
            values, values_params = self._values(shape.key, key)
            tuples.append(values)
            params += values_params
        return self.compose("({}) IN ({})", self.names(shape.key), self.join(tuples)), params

    def _values(self, columns: Sequence[C], key: Key) -> tuple[Q, list[Any]]:
        """`(placeholder, ...)` of one key, and its values as parameters."""
        if len(key) != len(columns):
            raise SourceError(f"key {key!r} has {len(key)} values, the primary key {len(columns)}")
        placeholders = self.compose("({})", self.join([self.placeholder(c) for c in columns]))
        return placeholders, [self.param(c, v) for c, v in zip(columns, key, strict=True)]


def split_keys(
    keyset: KeysetSql[Q, C],
    shape: TableShape[C],
    after: Key | None,
    upto: Key,
    chunk_size: int,
    count: int,
    probe: Callable[[Q, list[Any]], Key | None],
    replica_probe: Callable[[Q, list[Any]], Key | None] | None = None,
) -> list[Key]:
    """`ChunkSource.split_keys`: keys at every `chunk_size`-th row after `after`, none beyond
    `upto`, at most `count`; `probe` runs one split probe on the source and returns the key it
    found.

    With `replica_probe` (a read replica) the probes, an index walk of `chunk_size` keys each,
    run there, sparing the primary. A split key is only a boundary, so one from a replica
    behind is as good as any; but a replica finding fewer keys than asked may lack the newest
    rows, and fewer keys plan the range's last, unbounded chunk: the primary goes on from there.
    """
    keys: list[Key] = []
    for run in (replica_probe, probe):
        if run is None:
            continue
        lower = keys[-1] if keys else after
        while len(keys) < count:
            found = run(*keyset.split_probe(shape, lower, upto, chunk_size))
            if found is None:
                break
            lower = found
            keys.append(lower)
    return keys
