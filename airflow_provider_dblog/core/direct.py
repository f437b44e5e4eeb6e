"""Direct dumps, the pure part: what the tailer records at a direct window's hw, which chunk rows
survive it, where they are positioned, and how long a target must keep its tombstones.

A dump is `sequenced` (the tailer emits the chunk's surviving rows at hw into the one ordered
stream) or `direct` (the dump writes them itself into a target keyed by primary key that keeps,
per key, the row with the highest position: a lake table, SQL apply in monotonic mode). In
direct mode the tailer never sees a row: at hw it records the keys of the window's table that
changed between lw and hw, and hw's position (`DirectRecord`). The dump drops those keys and
writes the rest positioned just after hw. A row's state is its state at hw (the read is
non-stale and no event of its key lies between lw and hw), so a log event of the key before lw
is older and one after hw newer: whichever reaches the target first, the highest position wins,
exactly the state the sequenced stream would leave.

One race remains, for deletes: a delete after hw may reach the target before the dump's rows.
The target must then remember the delete (a tombstone: the key, deleted, at its position) so the
row positioned at hw, older, does not come back. A tombstone may go once no direct row older
than it can still arrive: `tombstone_horizon`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from airflow_provider_dblog.core.errors import InvalidRequest
from airflow_provider_dblog.core.event import Key, Row, key_of
from airflow_provider_dblog.core.position import Position


class DumpMode(StrEnum):
    """How a chunk's surviving rows reach a target (see the module docstring)."""

    SEQUENCED = "sequenced"
    DIRECT = "direct"

    @classmethod
    def parse(cls, value: object) -> DumpMode:
        if isinstance(value, str) and value in {m.value for m in cls}:
            return cls(value)
        modes = ", ".join(m.value for m in cls)
        raise InvalidRequest(f"a dump mode is one of {modes}, got {value!r}")


@dataclass(frozen=True, slots=True)
class DirectRecord:
    """What the tailer records at a direct window's hw: the keys of its table that changed while
    it was open, and where lw and hw sit in the log."""

    window_id: str
    lw_position: Position
    hw_position: Position
    changed_keys: frozenset[Key]

    @property
    def rows_position(self) -> Position:
        """Where the chunk's surviving rows go: just after hw, before every event after it.
        One position for all of them: they are rows of distinct keys."""
        return Position(self.hw_position.commit, self.hw_position.seq + 1)

    def survivors(self, rows: Iterable[Row], key_columns: Sequence[str]) -> list[Row]:
        """The chunk rows whose key no log event changed inside the window."""
        changed = self.changed_keys
        if not changed:
            return list(rows)
        return [row for row in rows if key_of(row, key_columns) not in changed]


def tombstone_horizon(pending_lws: Iterable[Position], checkpoint: int | None) -> Position | None:
    """The position before which no direct dump row can still reach a target, so tombstones
    positioned before it may be pruned; None when nothing may be pruned yet.

    A direct row is positioned after its window's hw, hence after its lw. `pending_lws` are the
    lws of the direct windows the tailer opened whose rows are not yet committed (open, or
    recorded and being written). A window the tailer has not opened yet has its lw after every
    position the tailer has read, so after every tombstone a target holds. The checkpoint
    bounds the horizon too: log events after it may be read again after a restart, and a
    replayed create must still meet the delete that followed it. (A target reads the
    checkpoint as the commit it is: `Position(checkpoint, 0)`.)
    """
    if checkpoint is None:
        return None
    return min([*pending_lws, Position(checkpoint, 0)])
