"""The pure part of the Parquet compaction (`spark_jobs/compact.py`): which event wins, how the
NDJSON files are cut into pieces for the executors, and the state file. No Spark here, so the
rules are unit-tested without a SparkSession and the Spark job stays a thin driver.

Storage choice: every table is stored as `key` (the key dict as JSON), `row` (the latest image as
JSON), `commit` and `seq` (the position of the event that produced it). Rows stay exactly the
JSON values the sources made, whatever types or schema changes come along; a typed view is
`from_json(row, schema)` away. Inferring Parquet types from JSON would break on the first column
that is sometimes an int and sometimes a float, or null in one run and a string in the next.

Folding rules, per key, in position order: an event not newer than the last one applied is
skipped (duplicates and replays); `d` removes the row; `r` (a dump read, always a whole row)
replaces it; `c` and `u` lay `after` over the previous image, so a column absent from `after`
(an unchanged TOAST value) keeps its stored value. An update whose `before` holds another key
(a primary-key change) also deletes the old key, at the same position.

Table-level events: a truncate (`t`) is the table's floor: every stored row and every change of
the table positioned before it is dropped, as if each key were deleted at the truncate's
position. A schema event (`s`) changes no stored row: rows stay the JSON they arrived as, so a
row not written since an ADD COLUMN lacks the column (its value is the default the schema event
names, which a typed view must fill in), and one not written since a DROP COLUMN still holds it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from airflow_provider_dblog.core.event import Event, JsonValue, Op, Row, decode
from airflow_provider_dblog.outputs.ndjson import event_files

STATE_FILE = "_compact_state.json"
DEFAULT_SEGMENT_BYTES = 32 * 1024 * 1024
_BLOCK = 64 * 1024


class Delta(NamedTuple):
    """One event reduced to what folding needs; a tuple, so it is cheap to ship between
    executors."""

    commit: int
    seq: int
    op: str
    after: Row | None


class Stored(NamedTuple):
    """A row as the Parquet table holds it, with the position of the event that made it."""

    commit: int
    seq: int
    row: Row


TRUNCATE = Op.TRUNCATE.value
TABLE_KEY = ""
"""The key a table-level change is found under (no row's key JSON is empty)."""


def fold(
    stored: Stored | None, changes: Iterable[Delta], floor: tuple[int, int] | None = None
) -> Stored | None:
    """The latest image of one key: `stored` (the table's row, None if absent) with `changes`
    applied in position order, or None when the key ends deleted. `floor` is the position of
    the table's last truncate: what is positioned before it is gone."""
    current = stored
    last = (stored.commit, stored.seq) if stored is not None else None
    if floor is not None and (last is None or last < floor):
        current, last = None, floor
    for change in sorted(changes, key=lambda c: (c.commit, c.seq)):
        position = (change.commit, change.seq)
        if last is not None and position <= last:
            continue
        last = position
        if change.op == Op.DELETE.value or change.after is None:
            current = None
        elif change.op == Op.READ.value or current is None:
            current = Stored(change.commit, change.seq, dict(change.after))
        else:
            current = Stored(change.commit, change.seq, {**current.row, **change.after})
    return current


def key_json(key: Mapping[str, JsonValue]) -> str:
    """The key as the table stores it and groups by: compact JSON in primary-key order."""
    return json.dumps(key, separators=(",", ":"), ensure_ascii=False)


def changes_of(event: Event) -> list[tuple[str, str, Delta]]:
    """`(table, key JSON, change)` for every key the event touches: one, or two for an update
    that moved the row to another key; a truncate is one change under `TABLE_KEY`, a schema
    event none."""
    table = str(event.table)
    commit, seq = event.position.commit, event.position.seq
    if event.op is Op.SCHEMA:
        return []
    if event.op is Op.TRUNCATE:
        return [(table, TABLE_KEY, Delta(commit, seq, TRUNCATE, None))]
    if event.op is Op.DELETE:
        return [(table, key_json(event.key), Delta(commit, seq, Op.DELETE.value, None))]
    after = {**(event.after or {}), **event.key}
    found = [(table, key_json(event.key), Delta(commit, seq, event.op.value, after))]
    before = event.before or {}
    if event.op is Op.UPDATE and all(c in before for c in event.key):
        old_key = {c: before[c] for c in event.key}
        if old_key != event.key:
            found.append((table, key_json(old_key), Delta(commit, seq, Op.DELETE.value, None)))
    return found


@dataclass(frozen=True)
class Segment:
    """Bytes `[start, end)` of one event file; `first` is where the unread part of the file
    begins. A segment owns the lines that start inside it, so segments can cut lines anywhere."""

    path: str
    first: int
    start: int
    end: int


def read_segment(segment: Segment) -> Iterator[bytes]:
    """The complete lines that start in the segment (each ends before the unread part does)."""
    with open(segment.path, "rb") as f:
        f.seek(segment.start)
        if segment.start > segment.first:
            f.seek(segment.start - 1)
            f.readline()  # the line in progress belongs to the previous segment
        while f.tell() < segment.end:
            yield f.readline()


def complete_end(path: Path, start: int, size: int) -> int:
    """The offset just after the last newline in `[start, size)`, or `start` if there is none:
    a line without its newline is still being written."""
    with path.open("rb") as f:
        end = size
        while end > start:
            step = min(_BLOCK, end - start)
            f.seek(end - step)
            newline = f.read(step).rfind(b"\n")
            if newline >= 0:
                return end - step + newline + 1
            end -= step
    return start


def plan_segments(
    input_dir: Path, consumed: Mapping[str, int], segment_bytes: int = DEFAULT_SEGMENT_BYTES
) -> tuple[list[Segment], dict[str, int]]:
    """The segments to read after the `consumed` offsets (by file name), and the offsets after
    them. Only the last file may end in a partial line (it is being written)."""
    files = event_files(input_dir)
    segments: list[Segment] = []
    offsets = dict(consumed)
    for index, path in enumerate(files):
        first, size = consumed.get(path.name, 0), path.stat().st_size
        end = complete_end(path, first, size)
        if end != size and index != len(files) - 1:
            raise ValueError(f"{path}: torn line in a file that is not the last")
        for start in range(first, end, segment_bytes):
            segments.append(Segment(str(path), first, start, min(start + segment_bytes, end)))
        offsets[path.name] = end
    return segments, offsets


@dataclass
class CompactState:
    """What the output directory holds: the last folded position, the bytes consumed of each
    event file, and the current version directory of each table. Writing it is the commit point
    of a run."""

    position: list[int] | None = None
    files: dict[str, int] = field(default_factory=dict)
    tables: dict[str, str] = field(default_factory=dict)

    @classmethod
    def load(cls, output_dir: Path) -> CompactState:
        path = output_dir / STATE_FILE
        if not path.exists():
            return cls()
        data: dict[str, Any] = json.loads(path.read_text())
        return cls(data["position"], data["files"], data["tables"])

    def save(self, output_dir: Path) -> None:
        """Atomically: a crash leaves the old state or the new one, never half of either."""
        data = {"position": self.position, "files": self.files, "tables": self.tables}
        tmp = output_dir / f".{STATE_FILE}.tmp"
        with tmp.open("w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, output_dir / STATE_FILE)
        fd = os.open(output_dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def floors(truncates: Iterable[tuple[str, Delta]]) -> dict[str, tuple[int, int]]:
    """Each table's floor: the position of its last truncate among `truncates`."""
    found: dict[str, tuple[int, int]] = {}
    for table, delta in truncates:
        found[table] = max(found.get(table, (delta.commit, delta.seq)), (delta.commit, delta.seq))
    return found


def parse_line(line: bytes, after: tuple[int, int] | None) -> list[tuple[str, str, Delta]]:
    """The changes of one NDJSON line, none if the event is not newer than `after` (the last
    folded position: a replay)."""
    event = decode(line)
    if after is not None and (event.position.commit, event.position.seq) <= after:
        return []
    return changes_of(event)
