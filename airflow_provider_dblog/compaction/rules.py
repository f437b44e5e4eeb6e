"""The compaction's rules per key: which event of a key wins within a run, and how an NDJSON
line becomes the changes the run folds. No Spark and no Arrow here: the executors run these,
and the unit tests need no SparkSession.

Folding rules, per key, in position order, within one run: duplicates (an equal position) count
once; `d` makes the key a tombstone at its position; `r` (a dump read) and `c` are whole rows;
`u` lays `after` over the image before it, and a column absent from `after` (an unchanged
TOASTed value) is kept: if the run holds no earlier image of the key, the row is `partial` and
the lake keeps the stored value of each column it lacks. An update whose `before` holds another
key (a primary-key change) also deletes the old key, at the same position. Events not after the
table's progress (the position the lake table recorded with the last run's commit) are replays
and skipped. The lake table then keeps, per key, the higher position of its stored row and the
run's (`LakeTable.merge`), so a run applied twice changes nothing.

Table-level events come under `TABLE_KEY`. A truncate (`t`) is the table's floor: the run's
changes positioned before its last truncate are dropped, and the merge removes stored rows
below it. A schema event (`s`) evolves the table (`evolution.py`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from operator import itemgetter
from typing import Any, Literal, NamedTuple

import msgspec

from airflow_provider_dblog.core.event import JsonValue, Op, Row

TRUNCATE = Op.TRUNCATE.value
SCHEMA = Op.SCHEMA.value
DELETE = Op.DELETE.value
UPDATE = Op.UPDATE.value
_POSITION = itemgetter(0, 1)
TABLE_KEY = ""
"""The key a table-level change is found under (no row's key JSON is empty)."""


class Change(NamedTuple):
    """One event reduced to what folding needs; a tuple, so it is cheap to ship between
    executors. `after` is the row (None for a delete or truncate), or for a schema event the
    table schema's JSON."""

    commit: int
    seq: int
    op: str
    after: Row | None
    ts_ms: int | None = None


class Folded(NamedTuple):
    """A key's latest state in one run: its row (None: a tombstone) at a position, and whether
    the row lacks columns the stored row must fill (`partial`)."""

    commit: int
    seq: int
    op: str
    row: Row | None
    partial: bool
    ts_ms: int | None = None


def fold(changes: Iterable[Change], floor: tuple[int, int] | None = None) -> Folded | None:
    """One key's latest state from the run's `changes`, or None if none is at or after
    `floor` (the position of the table's last truncate in the run)."""
    found: Folded | None = None
    last = floor
    row: Row | None = None
    partial = False
    for commit, seq, op, after, ts_ms in sorted(changes, key=_POSITION):
        if last is not None and (
            (commit, seq) <= last if found is not None else (commit, seq) < last
        ):
            continue  # a duplicate, or a change before the floor
        last = (commit, seq)
        if op == DELETE or after is None:
            row, partial = None, False
        elif op != UPDATE:
            row, partial = after, False
        elif row is None:
            row, partial = after, True
        else:
            row = {**row, **after}
        found = Folded(commit, seq, op, row, partial, ts_ms)
    return found


class _Source(msgspec.Struct):
    """The part of an event's `source` folding needs."""

    schema: str
    table: str
    position: tuple[int, int]
    ts_ms: int | None = None


class _Line(msgspec.Struct):
    """The part of one NDJSON event folding needs, decoded straight into plain values: an
    `Event` per line (its dataclasses, enums and checks) would cost more than the fold."""

    op: Literal["c", "u", "d", "r", "t", "s"]
    key: dict[str, Any]
    before: dict[str, Any] | None
    after: dict[str, Any] | None
    source: _Source
    schema_version: int
    table_schema: dict[str, Any] | None = None


_decode_line = msgspec.json.Decoder(_Line).decode
_encode = msgspec.json.encode
_decode = msgspec.json.decode


def key_json(key: Mapping[str, JsonValue]) -> str:
    """The key as the run groups by: compact JSON in primary-key order."""
    return _encode(key).decode()


def key_row(key: str) -> Row:
    """The key `key_json` spelled."""
    found: Row = _decode(key)
    return found


def parse_line(
    line: bytes, progress: Mapping[str, tuple[int, int]]
) -> list[tuple[str, str, Change]]:
    """`(table, key JSON, change)` for every key the line's event touches: one, or two for an
    update that moved the row to another key; a table-level event is one change under
    `TABLE_KEY` (a schema event's `after` is its table schema's JSON). None if the event is
    not after its table's `progress` (the position the lake table recorded: a replay)."""
    try:
        event = _decode_line(line)
    except msgspec.DecodeError as exc:
        raise ValueError(f"not a DBLog event: {exc}") from None
    source = event.source
    table = f"{source.schema}.{source.table}"
    commit, seq = source.position
    done = progress.get(table)
    if done is not None and (commit, seq) <= done:
        return []
    op, ts_ms = event.op, source.ts_ms
    if op == SCHEMA:
        if event.table_schema is None:
            raise ValueError("not a DBLog event: a schema event without its table_schema")
        return [(table, TABLE_KEY, Change(commit, seq, SCHEMA, event.table_schema, ts_ms))]
    if op == TRUNCATE:
        return [(table, TABLE_KEY, Change(commit, seq, TRUNCATE, None, ts_ms))]
    key = event.key
    if op == DELETE:
        return [(table, key_json(key), Change(commit, seq, DELETE, None, ts_ms))]
    after = event.after
    after = {**after, **key} if after else dict(key)
    found = [(table, key_json(key), Change(commit, seq, op, after, ts_ms))]
    before = event.before
    if op == UPDATE and before and all(c in before for c in key):
        old_key = {c: before[c] for c in key}
        if old_key != key:
            found.append((table, key_json(old_key), Change(commit, seq, DELETE, None, ts_ms)))
    return found


def floors(truncates: Iterable[tuple[str, Change]]) -> dict[str, tuple[int, int]]:
    """Each table's floor: the position of its last truncate among `truncates`."""
    found: dict[str, tuple[int, int]] = {}
    for table, change in truncates:
        position = (change.commit, change.seq)
        found[table] = max(found.get(table, position), position)
    return found
