"""The pure part of the compaction (`spark_jobs/compact.py`), which folds the tailer's NDJSON
output into the lake tables (`airflow_provider_dblog.lake`): which event of a key wins within a
run, how the event files are cut into pieces for the executors, and what a run remembers. No
Spark here, so the rules are unit-tested without a SparkSession and the Spark job stays a thin
driver.

Folding rules, per key, in position order, within one run: duplicates (an equal position) count
once; `d` makes the key a tombstone at its position; `r` (a dump read) and `c` are whole rows;
`u` lays `after` over the image before it, and a column absent from `after` (an unchanged
TOASTed value) is kept: if the run holds no earlier image of the key, the row is `partial` and
the lake keeps the stored value of each column it lacks. An update whose `before` holds another
key (a primary-key change) also deletes the old key, at the same position. Events not after the
table's progress (the position the lake table recorded with the last run's commit) are replays
and skipped. The lake table then keeps, per key, the higher position of its stored row and the
run's (`LakeTable.merge`), so a run applied twice changes nothing.

Table-level events: a truncate (`t`) is the table's floor: the run's changes positioned before
its last truncate are dropped, and the merge removes stored rows below it. A schema event (`s`)
adds (ADD COLUMN) the columns the last schema event folded into the table did not list, even
those the table has already (created from the source's catalog after the ALTER, by a direct
dump or by the compaction); at the table's first, the columns the table lacks or holds
unfolded (a direct dump gave the table rows without them: `LakeTable.unfolded`). A constant
default is written into the rows positioned before the event (other defaults leave them null),
and rows of the run positioned before it get it too, partial ones included; each column added
is recorded with the event's position and its constant default (`LakeTable.folded`: for a
direct chunk read before the event and committed after the fold, and for a run started again
after one that died past the record), then the event itself (`LakeTable.fold_schema`). Every
step can be done again, so a run that dies between them converges when started again. A column
the source dropped stays in the lake, null in rows written whole after the drop (an update
folded without an earlier image of its row keeps the stored value there, as it keeps an
unchanged TOASTed one); a type change keeps the lake column's type (a value it cannot hold
stops the run, saying to rebuild the table).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from operator import itemgetter
from pathlib import Path
from typing import Any, Literal, NamedTuple

import msgspec

from airflow_provider_dblog.core.event import JsonValue, Op, Row
from airflow_provider_dblog.core.position import Position
from airflow_provider_dblog.core.schema import TableSchema
from airflow_provider_dblog.lake.schema import LakeRow
from airflow_provider_dblog.outputs.ndjson import event_files

STATE_FILE = "_compact_state.json"
DEFAULT_SEGMENT_BYTES = 32 * 1024 * 1024
_BLOCK = 64 * 1024
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


def lake_row(
    key: Row, folded: Folded, columns: Iterable[str], added: Mapping[str, AddedColumn]
) -> LakeRow:
    """The lake row of a folded key. A tombstone holds the key alone; a row positioned before
    a column was added holds that column's default (a partial one too: the source gave its row
    the default, whether or not the lake holds the row); a partial row keeps the stored value
    of every other column it lacks."""
    if folded.row is None:
        return LakeRow(key, folded.commit, folded.seq, folded.op, deleted=True, ts_ms=folded.ts_ms)
    values = dict(folded.row)
    position = (folded.commit, folded.seq)
    for name, column in added.items():
        if name not in values and position < column.position:
            values[name] = column.default
    keep: frozenset[str] = frozenset()
    if folded.partial:
        keep = frozenset(c for c in columns if c not in values)
    return LakeRow(values, folded.commit, folded.seq, folded.op, ts_ms=folded.ts_ms, keep=keep)


@dataclass(frozen=True, slots=True)
class AddedColumn:
    """A column an `s` event of the run added: where, and the value older rows hold."""

    position: tuple[int, int]
    default: JsonValue


_CAST = re.compile(r"^(.*?)(::[\w\s\[\]().,\"]+)+$", re.DOTALL)
_NUMBER = re.compile(r"-?\d+(\.\d+)?([eE][-+]?\d+)?")


def constant_default(expression: str | None) -> JsonValue:
    """A column default's value if the expression is a constant (a number, a quoted string,
    true/false, with or without PostgreSQL's `::type` casts); None otherwise (NULL, a function
    such as now() or nextval(...), an expression)."""
    if expression is None:
        return None
    text = expression.strip()
    cast = _CAST.match(text)
    if cast:
        text = cast.group(1).strip()
    if text.startswith("(") and text.endswith(")"):
        text = text[1:-1].strip()
    if len(text) >= 2 and text[0] == "'" and text[-1] == "'":
        return text[1:-1].replace("''", "'")
    if _NUMBER.fullmatch(text):
        number = float(text)
        return int(text) if number.is_integer() and re.fullmatch(r"-?\d+", text) else number
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    return None


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


def schema_changes(changes: Iterable[Change]) -> list[tuple[Position, TableSchema]]:
    """A table's `s` events of the run, in position order."""
    found = [
        (Position(c.commit, c.seq), TableSchema.from_json(c.after))
        for c in changes
        if c.op == SCHEMA and c.after is not None
    ]
    return sorted(found, key=lambda pair: pair[0])


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
    """Where the last run stopped reading: the bytes consumed of each event file and the last
    position read. Written after every table's commit, it only saves reading again: a run that
    died before writing it reads the same bytes again, and each table skips what its own
    progress (committed with its data) says it holds."""

    position: list[int] | None = None
    files: dict[str, int] = field(default_factory=dict)

    @classmethod
    def load(cls, output_dir: Path) -> CompactState:
        path = output_dir / STATE_FILE
        if not path.exists():
            return cls()
        data: dict[str, Any] = json.loads(path.read_text())
        return cls(data["position"], data["files"])

    def save(self, output_dir: Path) -> None:
        """Atomically: a crash leaves the old state or the new one, never half of either."""
        data = {"position": self.position, "files": self.files}
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
