"""Binlog records: what the transport (`binlog.py`) hands the mapper (`changes.py`), one for
each binlog event that matters to DBLog.

A record carries what the mapper needs and nothing of the wire: a transaction's `commit` is
already its binlog file number << 32 | its first event's offset (`coordinates.py`), and a rows
event stays its bytes, read by the row decoder compiled for its table map (`rows.py`). So the
mapping is tested on records built by hand.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import NamedTuple

from airflow_provider_dblog.sources.mysql.events import RowsHead, TableMap


class RowKind(Enum):
    INSERT = "insert"
    UPDATE = "update"
    DELETE = "delete"


@dataclass(frozen=True, slots=True)
class Begin:
    """A transaction's first event. `commit` is its file number << 32 | its offset.

    `standalone` is MariaDB's GTID flag for a group of one statement without BEGIN/COMMIT
    (DDL); None where the server does not say (MySQL): then a first query that is not BEGIN
    makes the group standalone."""

    commit: int
    ts_ms: int
    gtid: str | None = None
    txid: int | None = None
    standalone: bool | None = None


class Rows(NamedTuple):
    """One rows event as its bytes: its row images lie in `data` from `head.start` to `end`
    (before the checksum), each read by the reader compiled for its table map. A named tuple,
    as `RowsHead` is: one is made per rows event."""

    kind: RowKind
    head: RowsHead
    data: bytes
    end: int


@dataclass(frozen=True, slots=True)
class Query:
    """A QUERY event. `commit` is computed as for `Begin`, for a statement that starts a group
    of its own (BEGIN without GTIDs, or DDL)."""

    commit: int
    ts_ms: int
    schema: str
    sql: str


@dataclass(frozen=True, slots=True)
class Xid:
    """A transactional group committed."""


@dataclass(frozen=True, slots=True)
class LogEnd:
    """A heartbeat: the server has sent everything up to `end` (file number << 32 | offset)."""

    end: int


BinlogRecord = Begin | TableMap | Rows | Query | Xid | LogEnd
