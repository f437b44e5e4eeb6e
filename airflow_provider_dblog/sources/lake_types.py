"""The lake's column types, as each source's dialect maps its catalog's type names to them
(`Dialect.lake_type`; the table of them is `lake/schema.py`'s docstring). They live with the
dialects that name them, so the lake asks a source's dialect and no source imports the lake.

A `LakeType` is the column's Arrow type and its kind, the name of the function that turns the
converters' JSON values into Arrow's (`lake.schema.converter`): `int`, `bool`, `float`,
`decimal`, `string`, `json`, `binary`, `date`, `timestamp`, `timestamptz`, or `list:<kind>`.
"""

from __future__ import annotations

import pyarrow as pa

LakeType = tuple[pa.DataType, str]

MAX_DECIMAL_PRECISION = 38
"""Delta's (and decimal128's) widest decimal."""

STRING: LakeType = (pa.string(), "string")
TIMESTAMPTZ: LakeType = (pa.timestamp("us", tz="UTC"), "timestamptz")


def decimal(precision: int, scale: int) -> LakeType:
    """decimal(p, s), or text where the lake has no decimal that wide."""
    if precision > MAX_DECIMAL_PRECISION:
        return STRING
    return pa.decimal128(precision, scale), "decimal"
