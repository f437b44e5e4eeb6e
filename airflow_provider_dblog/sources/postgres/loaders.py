"""A chunk's result turned into rows by psycopg's loaders, each column by its converter.

The chunk query returns the text PostgreSQL's output functions print, as the log's values are.
Converting it value by value in Python cost five times the query itself, so each column gets a
psycopg loader, chosen once per chunk from the type OID the catalog gives the column (the OID
pgoutput reports, not the result's, which names a domain's base type): psycopg's compiled
loaders where they give exactly what the converter gives (integers, booleans, and every type
whose JSON is its text), a loader calling the converter for the others (floats, bytea, json,
arrays). The rows are then built in one pass over the result, in psycopg's C code.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat
from typing import Any

from psycopg import abc, pq
from psycopg.abc import AdaptContext, Buffer
from psycopg.adapt import AdaptersMap, Loader, Transformer
from psycopg.pq.abc import PGresult
from psycopg.types.bool import BoolLoader
from psycopg.types.numeric import IntLoader
from psycopg.types.string import TextLoader

from airflow_provider_dblog.core.event import JsonValue, Row
from airflow_provider_dblog.sources.postgres.catalog import ColumnInfo
from airflow_provider_dblog.sources.postgres.converters import (
    BOOL,
    INT2,
    INT4,
    INT8,
    OID,
    column_converter,
    keeps_text,
)

_ANY_TYPE = 0
"""The OID under which psycopg looks for the loader of a type it has none registered for."""

_COMPILED: dict[int, type[Loader]] = {
    INT2: IntLoader,
    INT4: IntLoader,
    INT8: IntLoader,
    OID: IntLoader,
    BOOL: BoolLoader,
}
"""Types whose converter psycopg's compiled loader matches: `int(text)`, `text == "t"`."""


class _Converting(Loader):
    """The converter of the loader's type, on the value's UTF-8 text."""

    def __init__(self, oid: int, context: AdaptContext | None = None) -> None:
        super().__init__(oid, context)
        self._convert = column_converter(oid)

    def load(self, data: Buffer) -> JsonValue:
        return self._convert(str(data, "utf-8"))


def column_loaders(type_oids: Sequence[int]) -> abc.Transformer:
    """A psycopg transformer that loads text values of columns of types `type_oids` (in that
    order) as `convert` converts them; a NULL stays None."""
    adapters = AdaptersMap()
    # Without a connection psycopg decodes text as UTF-8, the session's client_encoding.
    adapters.register_loader(_ANY_TYPE, TextLoader)
    for oid in set(type_oids):
        if oid in _COMPILED:
            adapters.register_loader(oid, _COMPILED[oid])
        elif not keeps_text(oid):
            adapters.register_loader(oid, _Converting)
    transformer = Transformer(adapters)
    transformer.set_loader_types(type_oids, pq.Format.TEXT)
    return transformer


def load_rows(result: PGresult | None, columns: Sequence[ColumnInfo]) -> list[Row]:
    """Every row of a text `result` whose columns are `columns`, as a dict from each column's
    name to its value as the converters give it."""
    if result is None:
        return []
    if result.nfields != len(columns):
        raise ValueError(f"a result of {result.nfields} columns, not {len(columns)}")
    transformer = column_loaders([c.type_oid for c in columns])
    transformer.set_pgresult(result, set_loaders=False)
    names = tuple(c.name for c in columns)
    # Each row as a tuple, then each tuple a dict in C's loops: no Python call a row.
    values: list[tuple[Any, ...]] = transformer.load_rows(0, result.ntuples, tuple)
    return list(map(dict, map(zip, repeat(names), values)))
