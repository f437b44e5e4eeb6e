"""The change event, one format for log and dump events, and its stable JSON encoding.

`{"op", "key", "before", "after", "source": {...}, "schema_version"}`, as docs/architecture.md
shows it. Row values are already JSON values here: each source converts database values once,
with one converter for both the log and the dump, so the same row gives the same JSON whichever
path it came by.

Table-level events travel in the same envelope at their log position, with an empty `key` and
null `before`/`after`: `t` (every row of the table was removed: TRUNCATE) and `s` (the table's
columns from here on, in an extra field `"table_schema": {"columns": [{"name", "type",
"nullable", "default"}, ...], "key": [...]}`; its `schema_version` is the new version). A row
event's `schema_version` is the version of the last `s` event of its table before it.
"""

from __future__ import annotations

import json
import json.encoder
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeAlias

from airflow_provider_dblog.core.position import Position
from airflow_provider_dblog.core.schema import TableSchema

JsonValue: TypeAlias = Any
"""A value `json.dumps` accepts: None, bool, int, float, str, list, dict."""

Row: TypeAlias = dict[str, JsonValue]
Key: TypeAlias = tuple[Any, ...]
"""A primary key: its values in primary-key column order, hashable (lists become tuples)."""


class Op(StrEnum):
    CREATE = "c"
    UPDATE = "u"
    DELETE = "d"
    READ = "r"
    TRUNCATE = "t"
    """Table-level: every row of the table was removed."""
    SCHEMA = "s"
    """Table-level: the table's columns changed; the event carries the new ones."""

    @property
    def is_table_level(self) -> bool:
        return self in _TABLE_LEVEL


_TABLE_LEVEL = frozenset({Op.TRUNCATE, Op.SCHEMA})


class Origin(StrEnum):
    LOG = "log"
    DUMP = "dump"


@dataclass(frozen=True, slots=True, order=True)
class TableRef:
    """A captured table. `schema` is the PostgreSQL schema, or the MySQL database."""

    schema: str
    name: str

    def __str__(self) -> str:
        return f"{self.schema}.{self.name}"

    @classmethod
    def parse(cls, text: str, default_schema: str | None = None) -> TableRef:
        schema, sep, name = text.partition(".")
        if not sep:
            schema, name = default_schema or "", text
        if not schema or not name or "." in name:
            raise ValueError(f"a table is named 'schema.table', got {text!r}")
        return cls(schema, name)


def freeze(value: JsonValue) -> Any:
    """A hashable stand-in for a JSON value, so it can be part of a key."""
    if isinstance(value, list):
        return tuple(freeze(v) for v in value)
    if isinstance(value, dict):
        return tuple((k, freeze(v)) for k, v in value.items())
    return value


def key_of(row: Mapping[str, JsonValue], key_columns: Sequence[str]) -> Key:
    """The key of a row (or of a key dict), in primary-key column order."""
    try:
        return tuple(freeze(row[c]) for c in key_columns)
    except KeyError as missing:
        raise ValueError(f"row has no primary-key column {missing}") from None


@dataclass(slots=True)
class SourceInfo:
    """Where an event comes from. Not a frozen dataclass, as `Event` is not: see there."""

    name: str
    db: str
    schema: str
    table: str
    position: Position
    origin: Origin
    dump_id: str | None = None
    window_id: str | None = None
    txid: int | None = None
    ts_ms: int | None = None

    @property
    def table_ref(self) -> TableRef:
        return TableRef(self.schema, self.table)

    def to_json(self) -> dict[str, JsonValue]:
        return {
            "name": self.name,
            "db": self.db,
            "schema": self.schema,
            "table": self.table,
            "position": self.position.to_json(),
            "origin": self.origin.value,
            "dump_id": self.dump_id,
            "window_id": self.window_id,
            "txid": self.txid,
            "ts_ms": self.ts_ms,
        }


