"""Where a chunk read's snapshot lies in the log: what both ways of reading a chunk (rows,
`sources.base.ChunkRead`, and text columns, `sources.text_chunks.ChunkText`) carry. Importable
from `sources.base` too."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ReadSnapshot:
    """Where a chunk read's snapshot lies in the log, for read-only windows (see
    `sources.base.ChunkRows`): every transaction the read saw commits below `hw`
    (PostgreSQL: the WAL insert position read after the snapshot was taken; MariaDB: the
    binlog position of the snapshot); when `exact`, the read saw every transaction that
    commits below `hw` too (MariaDB's). PostgreSQL names the transactions it did not see
    instead."""

    hw: int
    exact: bool
