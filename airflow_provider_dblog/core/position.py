"""Log positions: `[commit, seq]`, strictly increasing in output order.

`commit` grows in commit order (PostgreSQL: the transaction's commit LSN; MySQL/MariaDB: binlog
file number << 32 | offset of the transaction's first event, which the binlog writes in commit
order too and which is known before the transaction's rows: see docs/architecture.md). `seq`
grows with the event's index inside its transaction (a source may leave gaps: PostgreSQL's
changes take odd seqs, so that a table's schema description fits before the change it
precedes); dump rows take the commit of their high watermark and indexes after it. A change's
own LSN is not enough: a transaction that commits later can hold changes with lower LSNs.
The sources spell their own coordinates: `sources/postgres/lsn.py`, `sources/mysql/coordinates.py`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

_U64 = 1 << 64


@dataclass(frozen=True, order=True, slots=True)
class Position:
    commit: int
    seq: int

    def __post_init__(self) -> None:
        if not (0 <= self.commit < _U64) or self.seq < 0:
            raise ValueError(f"position out of range: [{self.commit}, {self.seq}]")

    def to_json(self) -> list[int]:
        return [self.commit, self.seq]

    @staticmethod
    def trusted(commit: int, seq: int) -> Position:
        """`Position(commit, seq)` for values the caller knows are in range, a log reader's
        commit and seq: without the range check and the frozen dataclass's `__init__` (which
        sets each field through `object.__setattr__`), at half the cost. One is made per
        change read, a visible share of a change's cost."""
        position: Position = _new(Position)
        _SET_COMMIT(position, commit)
        _SET_SEQ(position, seq)
        return position

    @classmethod
    def from_json(cls, value: object) -> Position:
        if (
            not isinstance(value, list | tuple)
            or len(value) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)
        ):
            raise ValueError(f"a position is [commit, seq] of two integers, got {value!r}")
        return cls(value[0], value[1])


_new = object.__new__
_SET_COMMIT: Callable[[Position, int], None] = Position.__dict__["commit"].__set__
_SET_SEQ: Callable[[Position, int], None] = Position.__dict__["seq"].__set__
