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
When both sides' rows are at hand (`RowsRead`), they are compared as rows, with the verdict
hashes would give: a chunk whose two reads are the same values of the same types, row for row,
is judged equal without a hash, and otherwise only the rows that differ are hashed.

Where both sides' databases can sum a chunk's rows themselves (`ChunkSum`: its row count and a
sum of each row's hash, over the same columns), the two sums are compared first, in the same
three points. Equal sums mean equal rows, key by key, keys in flux included: the chunk is equal
and all its keys were checked. Sums that differ say only that some row does: the chunk's rows
are then read and compared in new windows.
"""

from __future__ import annotations

import hashlib
import json
import marshal
from collections.abc import Iterable, Iterator, Mapping, Sequence
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


_MARSHAL_VERSION = 2
"""A version of `marshal`'s format that writes every value in full, with no reference to an
earlier one (those depend on how objects are shared in memory, not on their values)."""


def _same_values(ours: Sequence[Row], theirs: Sequence[Row]) -> bool:
    """Whether two lists of rows hold the same values of the same types, each row's columns in
    the same order: then each row's JSON is the one at its place in the other list. `==` alone
    does not say it (`True == 1 == 1.0`, `-0.0 == 0.0`); the bytes `marshal` writes, in one C
    call for the whole list, do: they name each value's type and a float's every bit. False
    is only "not known to be the same" (a NaN's bits, a list against a tuple)."""
    if ours != theirs:
        return False
    try:
        mine = marshal.dumps(list(ours), _MARSHAL_VERSION)
        other = marshal.dumps(list(theirs), _MARSHAL_VERSION)
    except ValueError:  # a value marshal cannot write: not a JSON value, let the hash say
        return False
    return mine == other


class RowsRead(Mapping[Key, str]):
    """A side's rows of a chunk as they were read, keyed by `key_columns`: a mapping of their
    `row_hash` by key, hashed only when looked into. `compare_chunk` given two compares the
    rows themselves."""

    __slots__ = ("_hashes", "key_columns", "rows")

    def __init__(self, rows: Sequence[Row], key_columns: Sequence[str]) -> None:
        self.rows = rows
        self.key_columns = tuple(key_columns)
        self._hashes: dict[Key, str] | None = None

    def by_key(self) -> dict[Key, Row]:
        return {key_of(row, self.key_columns): row for row in self.rows}

    @property
    def hashes(self) -> dict[Key, str]:
        if self._hashes is None:
            self._hashes = row_hashes(self.rows, self.key_columns)
        return self._hashes

    def __getitem__(self, key: Key) -> str:
        return self.hashes[key]

    def __iter__(self) -> Iterator[Key]:
        return iter(self.hashes)

    def __len__(self) -> int:
        return len(self.hashes)


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


@dataclass(frozen=True, slots=True)
class ChunkSum:
    """A side's rows of a chunk summed by its database: equal rows give equal sums."""

    rows: int
    columns: tuple[tuple[str, str], ...]
    """The columns summed, in the order each row was hashed: name and type."""
    digest: str
    """The sum of the rows' hashes, as the database printed it."""


def sums_verdict(source: ChunkSum, target: ChunkSum) -> ChunkVerdict | None:
    """The verdict of a chunk whose two sides summed equal: every key checked and equal; None
    when the sums differ (the rows must be compared)."""
    return ChunkVerdict(source.rows, 0, ()) if source == target else None


def compare_chunk(
    source: Mapping[Key, str], target: Mapping[Key, str], in_flux: AbstractSet[Key]
) -> ChunkVerdict:
    """Compare the row hashes the source read between lw and hw with those the target read once
    it had applied the log through hw, skipping the keys the log changed from lw to the close
    (`in_flux`; it may name keys of the table outside the chunk: they are not counted). Two
    `RowsRead` are compared as rows, to the same verdict."""
    if isinstance(source, RowsRead) and isinstance(target, RowsRead):
        return _compare_rows(source, target, in_flux)
    changed = {
        key
        for key, hashed in source.items()
        if key not in in_flux and (held := target.get(key)) is not None and held != hashed
    }
    return _verdict(source, target, changed, in_flux)


def _verdict(
    ours: Mapping[Key, object],
    theirs: Mapping[Key, object],
    changed: AbstractSet[Key],
    in_flux: AbstractSet[Key],
) -> ChunkVerdict:
    """The counts and differences of a chunk whose two sides hold `ours` and `theirs` keys, of
    which `changed` differ: every key is in flux, missing, extra, changed or equal."""
    differences: list[tuple[Key, Difference]] = []
    checked = flux = 0
    for key in ours:
        if key in in_flux:
            flux += 1
            continue
        checked += 1
        if key not in theirs:
            differences.append((key, Difference.MISSING))
        elif key in changed:
            differences.append((key, Difference.CHANGED))
    for key in theirs:
        if key in ours:
            continue
        if key in in_flux:
            flux += 1
            continue
        checked += 1
        differences.append((key, Difference.EXTRA))
    return ChunkVerdict(checked, flux, tuple(differences))


def _compare_rows(source: RowsRead, target: RowsRead, in_flux: AbstractSet[Key]) -> ChunkVerdict:
    """`compare_chunk` of the two reads' hashes, hashing only rows that may differ. When the
    two lists of rows hold the same values (`_same_values`; the common case: a target that is
    equal, read in the same key order), every key is equal and only the keys in flux are looked
    for. Otherwise the rows are paired by key: the pairs `==` calls equal are confirmed so all
    at once (when that fails, each of them is hashed), and a pair `==` calls different is
    hashed, as JSON may call it equal (a NaN)."""
    if _same_values(source.rows, target.rows):
        flux = 0
        if in_flux:
            flux = sum(1 for key in source.by_key() if key in in_flux)
        return ChunkVerdict(len(source.rows) - flux, flux, ())
    theirs = target.by_key()
    ours = source.by_key()
    alike: list[Key] = []
    changed: set[Key] = set()
    for key, row in ours.items():
        held = theirs.get(key)
        if held is None or key in in_flux:
            continue
        if row == held:
            alike.append(key)
        elif row_hash(row) != row_hash(held):
            changed.add(key)
    if not _same_values([ours[k] for k in alike], [theirs[k] for k in alike]):
        changed.update(k for k in alike if row_hash(ours[k]) != row_hash(theirs[k]))
    return _verdict(ours, theirs, changed, in_flux)
