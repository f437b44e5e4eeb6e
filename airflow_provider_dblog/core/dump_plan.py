"""Dump planning: which chunks to read, in which order, and how far a dump has come.

A dump request is all captured tables, one table, or a list of primary keys of one table. A
table dump captures the table's maximum key when it starts, so an insert-heavy table cannot keep
it running forever (rows inserted above that key reach the output through the log anyway), and
walks the key space by keyset chunks: `key > after AND key <= upto`, never OFFSET.

Keys are never ordered in Python: the bounds of every chunk are keys the database returned, and
the database compares them in its own collation. Python only tests keys for equality.

With parallelism > 1 the caller asks the database for split keys (every `chunk_size`-th key of
the index) and several chunks on disjoint ranges are in flight at once. Progress, the point a
restarted dump resumes from, only moves over chunks that completed without a gap.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from airflow_provider_dblog.core.direct import DumpMode
from airflow_provider_dblog.core.errors import InvalidRequest
from airflow_provider_dblog.core.event import Key, TableRef, freeze


class DumpKind(StrEnum):
    ALL = "all"
    TABLE = "table"
    KEYS = "keys"


def checked_chunk_size(value: object) -> int:
    """A chunk size, the rows a chunk reads: a whole number of at least 1, for a request and
    for a throttle of a running dump alike."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequest(f"chunk_size must be an integer, got {value!r}")
    if value < 1:
        raise InvalidRequest(f"chunk_size must be at least 1, got {value}")
    return value


@dataclass(frozen=True, slots=True)
class DumpRequest:
    """What to dump. For `ALL`, `tables` is the list of captured tables when it was asked."""

    dump_id: str
    kind: DumpKind
    tables: tuple[TableRef, ...]
    keys: tuple[Key, ...] = ()
    chunk_size: int = 1000
    parallelism: int = 1
    mode: DumpMode = DumpMode.SEQUENCED
    where: str | None = None
    """A condition in the source's SQL on the table's columns: only the rows matching it when
    their chunk is read are dumped (a table dump only). It narrows each chunk, whose bounds
    stay the primary key's; the source checks it before the request is stored
    (`ChunkSource.check_filter`)."""
    read_only: bool = False
    """Write nothing to the source: each window's watermarks are log positions the tailer arms
    (`state/positional.py`), as for a `[source] read_only` source, whose dumps all are."""

    def __post_init__(self) -> None:
        if not self.dump_id:
            raise InvalidRequest("a dump request needs a dump_id")
        if self.where is not None:
            if not isinstance(self.where, str) or not self.where.strip():
                raise InvalidRequest(f"a filter must be a non-empty condition, got {self.where!r}")
            if self.kind is not DumpKind.TABLE:
                raise InvalidRequest(
                    "a filter applies to a dump of one table (--table), not to a dump of "
                    f"{'given keys' if self.kind is DumpKind.KEYS else 'several tables'}"
                )
        checked_chunk_size(self.chunk_size)
        if isinstance(self.parallelism, bool) or not isinstance(self.parallelism, int):
            raise InvalidRequest(f"parallelism must be an integer, got {self.parallelism!r}")
        if self.parallelism < 1:
            raise InvalidRequest(f"parallelism must be at least 1, got {self.parallelism}")
        if not isinstance(self.mode, DumpMode):
            raise InvalidRequest(f"mode must be a DumpMode, got {self.mode!r}")
        if not isinstance(self.read_only, bool):
            raise InvalidRequest(f"read_only must be true or false, got {self.read_only!r}")
        if not self.tables:
            raise InvalidRequest("a dump request names no table")
        if len(set(self.tables)) != len(self.tables):
            raise InvalidRequest("a dump request names a table twice")
        if self.kind is not DumpKind.ALL and len(self.tables) != 1:
            raise InvalidRequest(f"a '{self.kind}' dump takes exactly one table")
        if self.kind is DumpKind.KEYS and not self.keys:
            raise InvalidRequest("a 'keys' dump needs at least one key")
        if self.kind is not DumpKind.KEYS and self.keys:
            raise InvalidRequest(f"a '{self.kind}' dump takes no keys")