@dataclass(slots=True)
class Event:
    """One change. Events are values: nothing changes one once it is built (`dataclasses.replace`
    makes another). They are not frozen dataclasses only because the log path builds one per
    row change, with its `SourceInfo`, and a frozen dataclass's `__init__` costs about five
    times as much (it sets each field through `object.__setattr__`)."""

    op: Op
    key: Row
    before: Row | None
    after: Row | None
    source: SourceInfo
    schema_version: int
    table_schema: TableSchema | None = None
    """The new columns, on an `s` event only (`table_event` and `from_json` check it; row
    events are built without a check, as they are built by the million)."""

    @property
    def position(self) -> Position:
        return self.source.position

    @property
    def table(self) -> TableRef:
        return self.source.table_ref

    @property
    def txid(self) -> int | None:
        return self.source.txid

    def key_value(self) -> Key:
        return tuple(freeze(v) for v in self.key.values())

    def to_json(self) -> dict[str, JsonValue]:
        data: dict[str, JsonValue] = {
            "op": self.op.value,
            "key": self.key,
            "before": self.before,
            "after": self.after,
        }
        if self.table_schema is not None:
            data["table_schema"] = self.table_schema.to_json()
        data["source"] = self.source.to_json()
        data["schema_version"] = self.schema_version
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Event:
        try:
            src = data["source"]
            source = SourceInfo(
                name=src["name"],
                db=src["db"],
                schema=src["schema"],
                table=src["table"],
                position=Position.from_json(src["position"]),
                origin=Origin(src["origin"]),
                dump_id=src.get("dump_id"),
                window_id=src.get("window_id"),
                txid=src.get("txid"),
                ts_ms=src.get("ts_ms"),
            )
            table_schema = data.get("table_schema")
            op = Op(data["op"])
            _check_table_schema(op, table_schema)
            return cls(
                op=op,
                key=data["key"],
                before=data["before"],
                after=data["after"],
                source=source,
                schema_version=data["schema_version"],
                table_schema=None if table_schema is None else TableSchema.from_json(table_schema),
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"not a DBLog event: missing or malformed {exc}") from None


@dataclass(frozen=True, slots=True)
class LogOrigin:
    """What the row events of one table in one transaction share: their source but for the
    position."""

    name: str
    db: str
    table: TableRef
    txid: int | None
    ts_ms: int
    schema: str = field(init=False)
    """`table.schema` and `table.name`, read as a `SourceInfo`'s are (`Session.change`)."""
    table_name: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "schema", self.table.schema)
        object.__setattr__(self, "table_name", self.table.name)


class EncodedLogEvent(Event):
    """A log row event that its reader built together with its line (with its newline), so
    the writer thread does not encode it again: `encode_lines` takes the line as it is. Its
    `source` is built from its `origin` and position when asked for (the tailer reads
    `origin`, `position` and `txid` instead). Equal to the `Event`
    it encodes; the reader that builds one makes its line `encode`'s (a property test pins
    it)."""

    __slots__ = ("_position", "line", "origin")

    line: bytes
    origin: LogOrigin
    _position: Position
    table_schema = None

    def __init__(
        self,
        line: bytes,
        op: Op,
        key: Row,
        before: Row | None,
        after: Row | None,
        position: Position,
        origin: LogOrigin,
        schema_version: int,
    ) -> None:
        self.line = line
        self.op = op
        self.key = key
        self.before = before
        self.after = after
        self._position = position
        self.origin = origin
        self.schema_version = schema_version

    @property
    def source(self) -> SourceInfo:  # type: ignore[override]
        o = self.origin
        return SourceInfo(
            o.name,
            o.db,
            o.table.schema,
            o.table.name,
            self._position,
            Origin.LOG,
            None,
            None,
            o.txid,
            o.ts_ms,
        )

    @property
    def position(self) -> Position:
        return self._position

    @property
    def table(self) -> TableRef:
        return self.origin.table

    @property
    def txid(self) -> int | None:
        return self.origin.txid

    def event(self) -> Event:
        """The plain `Event` this line encodes."""
        return Event(self.op, self.key, self.before, self.after, self.source, self.schema_version)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, EncodedLogEvent):
            return self.event() == other.event()
        if isinstance(other, Event):
            return self.event() == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]


