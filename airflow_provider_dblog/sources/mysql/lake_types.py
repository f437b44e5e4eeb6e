"""MySQL's types in the lake (`sources/lake_types.py`), from COLUMN_TYPE's spelling: the MySQL
rows of the table in `lake/schema.py`'s docstring (unsigned integers one size wider). Imported
only where a lake is written (pyarrow)."""

from __future__ import annotations

import re

import pyarrow as pa

from airflow_provider_dblog.sources.lake_types import STRING, TIMESTAMPTZ, LakeType, decimal

_INTS = {
    "tinyint": (pa.int8(), pa.int16()),
    "smallint": (pa.int16(), pa.int32()),
    "mediumint": (pa.int32(), pa.int32()),
    "int": (pa.int32(), pa.int64()),
    "integer": (pa.int32(), pa.int64()),
}
_BINARY = ("binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob")
_TYPE = re.compile(r"([a-z]+)(?:\(([^)]*)\))?(.*)")


def lake_type(sql_type: str) -> LakeType:
    match = _TYPE.fullmatch(sql_type.strip().lower())
    if match is None:
        return STRING
    base, args, rest = match.group(1), match.group(2) or "", match.group(3)
    unsigned = "unsigned" in rest
    if base in _INTS:
        return _INTS[base][unsigned], "int"
    if base == "bigint":
        return (pa.decimal128(20, 0), "decimal") if unsigned else (pa.int64(), "int")
    if base in ("decimal", "numeric"):
        precision, _, scale = args.partition(",")
        return decimal(int(precision or 10), int(scale or 0))
    if base == "float":
        return pa.float32(), "float"
    if base in ("double", "real"):
        return pa.float64(), "float"
    if base in _BINARY:
        return pa.binary(), "binary"
    if base == "date":
        return pa.date32(), "date"
    if base == "datetime":
        return pa.timestamp("us"), "timestamp"
    if base == "timestamp":
        return TIMESTAMPTZ
    if base == "year":
        return pa.int16(), "int"
    if base == "bit":
        return (pa.decimal128(20, 0), "decimal") if args == "64" else (pa.int64(), "int")
    if base == "json":
        return pa.string(), "json"
    return STRING
