"""The lake's file layout: each data file holds one range of the first key column, sorted by
key, and the files' ranges do not overlap, so a write rewrites only the files its keys fall in
(docs/adr/0008-key-range-clustered-lake-files.md says why, and what readers see).

A merge (`LakeTable.merge`) of a table whose first key column is an integer or a string (text,
varchar, uuid) goes through here; strings order by their UTF-8 bytes, as Arrow, DataFusion and
the Parquet statistics order them. The statistics are bounds, not values (delta-rs cuts a long
string's to a prefix, the maximum's last character raised), which is all a range needs:

1. `touched`: from the Delta log's min/max statistics of that column, the files that may hold
   one of the batch's keys, closed under overlap (a file of the older layout whose range
   overlaps a touched one is touched too), and the key ranges they and the batch's new keys
   cover, as few as there are runs of touched files with no untouched file between them;
2. `apply_rule`: the rows of those files with the batch applied by the one rule (a row
   replaces its key's stored row only at a higher position), sorted by key;
3. the caller writes them back a part at a time (`Touched.writes`): a range of many files is
   cut into parts of about `PART_ROWS` stored rows where no file overlaps the cut, so a
   write of keys spread over a large table holds one part in memory; each part is one Delta
   commit that replaces the rows of its keys (an overwrite with a predicate), cut into files
   of `FILE_BYTES`. A merge of many keys is so several commits, the last one carrying the
   compaction's progress: each is the rule applied to some keys, so a crash between them
   loses nothing (the next run folds the same events again, and a replay changes nothing).

On a table with deletion vectors (`LakeTable._mark`) no file is rewritten: a write reads the
files that may hold one of its keys (`holding`, no closure), applies the rule to the stored
rows of its keys (`decide`, which `apply_rule` uses too) and marks those it replaces.

Delta's conflict check of that commit is a merge's: a concurrent commit that added a file in
one of the ranges, or removed a file this one read, fails it, and it runs again. A file
without statistics could hold any key: it is touched. Pure: no I/O here.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

import numpy
import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_dblog.lake.schema import COMMIT, KEEP_PREFIX, SEQ

Key = Any
"""A first key column's value: an int or a str, compared in its own type's order (one table's
keys are all of one type)."""


def quote(name: str) -> str:
    """A column name as delta-rs's SQL predicates spell it."""
    return '"' + name.replace('"', '""') + '"'


FILE_BYTES = 8 * 1024 * 1024
"""The size a merge's files are cut at: a write of a few keys rewrites at most this much per
range it touches, and a table of 50M narrow rows is a few hundred files."""

PART_ROWS = 500_000
"""The stored rows a write reads and rewrites at once (its memory), where files allow."""

_SOURCE, _STORED = "_dblog_source_row", "_dblog_stored_row"


@dataclass(frozen=True, slots=True)
class DataFile:
    """A data file of the table, its rows and the range of its first key column (None: no
    statistics, any key)."""

    path: str
    low: Key | None
    high: Key | None
    rows: int = 0
    size: int = 0
    """Its bytes."""
    newest: int | None = None
    """The highest commit of its rows' positions (None: no statistics)."""


@dataclass(frozen=True, slots=True)
class Part:
    """A piece of one write, read and rewritten at once: the files it reads and the keys
    `low`..`high` it covers (None: every key), `high` itself only if not `cut` (where the next
    part starts)."""

    low: Key | None
    high: Key | None
    files: tuple[DataFile, ...]
    cut: bool = False


@dataclass(frozen=True, slots=True)
class Write:
    """One commit: the SQL predicate of the rows it replaces (None: the whole table) and the
    part whose rows replace them."""

    predicate: str | None
    part: Part


@dataclass(frozen=True, slots=True)
class Touched:
    """The files a write rewrites and the key ranges (inclusive) its commits replace."""

    files: tuple[DataFile, ...]
    ranges: tuple[tuple[Key, Key], ...]

    def writes(self, column: str, part_rows: int) -> list[Write]:
        """A write per part of each range (a range, not a file, is what a write covers: a
        file written across two ranges would span the untouched files between them), the
        ranges cut into parts of about `part_rows` stored rows where no file overlaps the
        cut, in key order."""
        if any(f.low is None or f.high is None for f in self.files):
            return [Write(None, Part(None, None, self.files))]
        found = []
        name = quote(column)
        for low, high in self.ranges:
            inside = sorted(
                (f for f in self.files if f.low is not None and low <= f.low <= high),
                key=attrgetter("low"),
            )
            for part in _parts(low, high, inside, part_rows):
                below = "<" if part.cut else "<="
                predicate = f"{name} >= {literal(part.low)} AND {name} {below} {literal(part.high)}"
                found.append(Write(predicate, part))
        return found


