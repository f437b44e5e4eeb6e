"""A PostgreSQL target database's tables (the SQL-apply output's), read as this source's chunks
are: the reader `dblog verify` compares the source with (`verify.reader.TargetReader`).

The target table of a source table is `target_of` it (the output's `table_map`). Its rows are read
with the same keyset query and the same value loaders as a PostgreSQL dump, on a connection with
the session settings a source's has, so a row the output applied reads back as the JSON the
source gave it (same column types on both sides) and hashes equal.

A source of another database gives its `SourceValues` (`sources/mysql/target_rows.py`): then
each column is read as psycopg's Python value, cast as that source says, and converted by the
source's own converter of the column, so a row hashes as the source's JSON of it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, Protocol

import psycopg
from psycopg import sql
from psycopg.rows import TupleRow

from airflow_provider_dblog.core.dump_plan import Chunk
from airflow_provider_dblog.core.errors import InvalidRequest
from airflow_provider_dblog.core.event import JsonValue, Key, Row, TableRef
from airflow_provider_dblog.core.position import Position
from airflow_provider_dblog.core.verify import ChunkSum, RowsRead, applied_through, row_hashes
from airflow_provider_dblog.libpq_tls import tls_refusal
from airflow_provider_dblog.sources.base import SourceError, SourceUnavailable
from airflow_provider_dblog.sources.keyset import TableShape
from airflow_provider_dblog.sources.postgres.catalog import ColumnInfo, table_shape
from airflow_provider_dblog.sources.postgres.config import SESSION_OPTIONS
from airflow_provider_dblog.sources.postgres.keyset import KEYSET
from airflow_provider_dblog.sources.postgres.loaders import load_rows
from airflow_provider_dblog.sources.postgres.row_sums import sum_chunk


class SourceValues(Protocol):
    """How a source of another database reads a target column's values as its JSON."""

    def column(self, table: TableRef, name: str) -> tuple[str | None, Callable[[Any], JsonValue]]:
        """The type the target column `name` of source table `table` is read cast to (None:
        its own), and the converter of psycopg's value of it."""
        ...


class TargetRows:
    """`TargetReader` of a PostgreSQL target, on one autocommit connection opened at once."""

    def __init__(
        self,
        dsn: str,
        target_of: Callable[[TableRef], TableRef],
        *,
        connect_timeout: int = 10,
        values: SourceValues | None = None,
    ) -> None:
        self._target_of = target_of
        self._values = values
        self._shapes: dict[TableRef, TableShape[ColumnInfo]] = {}
        kwargs: dict[str, Any] = {"autocommit": True, "connect_timeout": connect_timeout}
        try:
            self._conn: psycopg.Connection[TupleRow] = psycopg.connect(
                dsn, options=SESSION_OPTIONS, **kwargs
            )
        except psycopg.OperationalError as exc:
            refused = tls_refusal(str(exc))
            if refused is not None:
                raise SourceError(f"cannot connect to the sql_apply target: {refused}") from None
            raise SourceUnavailable(f"cannot connect to the sql_apply target: {exc}") from None

    @property
    def name(self) -> str:
        return "the sql_apply output"

    def check_table(self, table: TableRef, key_columns: tuple[str, ...]) -> None:
        target = self._target_of(table)
        try:
            shape = self._shape(table)
        except SourceError as exc:
            raise InvalidRequest(
                f"{self.name} holds no table {target} for {table}: {exc}"
            ) from None
        if shape.key_columns != key_columns:
            raise InvalidRequest(
                f"{self.name}'s table {target} is keyed by ({', '.join(shape.key_columns)}), "
                f"{table} by ({', '.join(key_columns)}): give it the source's key to verify it"
            )

    def check_filter(self, table: TableRef, where: str) -> None:
        """The read of a chunk of the whole table with the filter, planned (EXPLAIN) and not
        run: a column or function the target table lacks fails its planning."""
        shape = self._shape(table)
        whole = Chunk(table, 0, where=where)
        query, params = KEYSET.chunk(shape, whole, KEYSET.names(shape.key))
        try:
            self._conn.execute(sql.Composed([sql.SQL("EXPLAIN "), query]), params)
        except psycopg.OperationalError as exc:
            raise SourceUnavailable(f"the sql_apply target went away: {exc}") from None
        except psycopg.Error as exc:
            target = self._target_of(table)
            message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise InvalidRequest(
                f"{self.name} cannot run the filter on {target}: {message}"
            ) from None

    def applied_through(self, hw: Position, checkpoint: int | None) -> bool:
        """The output applies the log in order and checkpoints what it applied."""
        return applied_through(checkpoint, hw)

    def hash_rows(
        self, table: TableRef, key_columns: tuple[str, ...], rows: Sequence[Row]
    ) -> dict[Key, str]:
        return row_hashes(rows, key_columns)

    def read_hashes(self, chunk: Chunk) -> dict[Key, str]:
        return self.read_rows(chunk).hashes

    def read_rows(self, chunk: Chunk) -> RowsRead:
        """Its rows are the source's JSON (`verify.reader.RowsTarget`): compared as rows."""
        shape = self._shape(chunk.table)
        try:
            rows = self._read(chunk, shape)
        except psycopg.OperationalError as exc:
            raise SourceUnavailable(f"the sql_apply target went away: {exc}") from None
        except psycopg.Error as exc:  # a filter the target's table cannot run, say
            target = self._target_of(chunk.table)
            raise SourceError(f"{self.name} refused the read of {target}: {exc}") from None
        return RowsRead(rows, shape.key_columns)

    def sum_rows(self, chunk: Chunk) -> ChunkSum | None:
        """The target's rows of `chunk` summed by the server as a PostgreSQL source sums its
        own (`verify.reader.SumsTarget`); None when they are read as another source's
        values."""
        if self._values is not None:
            return None
        shape = self._shape(chunk.table)
        try:
            return sum_chunk(self._conn, shape, replace(chunk, limit=None))
        except psycopg.OperationalError as exc:
            raise SourceUnavailable(f"the sql_apply target went away: {exc}") from None
        except psycopg.Error as exc:
            target = self._target_of(chunk.table)
            raise SourceError(f"{self.name} refused the read of {target}: {exc}") from None

    def _read(self, chunk: Chunk, shape: TableShape[ColumnInfo]) -> list[Row]:
        """The chunk's rows (its whole range: no limit), as this source's JSON."""
        whole = replace(chunk, limit=None)
        if self._values is None:
            query, params = KEYSET.chunk(shape, whole, KEYSET.names(shape.columns))
            return load_rows(self._conn.execute(query, params).pgresult, shape.columns)
        names = [c.name for c in shape.columns]
        reads = [self._values.column(chunk.table, name) for name in names]
        selected = sql.SQL(", ").join(
            sql.Identifier(name)
            if cast is None
            else sql.SQL("CAST({} AS {})").format(sql.Identifier(name), sql.SQL(cast))
            for name, (cast, _) in zip(names, reads, strict=True)
        )
        query, params = KEYSET.chunk(shape, whole, sql.Composed([selected]))
        converters = [convert for _, convert in reads]
        return [
            {
                name: convert(value)
                for name, convert, value in zip(names, converters, row, strict=True)
            }
            for row in self._conn.execute(query, params)
        ]

    def _shape(self, table: TableRef) -> TableShape[ColumnInfo]:
        """The target table's columns and key, read once: a verify run compares one shape."""
        shape = self._shapes.get(table)
        if shape is None:
            shape = self._shapes[table] = table_shape(self._conn, self._target_of(table))
        return shape

    def close(self) -> None:
        self._conn.close()
