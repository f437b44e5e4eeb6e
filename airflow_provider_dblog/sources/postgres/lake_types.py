"""PostgreSQL's types in the lake (`sources/lake_types.py`), from `format_type`'s spelling: the
PostgreSQL rows of the table in `lake/schema.py`'s docstring. Imported only where a lake is
written (pyarrow)."""

from __future__ import annotations

import re

import pyarrow as pa

from airflow_provider_dblog.sources.lake_types import STRING, TIMESTAMPTZ, LakeType, decimal

_SCALARS: dict[str, LakeType] = {
    "smallint": (pa.int16(), "int"),
    "integer": (pa.int32(), "int"),
    "bigint": (pa.int64(), "int"),
    "oid": (pa.int64(), "int"),
    "boolean": (pa.bool_(), "bool"),
    "real": (pa.float32(), "float"),
    "double precision": (pa.float64(), "float"),
    "bytea": (pa.binary(), "binary"),
    "json": (pa.string(), "json"),
    "jsonb": (pa.string(), "json"),
    "date": (pa.date32(), "date"),
}
_NUMERIC = re.compile(r"numeric\((\d+)(?:,(\d+))?\)")
_TIMESTAMP = re.compile(r"timestamp(?:\(\d\))? with(out)? time zone")


def lake_type(sql_type: str) -> LakeType:
    text = sql_type.strip()
    if text.endswith("[]"):
        element, kind = lake_type(text[:-2])
        return pa.list_(element), "list:" + kind
    if text in _SCALARS:
        return _SCALARS[text]
    numeric = _NUMERIC.fullmatch(text)
    if numeric:
        return decimal(int(numeric.group(1)), int(numeric.group(2) or 0))
    timestamp = _TIMESTAMP.fullmatch(text)
    if timestamp:
        return (pa.timestamp("us"), "timestamp") if timestamp.group(1) else TIMESTAMPTZ
    return STRING
