"""A chunk read as columns of the server's text, for a target that takes columns (the lake):
each column's values as the server printed them, in one Arrow array, with no Python object
per row. Each column comes with what its text is to the converters (`TextKind`) and its
converter, so the target turns it into its own type exactly as it turns the converters'
values (`lake.schema.LakeSchema.values_from_text`). Every source's `ChunkSource.read_chunk_text`
gives one (`sources/<db>/text_chunks.py` makes the columns).

Loads no pyarrow itself (only its readers make arrays): pyarrow costs a process that never
writes a lake about 80 MiB.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any

from airflow_provider_dblog.core.event import JsonValue, Key, freeze
from airflow_provider_dblog.sources.snapshot import ReadSnapshot

if TYPE_CHECKING:
    import pyarrow as pa


class TextKind(Enum):
    """What a column's text is to the converters, so a target may take it without them."""

    TEXT = "text"
    """The converter's value is the text itself."""
    INT = "int"
    """The converter's value is `int(text)`."""
    BOOL = "bool"
    """The converter's value is `text == "t"`."""
    OTHER = "other"
    """Anything else: only the converter says."""


@dataclass(frozen=True)
class TextColumn:
    """One column of a chunk: the server's text of each value (null for NULL; the bytes of a
    value of a binary column where the server sends no text)."""

    name: str
    text: pa.Array
    kind: TextKind
    convert: Callable[[Any], JsonValue]
    """The converter of its non-NULL values: from an element of `text` to the JSON value the
    log gives for it."""


@dataclass(frozen=True)
class ChunkText:
    """A chunk read as text columns, in key order, and what the dump needs of the read."""

    columns: tuple[TextColumn, ...]
    rows: int
    last_key: Key | None
    invisible_txids: frozenset[int]
    snapshot: ReadSnapshot | None = None


def last_key(columns: Sequence[TextColumn], key: Sequence[str]) -> Key | None:
    """The key of the last row, as `key_of` gives it from the converters' row."""
    by_name = {c.name: c for c in columns}
    found = []
    for name in key:
        column = by_name[name]
        if len(column.text) == 0:
            return None
        text = column.text[-1].as_py()
        found.append(freeze(None if text is None else column.convert(text)))
    return tuple(found)