def key_items(
    text: str,
    key_columns: Sequence[str],
    table: TableRef,
    sample_key: Callable[[], Key | None] = lambda: None,
) -> list[Any]:
    """The keys of a key list given by a person, not yet checked against the key
    (`shaped_keys`).

    Accepted: a JSON array of keys, each a scalar (single-column keys), an array of values in
    primary-key order, or an object by column name; or, for single-column keys, a plain
    comma-separated list (`1,2,3`). `sample_key`, a key of the table, is asked only to shape
    the example of a refusal (`key_example`).
    """
    text = text.strip()
    if not text:
        raise InvalidRequest(f"the key list for {table} is empty")
    if text[0] in "[{":
        try:
            items = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InvalidRequest(f"the key list for {table} is not valid JSON: {exc}") from None
        if not isinstance(items, list):
            raise InvalidRequest(f"the key list for {table} must be a JSON array")
        return items
    if len(key_columns) != 1:
        raise InvalidRequest(
            f"{table} has a composite primary key ({', '.join(key_columns)}): give the keys "
            "as JSON, one list per key in that order, e.g. "
            f"{key_example(key_columns, sample_key())}"
        )
    return [part.strip() for part in text.split(",")]


def key_example(key_columns: Sequence[str], sample: Key | None) -> str:
    """Two made-up keys in the key's column order, each value of the JSON type the table's
    `sample` key has in that column (never its value: keys can be personal data); the column
    names as placeholders without a sample: `[["a", 1], ["b", 2]]` for (region text, n int)."""
    if sample is None or len(sample) != len(key_columns):
        return "[[" + ", ".join(f"<{c}>" for c in key_columns) + "], ...]"
    keys = [[_made_up(value, n) for value in sample] for n in (1, 2)]
    return json.dumps(keys)


def _made_up(value: object, n: int) -> object:
    if isinstance(value, bool):
        return n == 1
    if isinstance(value, int):
        return n
    if isinstance(value, float):
        return n + 0.5
    return "ab"[n - 1]


def coerce_keys(
    items: Sequence[Any], key_columns: Sequence[str], table: TableRef
) -> tuple[Key, ...]:
    """Validate already-parsed keys against the table's primary-key columns; every bad key is
    named in one refusal, so that a person fixes the list at once. Duplicates are dropped,
    order is kept."""
    keys, problems = shaped_keys(items, key_columns, table)
    if problems:
        raise InvalidRequest(listed([problems[n] for n in sorted(problems)]))
    return tuple(dict.fromkeys(keys.values()))


def shaped_keys(
    items: Sequence[Any], key_columns: Sequence[str], table: TableRef
) -> tuple[dict[int, Key], dict[int, str]]:
    """The keys that fit the table's primary-key columns and the problems of those that do
    not, by their number in the list (from 1): a caller checks the keys that fit further and
    names every bad key in one refusal."""
    if not items:
        raise InvalidRequest(f"the key list for {table} is empty")
    columns = ", ".join(key_columns)
    keys: dict[int, Key] = {}
    problems: dict[int, str] = {}
    for number, item in enumerate(items, start=1):
        if isinstance(item, dict):
            if set(item) != set(key_columns):
                problems[number] = (
                    f"key #{number} of {table} names columns {sorted(item)}, "
                    f"the primary key is ({columns})"
                )
                continue
            values = [item[c] for c in key_columns]
        elif isinstance(item, list):
            values = item
        else:
            values = [item]
        if len(values) != len(key_columns):
            problems[number] = (
                f"key #{number} of {table} has {len(values)} value(s), "
                f"the primary key ({columns}) has {len(key_columns)}"
            )
        elif any(v is None or v == "" for v in values):
            problems[number] = f"key #{number} of {table} has an empty value: {item!r}"
        else:
            keys[number] = tuple(freeze(v) for v in values)
    return keys, problems


def listed(problems: Sequence[str], most: int = 5) -> str:
    """Problems on one line, the first `most` of them and how many more."""
    shown = "; ".join(problems[:most])
    return shown if len(problems) <= most else f"{shown}; and {len(problems) - most} more"


@dataclass(frozen=True, slots=True)
class Chunk:
    """One chunk to read between a low and a high watermark.

    A range chunk reads `key > after` (no bound when None) `AND key <= upto`, in key order,
    `LIMIT limit` when set. A key chunk reads `key IN keys`.
    """

    table: TableRef
    seq: int
    after: Key | None = None
    upto: Key | None = None
    limit: int | None = None
    keys: tuple[Key, ...] | None = None
    where: str | None = None
    """The dump's filter (`DumpRequest.where`): the chunk reads the rows of its key range
    that match it."""

    @property
    def is_key_chunk(self) -> bool:
        return self.keys is not None


