"""Chunk rows encoded ahead by the dump's reader, and the event that carries its encoded line.

The tailer is the one thread every dump row passes through, so a chunk reader (the CLI dump
process, or a Spark task: both have spare CPU) does the per-row JSON work: for each row it
encodes the row's key and its values (`encode_rows`) exactly as `encode_lines` spells an
event's `key` and `after`. At hw the tailer only drops the rows whose key JSON is among the
window's changed keys (`changed_key_json`) and puts each remaining row into its line
(`DumpLine`): the envelope around `key` and `after` is the same for every row of a window but
for the position, so a line is one join of bytes. The same row gives the same bytes whichever
path it came by (a property test compares them with `encode_lines`).

`EncodedEvent` is an `Event` whose fields are read from its line on first use, so every output
takes it as it takes any event; the NDJSON and Redis Stream outputs write its line as it is.
"""

from __future__ import annotations

import json
import operator
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import chain, compress, repeat
from json.encoder import encode_basestring
from operator import itemgetter
from typing import Any

from airflow_provider_dblog.core.event import (
    Event,
    Key,
    Op,
    Origin,
    PlainEvent,
    Row,
    SourceInfo,
    TableRef,
)
from airflow_provider_dblog.core.lines import SeqLines
from airflow_provider_dblog.core.position import Position

_JSON = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)
"""`encode`'s options: a value spelled by it is spelled as inside an encoded event."""


@dataclass(frozen=True, slots=True)
class EncodedRows:
    """Rows as a reader encoded them: each row's key JSON (its key columns in key order) and
    its values' JSON, one pair per row, in read order. Neither holds a raw newline (JSON
    escapes control characters), so a page of them is stored joined by newlines."""

    keys: Sequence[bytes]
    values: Sequence[bytes]

    def __len__(self) -> int:
        return len(self.keys)


def _chunks_encoder() -> Callable[[Any, int], Sequence[str]]:
    """The C encoder behind `json.dumps` with `encode`'s options, called without building it
    per value; no circular-reference markers, so threads may share it (rows are trees)."""
    make = getattr(json.encoder, "c_make_encoder", None)
    try:
        encoder: Callable[[Any, int], Sequence[str]] = make(  # type: ignore[misc]
            None, _JSON.default, encode_basestring, None, ":", ",", False, False, False
        )
    except TypeError:  # no C accelerator, or another signature: the public path
        return lambda value, _: (_JSON.encode(value),)
    return encoder


_CHUNKS = _chunks_encoder()


def _spelled(values: Iterable[Any]) -> Iterator[bytes]:
    """Each value as `encode` spells it inside an event, in C-level passes."""
    return map(str.encode, map("".join, map(_CHUNKS, values, repeat(0))))


def encode_rows(rows: Sequence[Row], key_columns: Sequence[str]) -> EncodedRows:
    """Each row's key and values as an event's `key` and `after` spell them. Raises
    ValueError for a row without a key column or with a value JSON cannot hold (NaN)."""
    try:
        key_values = [list(map(itemgetter(c), rows)) for c in key_columns]
    except KeyError as missing:
        raise ValueError(f"row has no primary-key column {missing}") from None
    # A key is `{"c1":v1,"c2":v2}`: its column names spelled once, its values a pass each.
    parts: list[Iterable[bytes]] = [] if key_columns else [repeat(b"{", len(rows))]
    for index, (column, column_values) in enumerate(zip(key_columns, key_values, strict=True)):
        name = (("{" if index == 0 else ",") + encode_basestring(column) + ":").encode()
        parts += [repeat(name, len(rows)), _spelled(column_values)]
    keys = list(map(b"".join, zip(*parts, repeat(b"}", len(rows)), strict=True)))
    return EncodedRows(keys, list(_spelled(rows)))


def row_columns(rows: Sequence[Row]) -> list[tuple[str, ...]]:
    """The distinct column lists of `rows`, in first-seen order: one for the rows of one read."""
    seen: dict[tuple[str, ...], None] = {}
    for row in rows:
        seen.setdefault(tuple(row), None)
    return list(seen)


def changed_key_json(keys: Iterable[Key], key_columns: Sequence[str]) -> set[bytes] | None:
    """The changed keys as `encode_rows` spells a row's key, to compare bytes with bytes; None
    if a key holds a list or an object (its frozen tuple does not say which): then each row's
    key is decoded and compared as a `Key` instead."""
    spelled: set[bytes] = set()
    for key in keys:
        if len(key) != len(key_columns) or any(isinstance(v, tuple) for v in key):
            return None
        spelled.add(_JSON.encode(dict(zip(key_columns, key, strict=True))).encode())
    return spelled