def log_line_format(op: Op, name: str, db: str, table: TableRef) -> bytes:
    """The line `encode` gives a log row event `op` of `table` from source `name` and `db`, as
    a `%` format of its key, before and after JSON (bytes), commit, seq, txid, ts_ms and
    schema version: what a reader fills to build an `EncodedLogEvent`'s line."""
    source = (
        f'"source":{{"name":{_string(name)},"db":{_string(db)},"schema":{_string(table.schema)}'
        f',"table":{_string(table.name)},"position":['
    ).encode()
    return (
        b'{"op":'
        + _OP_JSON[op]
        + b',"key":%b,"before":%b,"after":%b,'
        + source.replace(b"%", b"%%")
        + b'%d,%d],"origin":"log","dump_id":null,"window_id":null,"txid":%d,"ts_ms":%d}'
        b',"schema_version":%d}\n'
    )


def table_event(
    op: Op, source: SourceInfo, schema_version: int, table_schema: TableSchema | None = None
) -> Event:
    """A table-level event (`t` or `s`) of `source`'s table at its position."""
    if not op.is_table_level:
        raise ValueError(f"{op.value!r} is a row operation, not a table-level one")
    _check_table_schema(op, table_schema)
    return Event(op, {}, None, None, source, schema_version, table_schema)


def _check_table_schema(op: Op, table_schema: object) -> None:
    if (op is Op.SCHEMA) != (table_schema is not None):
        raise ValueError("a schema event, and only a schema event, carries table_schema")