@dataclass(slots=True)
class TableProgress:
    """The durable progress of one table: what a restarted dump resumes from."""

    table: TableRef
    started: bool = False
    done: bool = False
    max_key: Key | None = None
    after: Key | None = None
    key_index: int = 0
    chunks_done: int = 0
    rows_done: int = 0
    rows_written: int = 0
    """Rows a direct dump wrote into its target (rows read, less those the log carried)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "table": str(self.table),
            "started": self.started,
            "done": self.done,
            "max_key": _key_to_json(self.max_key),
            "after": _key_to_json(self.after),
            "key_index": self.key_index,
            "chunks_done": self.chunks_done,
            "rows_done": self.rows_done,
            "rows_written": self.rows_written,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TableProgress:
        return cls(
            table=TableRef.parse(data["table"]),
            started=data["started"],
            done=data["done"],
            max_key=_key_from_json(data["max_key"]),
            after=_key_from_json(data["after"]),
            key_index=data["key_index"],
            chunks_done=data["chunks_done"],
            rows_done=data["rows_done"],
            rows_written=data.get("rows_written", 0),
        )


def integer_key(key: Key | None) -> int | None:
    """The key's value if it is one integer column (a bool is not one)."""
    if key is None or len(key) != 1:
        return None
    value = key[0]
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def estimated_fraction(
    progress: TableProgress, keys_requested: int, first: tuple[int, int] | None
) -> float | None:
    """How far a table's dump is, 0..1, or None when it cannot be told: what `dblog dump`'s
    bars and `dblog ui` show. Known for a table done or not started and for a dump of given
    keys (`keys_requested` of them); estimated for a one-integer-column key from the rows met
    per key since `first` ((key, rows done) at a step seen earlier); unknown for other keys."""
    if progress.done:
        return 1.0
    if not progress.started:
        return 0.0
    if keys_requested:
        return min(1.0, progress.key_index / keys_requested)
    after, last = integer_key(progress.after), integer_key(progress.max_key)
    if first is None or after is None or last is None or after <= first[0]:
        return None
    rows_per_key = (progress.rows_done - first[1]) / (after - first[0])
    left = max(0.0, (last - after) * rows_per_key)
    total = progress.rows_done + left
    return progress.rows_done / total if total else 1.0


def _key_to_json(key: Key | None) -> list[Any] | None:
    return None if key is None else list(key)


def _key_from_json(value: list[Any] | None) -> Key | None:
    return None if value is None else tuple(freeze(v) for v in value)


@dataclass(slots=True)
class _InFlight:
    chunk: Chunk
    resume_after: Key | None = None
    resume_index: int = 0
    final: bool = False
    completed: bool = False


