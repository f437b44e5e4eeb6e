"""Verifying a target against its source while writes go on, the pure rule: which keys of a chunk
can be judged, and what differs among them.

A verify chunk (a key range, or a list of keys, of one table) is looked at in three points of
the log. The source's rows are read between lw and hw as a dump reads them, so for every key
the log did not change between lw and hw the row read is the key's state at hw. Once the
target has applied the log through hw, its rows of the same range are read. The window closes
at a third point after that read. A key the log changed anywhere from lw to that point is in
flux: the two reads may rightly disagree on it, so it is skipped (and counted). Any other key
had one state from lw to the close: the source read it, and the target, having applied
everything through hw and nothing past the close, must hold exactly it. So a key missing from
the target, a key the target has and the source not, and a row that differs are differences,
never a write in flight.

Rows are compared by a hash of their canonical JSON (`row_hash`), the JSON an event carries:
each side's reader converts its database's values with the source's converters, so equal rows
hash equal whichever side read them, and a remote reader can ship hashes rather than rows.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from enum import StrEnum

from airflow_provider_dblog.core.event import Key, Row, key_of
from airflow_provider_dblog.core.position import Position


class Difference(StrEnum):
    """How a key that is not in flux differs between the source and the target."""

    MISSING = "missing"
    """The source has the key, the target does not."""
    EXTRA = "extra"
    """The target has the key, the source does not."""
    CHANGED = "changed"
    """Both have it, with different rows."""


def row_hash(row: Row) -> str:
    """A short hash of the row's canonical JSON: its columns sorted, no spaces. Two readers
    that give the same JSON values give the same hash."""
    text = json.dumps(row, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def row_hashes(rows: Iterable[Row], key_columns: Sequence[str]) -> dict[Key, str]:
    """Each row's hash by its key."""
    return {key_of(row, key_columns): row_hash(row) for row in rows}


def applied_through(checkpoint: int | None, hw: Position) -> bool:
    """Whether a target whose durable position is `checkpoint` (a commit: every commit at or
    below it applied) holds every event up to hw, so that its read may be compared."""
    return checkpoint is not None and checkpoint >= hw.commit


@dataclass(frozen=True, slots=True)
class ChunkVerdict:
    """What one chunk's comparison found."""

    checked: int
    """Keys judged: present on either side and not in flux."""
    in_flux: int
    """Keys present on either side that the log changed from lw to the close: skipped."""
    differences: tuple[tuple[Key, Difference], ...]
    """Every key judged that differs, source keys first in their read order, then the
    target's extra keys in theirs."""

    def count(self, kind: Difference) -> int:
        return sum(1 for _, found in self.differences if found is kind)


def compare_chunk(
    source: Mapping[Key, str], target: Mapping[Key, str], in_flux: AbstractSet[Key]
) -> ChunkVerdict:
    """Compare the row hashes the source read between lw and hw with those the target read once
    it had applied the log through hw, skipping the keys the log changed from lw to the close
    (`in_flux`; it may name keys of the table outside the chunk: they are not counted)."""
    differences: list[tuple[Key, Difference]] = []
    checked = flux = 0
    for key, hashed in source.items():
        if key in in_flux:
            flux += 1
            continue
        checked += 1
        held = target.get(key)
        if held is None:
            differences.append((key, Difference.MISSING))
        elif held != hashed:
            differences.append((key, Difference.CHANGED))
    for key in target:
        if key in source:
            continue
        if key in in_flux:
            flux += 1
            continue
        checked += 1
        differences.append((key, Difference.EXTRA))
    return ChunkVerdict(checked, flux, tuple(differences))