def encode(event: Event) -> str:
    """One line of JSON. Field order is fixed and row columns keep table order, so the same
    event always encodes to the same bytes."""
    return json.dumps(event.to_json(), separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def encode_lines(events: Iterable[Event]) -> list[bytes]:
    """`(encode(event) + "\\n").encode()` for each event, byte for byte, at a fraction of the cost.

    An `EncodedLogEvent` comes with its line. Otherwise the envelope is spelled out directly,
    as bytes, and only `key`, `before` and `after` go through a JSON encoder, one for the
    whole batch: msgspec for a row of plain values, the
    standard library's for anything else. Anything unusual (a field of another type than its
    annotation, a value an encoder refuses) takes `encode` itself, which then gives the same
    bytes or raises the same error as before.
    """
    line = _LineEncoder().line
    return [line(event) for event in events]


_OP_JSON = {op: json.dumps(op.value).encode() for op in Op}
_ORIGIN_JSON = {origin: json.dumps(origin.value).encode() for origin in Origin}
_string: Callable[[str], str] = json.encoder.encode_basestring
"""The escaping `json.dumps(..., ensure_ascii=False)` applies to every string."""
_PLAIN_TYPES = frozenset({str, int, bool, type(None)})
"""Values msgspec spells exactly as `json.dumps` does: the exact types, not subclasses.
Floats are not among them (msgspec writes `1e16` where Python writes `1e+16`)."""
_STR_TYPE = frozenset({str})
_LINE = (
    b'{"op":%b,"key":%b,"before":%b,"after":%b,"source":%b%d,%d],"origin":%b'
    b',"dump_id":%b,"window_id":%b,"txid":%b,"ts_ms":%b},"schema_version":%d}\n'
)


def plain_row_encoder() -> Callable[[Any], bytes] | None:
    """msgspec's JSON encoder, which spells a dict of `str` keys and values of the exact types
    str, int, bool and None as `encode` does (what `row_json_encoder` checks before it calls it);
    None where it is not installed (this module is imported without site-packages too, from
    the package's zip on a Spark executor: `spark_package`)."""
    try:
        import msgspec.json
    except ImportError:
        return None
    return msgspec.json.Encoder().encode


def row_json_encoder() -> Callable[[JsonValue], bytes]:
    """A JSON value (an event's `key`, `before` or `after`) as `json.dumps` with `encode`'s
    options spells it inside an event, as bytes. Not thread-safe, and after it raised it
    may refuse what it would take: make a new one then (`_LineEncoder.line`)."""
    plain, keys = _PLAIN_TYPES.issuperset, _STR_TYPE.issuperset
    fast = plain_row_encoder()
    options = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    make = getattr(json.encoder, "c_make_encoder", None)
    try:
        # What `JSONEncoder.encode` does for a non-string, minus building it per call.
        encoder = make(  # type: ignore[misc]
            {},
            options.default,
            _string,
            None,
            options.key_separator,
            options.item_separator,
            options.sort_keys,
            options.skipkeys,
            options.allow_nan,
        )
    except TypeError:  # no C accelerator, or another signature: the public path

        def standard(obj: JsonValue) -> bytes:
            return options.encode(obj).encode()

    else:

        def standard(obj: JsonValue) -> bytes:
            return "".join(encoder(obj, 0)).encode()

    if fast is None:
        return standard

    def value(obj: JsonValue) -> bytes:
        if type(obj) is dict and keys(map(type, obj)) and plain(map(type, obj.values())):
            return fast(obj)
        return standard(obj)

    return value


class _LineEncoder:
    """Encodes events as `encode` does. Not thread-safe: one per batch (the JSON encoder's
    circular-reference markers are shared between its calls)."""

    def __init__(self) -> None:
        self._value = row_json_encoder()
        self._tables: dict[tuple[str, str, str, str], bytes] = {}
        """`{"name":..,"db":..,"schema":..,"table":..,"position":[` of each table met."""

    def line(self, event: Event) -> bytes:
        if type(event) is EncodedLogEvent:
            return event.line
        try:
            line = self._envelope(event)
        except Exception:
            # A value the encoder refused may leave its markers behind: start afresh, and let
            # `encode` give the result (or raise its own error).
            self._value = row_json_encoder()
            line = None
        if line is None:
            line = (encode(event) + "\n").encode()
        return line

    def _envelope(self, event: Event) -> bytes | None:
        """The event's line, or None if a field is not of its usual type."""
        source = event.source
        position = source.position
        op, origin = event.op, source.origin
        name, db, schema, table = source.name, source.db, source.schema, source.table
        dump_id, window_id = source.dump_id, source.window_id
        txid, ts_ms = source.txid, source.ts_ms
        commit, seq, version = position.commit, position.seq, event.schema_version
        if event.table_schema is not None:
            return None  # a schema event: rare, and spelled by `encode`
        if not (
            type(op) is Op
            and type(origin) is Origin
            and type(name) is str
            and type(db) is str
            and type(schema) is str
            and type(table) is str
            and (dump_id is None or type(dump_id) is str)
            and (window_id is None or type(window_id) is str)
            and (txid is None or type(txid) is int)
            and (ts_ms is None or type(ts_ms) is int)
            and type(commit) is int
            and type(seq) is int
            and type(version) is int
            and type(position) is Position
        ):
            return None
        value = self._value
        before, after = event.before, event.after
        names = (name, db, schema, table)
        head = self._tables.get(names)
        if head is None:
            head = self._tables[names] = (
                f'{{"name":{_string(name)},"db":{_string(db)},"schema":{_string(schema)}'
                f',"table":{_string(table)},"position":['
            ).encode()
        return _LINE % (
            _OP_JSON[op],
            value(event.key),
            b"null" if before is None else value(before),
            b"null" if after is None else value(after),
            head,
            commit,
            seq,
            _ORIGIN_JSON[origin],
            b"null" if dump_id is None else _string(dump_id).encode(),
            b"null" if window_id is None else _string(window_id).encode(),
            b"null" if txid is None else b"%d" % txid,
            b"null" if ts_ms is None else b"%d" % ts_ms,
            version,
        )


def decode(line: str | bytes) -> Event:
    return Event.from_json(json.loads(line))