@dataclass(slots=True)
class TablePlanner:
    """Plans the chunks of one table of a dump and moves its durable progress.

    Call `begin(max_key)` once for a range dump (the caller reads the maximum key), then ask
    `next_chunks` and report each read with `complete`. A chunk whose window failed is simply read
    again, with new watermarks: its bounds do not change.
    """

    progress: TableProgress
    chunk_size: int
    keys: tuple[Key, ...] | None = None
    bounded: bool = False
    """Plan every range chunk with an upper bound from split keys, even at parallelism 1 (no
    LIMIT chunks): the Spark dump needs a chunk's end before it splits it across tasks."""
    where: str | None = None
    """The dump's filter, carried by every chunk. It implies `bounded`: a LIMIT chunk of
    filtered rows would end where the filter's rows run out, so the filter would drive the
    paging (a chunk scanning the table far past its rows, for a condition that matches few)."""
    _in_flight: list[_InFlight] = field(default_factory=list)
    _cursor_after: Key | None = None
    _cursor_index: int = 0
    _final_planned: bool = False
    _next_seq: int = 0

    def __post_init__(self) -> None:
        self.bounded = self.bounded or self.where is not None
        self._cursor_after = self.progress.after
        self._cursor_index = self.progress.key_index
        if self.keys is not None and not self.progress.started:
            self.progress.started = True
            self.progress.done = not self.keys
        if self.keys is not None:
            self._final_planned = self._cursor_index >= len(self.keys)

    @property
    def table(self) -> TableRef:
        return self.progress.table

    @property
    def needs_max_key(self) -> bool:
        return self.keys is None and not self.progress.started

    @property
    def done(self) -> bool:
        return self.progress.done

    @property
    def cursor_after(self) -> Key | None:
        """Where the next split-key search starts (beyond the chunks already planned)."""
        return self._cursor_after

    @property
    def in_flight(self) -> int:
        return sum(not f.completed for f in self._in_flight)

    def begin(self, max_key: Key | None) -> None:
        """Start a range dump at the table's current maximum key (None: the table is empty)."""
        if not self.needs_max_key:
            raise InvalidRequest(f"{self.table} is already started")
        self.progress.started = True
        self.progress.max_key = max_key
        self.progress.done = max_key is None

    def split_keys_wanted(self, parallelism: int) -> int:
        """How many split keys to ask the database for before `next_chunks` (range dumps with
        parallelism > 1 or `bounded`; 0 otherwise)."""
        if (parallelism <= 1 and not self.bounded) or self.keys is not None or self.needs_max_key:
            return 0
        if self.progress.done or self._final_planned:
            return 0
        return max(0, parallelism - self.in_flight)

    def next_chunks(self, parallelism: int, split_keys: Sequence[Key] = ()) -> list[Chunk]:
        """Chunks to read now, at most `parallelism` in flight in all.

        `split_keys` are, for a range dump with parallelism > 1 (or `bounded`), the keys at every
        `chunk_size`-th row after the planning cursor, none beyond the maximum key and at most
        `split_keys_wanted()` of them, as the database returned them in key order. Fewer than
        asked means the table's range ends within the next chunk.
        """
        if self.needs_max_key:
            raise InvalidRequest(f"{self.table}: read its maximum key and call begin() first")
        free = max(0, parallelism - self.in_flight)
        if self.progress.done or self._final_planned or free == 0:
            return []
        if self.keys is not None:
            return self._next_key_chunks(free)
        if parallelism <= 1 and not self.bounded:
            return [self._plan_range(self._cursor_after, self.progress.max_key, self.chunk_size)]
        if len(split_keys) > free:
            raise InvalidRequest(f"{self.table}: {len(split_keys)} split keys for {free} chunks")
        return self._next_split_chunks(split_keys, wanted=free)

    def complete(self, chunk: Chunk, rows_read: int, last_key: Key | None) -> None:
        """Record that `chunk` was read and its window closed; move durable progress."""
        flight = next((f for f in self._in_flight if f.chunk.seq == chunk.seq), None)
        if flight is None or flight.completed:
            raise InvalidRequest(f"{self.table}: chunk {chunk.seq} is not in flight")
        flight.completed = True
        self.progress.rows_done += rows_read
        self.progress.chunks_done += 1
        if chunk.limit is not None:
            # A LIMIT chunk: where the next one starts is only known now.
            max_key = self.progress.max_key
            if rows_read < chunk.limit or last_key is None or last_key == max_key:
                flight.final = True
                self._final_planned = True
            else:
                flight.resume_after = last_key
                self._cursor_after = last_key
        while self._in_flight and self._in_flight[0].completed:
            head = self._in_flight.pop(0)
            if head.chunk.keys is not None:
                self.progress.key_index = head.resume_index
            else:
                self.progress.after = head.resume_after
            if head.final:
                self.progress.done = True

    # -- internals --------------------------------------------------------------------------

    def _next_key_chunks(self, free: int) -> list[Chunk]:
        assert self.keys is not None
        chunks = []
        for _ in range(free):
            start = self._cursor_index
            if start >= len(self.keys):
                break
            end = min(start + self.chunk_size, len(self.keys))
            chunk = Chunk(self.table, self._take_seq(), keys=self.keys[start:end], where=self.where)
            final = end >= len(self.keys)
            self._in_flight.append(_InFlight(chunk, resume_index=end, final=final))
            self._cursor_index = end
            if final:
                self._final_planned = True
            chunks.append(chunk)
        return chunks

    def _next_split_chunks(self, split_keys: Sequence[Key], wanted: int) -> list[Chunk]:
        chunks = []
        lower = self._cursor_after
        max_key = self.progress.max_key
        for split in split_keys:
            final = split == max_key
            chunks.append(self._plan_range(lower, split, None, final))
            lower = split
            if final:
                return chunks
        if len(split_keys) < wanted:
            chunks.append(self._plan_range(lower, max_key, None, True))
        return chunks

    def _plan_range(
        self, after: Key | None, upto: Key | None, limit: int | None, final: bool = False
    ) -> Chunk:
        chunk = Chunk(
            self.table, self._take_seq(), after=after, upto=upto, limit=limit, where=self.where
        )
        self._in_flight.append(_InFlight(chunk, resume_after=upto, final=final))
        if limit is None:
            self._cursor_after = upto
        if final:
            self._final_planned = True
        return chunk

    def _take_seq(self) -> int:
        seq = self._next_seq
        self._next_seq += 1
        return seq
