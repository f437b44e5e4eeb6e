"""Log positions: `[commit, seq]`, strictly increasing in output order.

`commit` grows in commit order (PostgreSQL: the transaction's commit LSN; MySQL/MariaDB: binlog
file number << 32 | offset of the transaction's first event, which the binlog writes in commit
order too and which is known before the transaction's rows: see docs/architecture.md). `seq`
grows with the event's index inside its transaction (a source may leave gaps: PostgreSQL's
changes take odd seqs, so that a table's schema description fits before the change it
precedes); dump rows take the commit of their high watermark and indexes after it. A change's
own LSN is not enough: a transaction that commits later can hold changes with lower LSNs.
"""

from __future__ import annotations

from dataclasses import dataclass

_U64 = 1 << 64
_U32 = 1 << 32


@dataclass(frozen=True, order=True, slots=True)
class Position:
    commit: int
    seq: int

    def __post_init__(self) -> None:
        if not (0 <= self.commit < _U64) or self.seq < 0:
            raise ValueError(f"position out of range: [{self.commit}, {self.seq}]")

    def to_json(self) -> list[int]:
        return [self.commit, self.seq]

    @classmethod
    def from_json(cls, value: object) -> Position:
        if (
            not isinstance(value, list | tuple)
            or len(value) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)
        ):
            raise ValueError(f"a position is [commit, seq] of two integers, got {value!r}")
        return cls(value[0], value[1])


def parse_pg_lsn(text: str) -> int:
    """'16/B374D848' -> the LSN as an unsigned 64-bit integer."""
    high, sep, low = text.partition("/")
    if not sep:
        raise ValueError(f"not a PostgreSQL LSN: {text!r}")
    try:
        return (int(high, 16) << 32) | int(low, 16)
    except ValueError:
        raise ValueError(f"not a PostgreSQL LSN: {text!r}") from None


def format_pg_lsn(lsn: int) -> str:
    """The inverse of `parse_pg_lsn`, in PostgreSQL's own spelling."""
    if not 0 <= lsn < _U64:
        raise ValueError(f"LSN out of range: {lsn}")
    return f"{lsn >> 32:X}/{lsn & (_U32 - 1):X}"


def mysql_commit(file_number: int, offset: int) -> int:
    """Binlog coordinates as one integer that grows in commit order."""
    if not (0 <= file_number < _U32 and 0 <= offset < _U32):
        raise ValueError(f"binlog coordinates out of range: file {file_number}, offset {offset}")
    return (file_number << 32) | offset


def binlog_file_number(file_name: str) -> int:
    """'mysql-bin.000042' -> 42."""
    _, _, suffix = file_name.rpartition(".")
    if not suffix.isdigit():
        raise ValueError(f"not a binlog file name: {file_name!r}")
    return int(suffix)
