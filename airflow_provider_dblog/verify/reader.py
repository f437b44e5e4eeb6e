"""What a target must answer to be verified: its rows of a key range (or key list) of a table,
as canonical row hashes by key (`core.verify.row_hash`). A target that keeps rows by key (a SQL
database, a lake, a search index) implements it; a remote one can ship hashes, not rows."""

from __future__ import annotations

from typing import Protocol

from airflow_provider_dblog.core.dump_plan import Chunk
from airflow_provider_dblog.core.event import Key, TableRef


class TargetReader(Protocol):
    """A verified target, opened from a deployment's configuration (`verify/targets.py`)."""

    @property
    def name(self) -> str:
        """How a report and an error name the target."""
        ...

    def check_table(self, table: TableRef, key_columns: tuple[str, ...]) -> None:
        """Refuse (`InvalidRequest`, one line) a source table the target does not hold, or
        holds keyed otherwise than by `key_columns`, the source's key in its order."""
        ...

    def read_hashes(self, chunk: Chunk) -> dict[Key, str]:
        """The target's rows of `chunk` (its key range or key list, and its filter; the
        chunk's table is the source table), each row's hash by its key."""
        ...

    def close(self) -> None: ...
