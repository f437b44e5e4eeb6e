"""A database type as the whole house asks for it: one `Dialect` per source type, in its
package (`sources/<db>/dialect.py`), handed out by `sources.factory` by `[source] type`.

What differs between databases is asked of the dialect or of what it opens, never decided by
a caller testing a class (as Airflow's common.sql keeps each database's dialect apart):
- the configuration: `parse` reads the `[source]` section;
- the `Source` (`open`): the log, chunks, setup, the catalog's description of a table
  (`Source.describe`); its `ChunkSource` reads a chunk as rows or as text columns
  (`read_chunk_text`), with the keyset SQL of `sources/keyset.py` spelled its own way;
- the lake's type of each catalog type name (`lake_type`), which a lake table reopened from
  its files asks by the source type it recorded.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from airflow_provider_dblog.sources.base import Source, SourceConfig

if TYPE_CHECKING:
    from airflow_provider_dblog.sources.lake_types import LakeType

C = TypeVar("C", bound=SourceConfig)


@dataclass(frozen=True, slots=True)
class Dialect(Generic[C]):
    """One kind of database."""

    type: str
    """Its `[source] type`."""
    parse: Callable[[Mapping[str, Any]], C]
    """Its `[source]` section parsed and checked; `SourceError` naming what is wrong."""
    open: Callable[[C], Source]
    """Its `Source`, built from its configuration; connects to nothing."""
    lake_type: Callable[[str], LakeType]
    """The lake's type of a column, from the catalog's type name (as schema events spell it).
    Loads pyarrow: asked only where a lake is written."""
