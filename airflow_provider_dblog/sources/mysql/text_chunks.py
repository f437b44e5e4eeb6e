"""MySQL's chunk read as text columns (`sources/text_chunks.py`): each column of an undecoded
result (`text_values.py`) in one Arrow array, text as strings and binary values as bytes.

Imported only where a lake is written (pyarrow).
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import itemgetter
from typing import Any

import pyarrow as pa

from airflow_provider_dblog.sources.mysql.text_values import TextReader
from airflow_provider_dblog.sources.text_chunks import TextColumn


def text_columns(
    raw: Sequence[Sequence[Any]], readers: Sequence[TextReader]
) -> tuple[TextColumn, ...]:
    return tuple(
        TextColumn(r.name, _array(list(map(itemgetter(r.at), raw))), r.kind, r.convert)
        for r in readers
    )


def _array(values: list[Any]) -> pa.Array:
    """Strings, or bytes for a binary column (Arrow's inference tells them apart); a column of
    NULLs alone as strings."""
    array = pa.array(values)
    return array.cast(pa.string()) if pa.types.is_null(array.type) else array