def literal(value: Key) -> str:
    """A key value as delta-rs's SQL spells it: an integer, or a string in quotes."""
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    return str(int(value))


def _parts(low: Key, high: Key, files: Sequence[DataFile], part_rows: int) -> list[Part]:
    parts: list[Part] = []
    taken: list[DataFile] = []
    start, reach, rows = low, low, 0
    for file in files:
        assert file.low is not None and file.high is not None
        if rows >= part_rows and file.low > reach:
            parts.append(Part(start, file.low, tuple(taken), cut=True))
            start, taken, rows = file.low, [], 0
        taken.append(file)
        rows += file.rows
        reach = max(reach, file.high)
    parts.append(Part(start, high, tuple(taken)))
    return parts


def key_array(keys: Sequence[Key] | numpy.ndarray) -> numpy.ndarray:
    """`keys` as an array numpy compares in their type's order: int64, or Python strings
    (object: a fixed-width numpy string would drop a trailing NUL)."""
    found = numpy.asarray(keys)
    if found.dtype.kind in "iu":
        return found.astype(numpy.int64)
    return numpy.asarray(keys, dtype=object)


def touched(files: Sequence[DataFile], keys: Sequence[Key] | numpy.ndarray) -> Touched:
    """The files that may hold one of `keys` (any order), closed under overlap, and the
    ranges to replace: theirs and the new keys', joined where no other file lies between."""
    keys = numpy.unique(key_array(keys))
    chosen = {f.path for f in files if _holds_one(f, keys)}
    while True:  # a file overlapping a chosen one may hold rows of its range
        spans = _union([(f.low, f.high) for f in files if f.path in chosen])
        more = {f.path for f in files if f.path not in chosen and _overlaps(f, spans)}
        if not more:
            break
        chosen |= more
    picked = tuple(f for f in files if f.path in chosen)
    if any(f.low is None or f.high is None for f in picked):
        return Touched(tuple(files), ())  # the whole table: its predicate is none
    spans = [(f.low, f.high) for f in picked if f.low is not None and f.high is not None]
    others = sorted(
        (f.low, f.high)
        for f in files
        if f.path not in chosen and f.low is not None and f.high is not None
    )
    spans += _key_spans(keys, [low for low, _ in others])
    return Touched(picked, tuple(_joined(_union(spans), others)))


def holding(files: Sequence[DataFile], keys: Sequence[Key] | numpy.ndarray) -> list[DataFile]:
    """The files that may hold one of `keys` (any order), by their ranges alone: what a write
    that marks rows deleted in place (deletion vectors) reads, where a rewrite also takes the
    files overlapping them."""
    keys = numpy.unique(key_array(keys))
    return [f for f in files if _holds_one(f, keys)]


def rows_holding(column: numpy.ndarray, keys: numpy.ndarray) -> numpy.ndarray:
    """The indexes of the rows of an integer key `column` whose value is one of `keys`
    (sorted, unique), in order. A file written here is sorted by key: a binary search of each
    key, not a probe of each row; another file's column is probed."""
    if len(column) < 2 or bool(numpy.all(column[1:] > column[:-1])):
        return sorted_rows_holding(column, keys)
    return numpy.flatnonzero(numpy.isin(column, keys))


def sorted_rows_holding(column: numpy.ndarray, keys: numpy.ndarray) -> numpy.ndarray:
    """`rows_holding` of a `column` known to be strictly increasing (any type numpy orders,
    `keys` of the same): a binary search of each key."""
    at = numpy.searchsorted(column, keys)
    inside = at < len(column)
    found: numpy.ndarray = at[inside][column[at[inside]] == keys[inside]]
    return found


