"""PostgreSQL's chunk read as text columns (`sources/text_chunks.py`): the text the server
prints for each value, taken from the query's result column by column into Arrow arrays. Each
column's `TextKind` and converter come from its type OID.

Imported only where a lake is written (pyarrow).
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
from psycopg.pq.abc import PGresult

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
from airflow_provider_dblog.sources.text_chunks import TextColumn, TextKind

_INTEGERS = frozenset({INT2, INT4, INT8, OID})


def text_kind(type_oid: int) -> TextKind:
    if type_oid in _INTEGERS:
        return TextKind.INT
    if type_oid == BOOL:
        return TextKind.BOOL
    return TextKind.TEXT if keeps_text(type_oid) else TextKind.OTHER


def text_columns(result: PGresult | None, columns: Sequence[ColumnInfo]) -> tuple[TextColumn, ...]:
    """The text result of a query whose columns are `columns`, column by column: each value's
    bytes straight into an Arrow string array (UTF-8, the client encoding the source's
    connections set)."""
    if result is None:
        return tuple(_column(info, pa.array([], pa.string())) for info in columns)
    get, rows = result.get_value, range(result.ntuples)
    return tuple(
        _column(info, pa.array([get(r, i) for r in rows], pa.string()))
        for i, info in enumerate(columns)
    )


def _column(info: ColumnInfo, text: pa.Array) -> TextColumn:
    return TextColumn(info.name, text, text_kind(info.type_oid), column_converter(info.type_oid))