@dataclass(frozen=True, slots=True)
class DumpLine:
    """The envelope every row line of one window shares: a row's line is
    `head + key + middle + values + source + seq + tail`."""

    name: str
    db: str
    table: TableRef
    dump_id: str
    window_id: str
    commit: int
    schema_version: int
    head: bytes = field(init=False)
    middle: bytes = field(init=False)
    source: bytes = field(init=False)
    tail: bytes = field(init=False)

    def __post_init__(self) -> None:
        spell = _JSON.encode
        prefix = (
            f',"source":{{"name":{spell(self.name)},"db":{spell(self.db)}'
            f',"schema":{spell(self.table.schema)},"table":{spell(self.table.name)}'
            f',"position":[{self.commit},'
        )
        suffix = (
            f'],"origin":"dump","dump_id":{spell(self.dump_id)}'
            f',"window_id":{spell(self.window_id)},"txid":null,"ts_ms":null}}'
            f',"schema_version":{self.schema_version}}}\n'
        )
        object.__setattr__(self, "head", b'{"op":"r","key":')
        object.__setattr__(self, "middle", b',"before":null,"after":')
        object.__setattr__(self, "source", prefix.encode())
        object.__setattr__(self, "tail", suffix.encode())

    def page(self, rows: EncodedRows, first_seq: int, drop: set[bytes] | None = None) -> PageLines:
        """The rows whose key is not in `drop`, positioned `[commit, first_seq]` on, stamped
        into their lines as one bytes: one join over the page, the rows' key and values JSON
        between the envelope's parts, each row's seq spelled in a C-level pass. This is the
        one per-row loop of a chunk in the tailer's thread, and it makes no object a row."""
        keys, values = rows.keys, rows.values
        if drop:
            kept = list(map(operator.not_, map(drop.__contains__, keys)))
            keys, values = list(compress(keys, kept)), list(compress(values, kept))
        seqs = map(b"%d".__mod__, range(first_seq, first_seq + len(keys)))
        parts = zip(
            repeat(self.head),
            keys,
            repeat(self.middle),
            values,
            repeat(self.source),
            seqs,
            repeat(self.tail),
        )
        data = b"".join(chain.from_iterable(parts))
        return PageLines(self, first_seq, first_seq + len(keys) - 1, data)


@dataclass(frozen=True, slots=True)
class PageLines(SeqLines):
    """A page of a window's rows stamped into their lines (`DumpLine.page`): seqs `first` to
    `last` of the window's commit, each line with its newline, in `data`. The tailer hands it
    to the writer as one item and the NDJSON output writes it as it is."""

    window: DumpLine
    first: int
    last: int
    data: bytes

    @property
    def first_position(self) -> Position:
        return Position(self.window.commit, self.first)

    @property
    def last_position(self) -> Position:
        return Position(self.window.commit, self.last)

    def events(self) -> list[Event]:
        """One `EncodedEvent` a line."""
        lines = self.data.splitlines(keepends=True)  # JSON escapes every CR and LF it holds
        page = EncodedPage(self.window, self.first, self.last)
        seqs = range(self.first, self.last + 1)
        return list(map(EncodedEvent, lines, repeat(page, len(self)), seqs))

    def _part(self, first: int, last: int, data: bytes) -> PageLines:
        return PageLines(self.window, first, last, data)


@dataclass(frozen=True, slots=True)
class EncodedPage:
    """The events one `PageLines.events` call made: seqs `first` to `last` of a window,
    handed over in order with nothing between them, so a run of them in a batch is in
    position order by construction (`encoded_run_end`)."""

    window: DumpLine
    first: int
    last: int


class EncodedEvent(Event):
    """A dump row's `r` event as its encoded line (with its newline). Its position and source
    come from the window's `DumpLine`; `key` and `after` are decoded from the line on first
    use (an output that writes lines never asks). Equal to the `PlainEvent` it encodes."""

    __slots__ = ("_decoded", "line", "page", "seq")

    line: bytes
    page: EncodedPage
    seq: int
    _decoded: dict[str, Any]

    def __init__(self, line: bytes, page: EncodedPage, seq: int) -> None:
        self.line = line
        self.page = page
        self.seq = seq

    def _values(self) -> dict[str, Any]:
        try:
            return self._decoded
        except AttributeError:  # not read yet: `_decoded` is set on first use
            decoded: dict[str, Any] = json.loads(self.line)
            self._decoded = decoded
            return decoded

    @property
    def op(self) -> Op:
        return Op.READ

    @property
    def key(self) -> Row:
        key: Row = self._values()["key"]
        return key

    @property
    def before(self) -> None:
        return None

    @property
    def after(self) -> Row:
        after: Row = self._values()["after"]
        return after

    @property
    def source(self) -> SourceInfo:
        w = self.page.window
        return SourceInfo(
            w.name,
            w.db,
            w.table.schema,
            w.table.name,
            self.position,
            Origin.DUMP,
            w.dump_id,
            w.window_id,
        )

    @property
    def schema_version(self) -> int:
        return self.page.window.schema_version

    @property
    def position(self) -> Position:
        return Position(self.page.window.commit, self.seq)

    @property
    def table(self) -> TableRef:
        return self.page.window.table

    @property
    def txid(self) -> None:
        return None

    def event(self) -> PlainEvent:
        """The plain event this line encodes."""
        return PlainEvent(Op.READ, self.key, None, self.after, self.source, self.schema_version)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, EncodedEvent):
            return self.line == other.line
        if isinstance(other, Event):
            return self.event() == other
        return NotImplemented

    def __repr__(self) -> str:
        return f"EncodedEvent({self.line[:-1].decode()!r})"


def encoded_run_end(events: Sequence[Event], index: int) -> int:
    """The end (exclusive) of the run of one page's events that starts at `index`, or `index`
    if none does: their positions strictly increase by construction, so an output checks the
    run's first and last position rather than each (a batch may hold part of a page)."""
    event = events[index]
    if type(event) is not EncodedEvent:
        return index
    page = event.page
    end = min(len(events), index + page.last - event.seq + 1)
    final = events[end - 1]
    if (
        type(final) is EncodedEvent
        and final.page is page
        and final.seq - event.seq == end - 1 - index
    ):
        return end
    return index