def packed(files: Sequence[DataFile], target_bytes: int) -> list[Touched] | None:
    """What an optimize rewrites, each a range in one commit: runs of neighbouring small files
    (under half `target_bytes`, in key order, nothing between them) of at most `target_bytes`
    together, and any group of files whose ranges overlap (the older layout) alone, so that
    the files written, cut at `target_bytes` from rows sorted by key, stay in disjoint ranges.
    A run of one file is left as it is; a file of half the target or more ends a run, so what
    an optimize wrote is not packed again by the next. None when a file has no statistics:
    its keys could be anywhere, so no range can be rewritten alone."""
    if any(f.low is None or f.high is None for f in files):
        return None
    blocks: list[list[DataFile]] = []  # groups of overlapping files, in key order
    reach: Key = None
    for file in sorted(files, key=lambda f: (f.low, f.high)):
        assert file.low is not None and file.high is not None
        if blocks and file.low <= reach:
            blocks[-1].append(file)
            reach = max(reach, file.high)
        else:
            blocks.append([file])
            reach = file.high
    runs: list[list[DataFile]] = []
    run: list[DataFile] = []
    for block in blocks:
        size = sum(f.size for f in block)
        if size * 2 >= target_bytes:
            runs += [run, block]
            run = []
        elif sum(f.size for f in run) + size > target_bytes:
            runs.append(run)
            run = list(block)
        else:
            run += block
    runs.append(run)
    found = []
    for chosen in runs:
        if len(chosen) > 1:
            low = min(f.low for f in chosen if f.low is not None)
            high = max(f.high for f in chosen if f.high is not None)
            found.append(Touched(tuple(chosen), ((low, high),)))
    return found


def merges(
    files: Sequence[DataFile], deleted: Mapping[str, int], target_bytes: int
) -> list[tuple[DataFile, ...]]:
    """What an optimize of a table with deletion vectors rewrites, each group merged into
    new files in one commit: its small files, by the bytes of the rows their vectors
    (`deleted`: the rows each deletes, by path) leave alive, under half `target_bytes`
    (the files each write adds, files mostly marked deleted), in key order, at most
    `target_bytes` alive together. A group of one file is rewritten only if rows of it are
    deleted. Ranges may overlap, since a write reads every file whose range may hold one of
    its keys: so no other file is rewritten for being in the way, where `packed` must take
    every file a group's range overlaps (after a fold of random keys, whose file spans the
    key range, the whole table)."""

    def alive(file: DataFile) -> float:
        dead = deleted.get(file.path, 0)
        return file.size * (1 - dead / file.rows) if file.rows else float(file.size)

    small = [f for f in files if alive(f) * 2 < target_bytes]
    ordered = [f for f in small if f.low is None] + sorted(
        (f for f in small if f.low is not None), key=attrgetter("low")
    )
    groups: list[list[DataFile]] = [[]]
    gathered = 0.0  # the bytes alive in the last group
    for file in ordered:
        if groups[-1] and gathered + alive(file) > target_bytes:
            groups.append([])
            gathered = 0.0
        groups[-1].append(file)
        gathered += alive(file)
    return [
        tuple(group)
        for group in groups
        if len(group) > 1 or (len(group) == 1 and deleted.get(group[0].path, 0))
    ]


def _key_spans(keys: numpy.ndarray, lows: Sequence[Key]) -> list[tuple[Key, Key]]:
    """`keys` (sorted) as spans of the keys between the same two untouched files (by their
    least keys, `lows`, sorted): no untouched file meets a span, or it would hold a key and
    be touched."""
    if not len(keys):
        return []
    gap = numpy.searchsorted(key_array(lows), keys, side="right")
    cuts = numpy.flatnonzero(numpy.diff(gap)) + 1
    starts = numpy.concatenate([[0], cuts])
    ends = numpy.concatenate([cuts, [len(keys)]]) - 1
    return list(zip(keys[starts].tolist(), keys[ends].tolist(), strict=True))


def _holds_one(file: DataFile, keys: numpy.ndarray) -> bool:
    if file.low is None or file.high is None:
        return True
    at = int(numpy.searchsorted(keys, file.low))
    return at < len(keys) and bool(keys[at] <= file.high)


def _overlaps(file: DataFile, spans: Sequence[tuple[Key, Key]]) -> bool:
    if file.low is None or file.high is None:
        return True
    return _blocked(file.low, file.high, spans)


def _union(spans: Sequence[tuple[Key | None, Key | None]]) -> list[tuple[Key, Key]]:
    """Inclusive ranges merged where they overlap, sorted."""
    merged: list[tuple[Key, Key]] = []
    for low, high in sorted((lo, hi) for lo, hi in spans if lo is not None and hi is not None):
        if merged and low <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], high))
        else:
            merged.append((low, high))
    return merged


def _blocked(low: Key, high: Key, spans: Sequence[tuple[Key, Key]]) -> bool:
    """Some range of `spans` (sorted, disjoint) meets [low, high]."""
    at = bisect.bisect_left(spans, low, key=lambda span: span[1])
    return at < len(spans) and bool(spans[at][0] <= high)


