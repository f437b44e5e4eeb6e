"""The change event, one format for log and dump events (its JSON encoding: `event_codec`).

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
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
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
    """Where an event comes from. Not a frozen dataclass, as `PlainEvent` is not: see there."""

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


class Event(ABC):
    """One change: what every consumer of events reads. Events are values: nothing changes one
    once it is built. Three kinds build them: `PlainEvent` holds its fields; a log row read
    together with its line (`EncodedLogEvent`) and a dump row stamped into its line
    (`core.encoded_rows.EncodedEvent`) carry the line an output writes as it is, and derive
    what they do not hold when asked (the tailer's thread builds them by the million)."""

    __slots__ = ()

    line: bytes | None = None
    """The event's line (`event_codec.encode_lines`'s, with its newline) when whoever built it
    spelled it already; None when the event is to be encoded."""

    @property
    @abstractmethod
    def op(self) -> Op: ...

    @property
    @abstractmethod
    def key(self) -> Row: ...

    @property
    @abstractmethod
    def before(self) -> Row | None: ...

    @property
    @abstractmethod
    def after(self) -> Row | None: ...

    @property
    @abstractmethod
    def source(self) -> SourceInfo: ...

    @property
    @abstractmethod
    def schema_version(self) -> int: ...

    @property
    def table_schema(self) -> TableSchema | None:
        """The new columns, on an `s` event only."""
        return None

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
        table_schema = self.table_schema
        if table_schema is not None:
            data["table_schema"] = table_schema.to_json()
        data["source"] = self.source.to_json()
        data["schema_version"] = self.schema_version
        return data


@dataclass(slots=True)
class PlainEvent(Event):
    """An event that holds each of its fields. Not a frozen dataclass only because the log
    path builds one per row change, with its `SourceInfo`, and a frozen dataclass's `__init__`
    costs about five times as much (it sets each field through `object.__setattr__`);
    `dataclasses.replace` makes another."""

    op: Op
    key: Row
    before: Row | None
    after: Row | None
    source: SourceInfo
    schema_version: int
    table_schema: TableSchema | None = None
    """The new columns, on an `s` event only (`table_event` and `from_json` check it; row
    events are built without a check, as they are built by the million)."""

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PlainEvent:
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


class LogOrigin:
    """What the row events of one table in one transaction share: their source but for the
    position. `txid` is None where the source's log names no transaction. Immutable by
    convention: a plain class, not a frozen dataclass, because a reader makes one for nearly
    every event of a load that spreads its transactions over many tables, and a frozen
    dataclass's construction cost a tenth of the reading thread's time there."""

    __slots__ = ("db", "name", "schema", "table", "table_name", "ts_ms", "txid", "txid_json")

    name: str
    db: str
    table: TableRef
    txid: int | None
    ts_ms: int
    schema: str
    """`table.schema` and `table.name`, read as a `SourceInfo`'s are (`Session.change`)."""
    table_name: str
    txid_json: bytes
    """`txid` as its line spells it: what `event_codec.log_line_format` takes for it."""

    def __init__(self, name: str, db: str, table: TableRef, txid: int | None, ts_ms: int) -> None:
        self.name = name
        self.db = db
        self.table = table
        self.txid = txid
        self.ts_ms = ts_ms
        self.schema = table.schema
        self.table_name = table.name
        self.txid_json = b"null" if txid is None else b"%d" % txid

    def for_table(self, table: TableRef) -> LogOrigin:
        """The origin of `table`'s row events in the same transaction."""
        if table == self.table:
            return self
        return LogOrigin(self.name, self.db, table, self.txid, self.ts_ms)

    def __repr__(self) -> str:
        return f"LogOrigin({self.name!r}, {self.db!r}, {self.table!r}, {self.txid}, {self.ts_ms})"


class EncodedLogEvent(Event):
    """A log row event that its reader built together with its line (with its newline), so
    the writer thread does not encode it again. It holds its row, position and `LogOrigin`;
    its `source` is built from them when asked for (the tailer reads `origin`, `position` and
    `txid` instead). Equal to the `PlainEvent` it encodes; the reader that builds one fills
    `event_codec.log_line_format` for its line (a property test pins it to `encode`'s)."""

    __slots__ = ("after", "before", "key", "line", "op", "origin", "position", "schema_version")

    line: bytes
    op: Op
    key: Row
    before: Row | None
    after: Row | None
    position: Position
    origin: LogOrigin
    schema_version: int

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
        self.position = position
        self.origin = origin
        self.schema_version = schema_version

    @property
    def source(self) -> SourceInfo:
        o = self.origin
        return SourceInfo(
            o.name,
            o.db,
            o.table.schema,
            o.table.name,
            self.position,
            Origin.LOG,
            None,
            None,
            o.txid,
            o.ts_ms,
        )

    @property
    def table(self) -> TableRef:
        return self.origin.table

    @property
    def txid(self) -> int | None:
        return self.origin.txid

    def event(self) -> PlainEvent:
        """The plain event this line encodes."""
        return PlainEvent(
            self.op, self.key, self.before, self.after, self.source, self.schema_version
        )

    def __eq__(self, other: object) -> bool:
        if isinstance(other, EncodedLogEvent):
            return self.event() == other.event()
        if isinstance(other, Event):
            return self.event() == other
        return NotImplemented

    def __repr__(self) -> str:
        return f"EncodedLogEvent({self.line[:-1].decode()!r})"


class RowsInLineLogEvent(EncodedLogEvent):
    """An `EncodedLogEvent` that reads its rows from its line when first asked for them: a
    reader that spelled them into the line need not keep them, and an output that writes the
    line does not pay for them (`LogLines.rows_in_lines`)."""

    __slots__ = ("_rows",)

    def __init__(
        self, line: bytes, op: Op, key: Row, position: Position, origin: LogOrigin, version: int
    ) -> None:
        self.line = line
        self.op = op
        self.key = key
        self.position = position
        self.origin = origin
        self.schema_version = version
        self._rows: tuple[Row | None, Row | None] | None = None

    @property
    def before(self) -> Row | None:  # type: ignore[override]
        return self._read()[0]

    @property
    def after(self) -> Row | None:  # type: ignore[override]
        return self._read()[1]

    def _read(self) -> tuple[Row | None, Row | None]:
        if self._rows is None:
            read = json.loads(self.line)
            self._rows = (read["before"], read["after"])
        return self._rows


def table_event(
    op: Op, source: SourceInfo, schema_version: int, table_schema: TableSchema | None = None
) -> PlainEvent:
    """A table-level event (`t` or `s`) of `source`'s table at its position."""
    if not op.is_table_level:
        raise ValueError(f"{op.value!r} is a row operation, not a table-level one")
    _check_table_schema(op, table_schema)
    return PlainEvent(op, {}, None, None, source, schema_version, table_schema)


def _check_table_schema(op: Op, table_schema: object) -> None:
    if (op is Op.SCHEMA) != (table_schema is not None):
        raise ValueError("a schema event, and only a schema event, carries table_schema")