def _between(low: Key, high: Key, spans: Sequence[tuple[Key, Key]]) -> bool:
    """Some range of `spans` (sorted, disjoint) meets what lies strictly between `low` and
    `high`."""
    at = bisect.bisect_right(spans, low, key=lambda span: span[1])
    return at < len(spans) and bool(spans[at][0] < high)


def _joined(spans: list[tuple[Key, Key]], others: list[tuple[Key, Key]]) -> list[tuple[Key, Key]]:
    """Neighbouring ranges made one where no range of `others` (files left alone) lies
    between them: a shorter predicate that replaces the same rows."""
    others = _union(others)
    joined: list[tuple[Key, Key]] = []
    for low, high in spans:
        if joined and not _between(joined[-1][1], low, others):
            joined[-1] = (joined[-1][0], high)
        else:
            joined.append((low, high))
    return joined


def apply_rule(
    stored: pa.Table, source: pa.Table, key: Sequence[str], schema: pa.Schema
) -> tuple[pa.Table, int, int]:
    """The rows of the touched files (`stored`, in `schema`) with `source` (in `schema`, one
    row per key, `_dblog_keep:` flags after) applied by position, sorted by key; and the rows
    inserted and updated. A kept column of an updated row keeps the stored value."""
    order = [(k, "ascending") for k in key]
    if not stored.num_rows:
        return source.select(schema.names).cast(schema).sort_by(order), source.num_rows, 0
    stored = stored.combine_chunks()  # take is slow on chunks
    found = decide(stored, source, key, schema)
    unchanged = numpy.ones(stored.num_rows, dtype=bool)
    unchanged[found.replaced] = False
    kept = stored.filter(pa.array(unchanged))
    rows = pa.concat_tables([kept, found.winners]).combine_chunks().sort_by(order)
    return rows, found.inserted, found.updated


@dataclass(frozen=True, slots=True)
class Decided:
    """The one rule applied to stored rows: the rows of the source that win (in the
    table's schema), the indexes of the stored rows they replace, and how many of them are
    new keys and how many replace a stored row."""

    winners: pa.Table
    replaced: numpy.ndarray
    inserted: int
    updated: int


def decide(stored: pa.Table, source: pa.Table, key: Sequence[str], schema: pa.Schema) -> Decided:
    """The rule (a row replaces its key's stored row only at a higher position; a kept column
    of an updated row keeps the stored value) applied to `source` (in `schema`, one row per
    key, `_dblog_keep:` flags after) against `stored`, which holds at least the key, the
    position and the kept columns, at most one row per key."""
    if not stored.num_rows:
        winners = source.select(schema.names).cast(schema)
        return Decided(winners, numpy.zeros(0, dtype=numpy.int64), source.num_rows, 0)
    names = list(key)
    source = source.combine_chunks()
    probe = source.select(names).append_column(_SOURCE, pa.array(numpy.arange(source.num_rows)))
    build = stored.select(names).append_column(_STORED, pa.array(numpy.arange(stored.num_rows)))
    pairs = probe.join(build, keys=names, join_type="left outer").combine_chunks()
    at_source, at_stored = pairs[_SOURCE], pairs[_STORED]
    matched = pc.is_valid(at_stored)
    flags = [f.name for f in schema if KEEP_PREFIX + f.name in source.column_names]
    stored_at = stored.select([COMMIT, SEQ, *flags]).take(pc.fill_null(at_stored, 0))
    coming = source.take(at_source)
    higher = pc.or_(
        pc.greater(coming[COMMIT], stored_at[COMMIT]),
        pc.and_(
            pc.equal(coming[COMMIT], stored_at[COMMIT]), pc.greater(coming[SEQ], stored_at[SEQ])
        ),
    )
    updates = pc.and_(matched, higher)
    wins = pc.or_(pc.invert(matched), updates)
    arrays = []
    for field in schema:
        value = coming[field.name]
        if field.name in flags:
            keep = pc.and_(updates, pc.fill_null(coming[KEEP_PREFIX + field.name], False))
            value = pc.if_else(keep, stored_at[field.name], value)
        arrays.append(value)
    winners = pa.Table.from_arrays(arrays, schema=schema).filter(wins)
    replaced = pc.filter(at_stored, updates).to_numpy().astype(numpy.int64)
    inserted = pc.sum(pc.invert(matched).cast(pa.int64())).as_py() or 0
    updated = pc.sum(updates.cast(pa.int64())).as_py() or 0
    return Decided(winners, replaced, inserted, updated)
