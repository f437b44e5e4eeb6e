"""The change event, one format for log and dump events, and its stable JSON encoding.

`{"op", "key", "before", "after", "source": {...}, "schema_version"}` as in DESIGN.md. Row values
are already JSON values here: each source converts database values once, with one converter for
both the log and the dump, so the same row gives the same JSON whichever path it came by.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeAlias

from airflow_provider_dblog.core.position import Position

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


@dataclass(frozen=True, slots=True)
class SourceInfo:
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


@dataclass(frozen=True, slots=True)
class Event:
    op: Op
    key: Row
    before: Row | None
    after: Row | None
    source: SourceInfo
    schema_version: int

    @property
    def position(self) -> Position:
        return self.source.position

    @property
    def table(self) -> TableRef:
        return self.source.table_ref

    def key_value(self) -> Key:
        return tuple(freeze(v) for v in self.key.values())

    def to_json(self) -> dict[str, JsonValue]:
        return {
            "op": self.op.value,
            "key": self.key,
            "before": self.before,
            "after": self.after,
            "source": self.source.to_json(),
            "schema_version": self.schema_version,
        }

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
            return cls(
                op=Op(data["op"]),
                key=data["key"],
                before=data["before"],
                after=data["after"],
                source=source,
                schema_version=data["schema_version"],
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"not a DBLog event: missing or malformed {exc}") from None


def encode(event: Event) -> str:
    """One line of JSON. Field order is fixed and row columns keep table order, so the same
    event always encodes to the same bytes."""
    return json.dumps(event.to_json(), separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def decode(line: str | bytes) -> Event:
    return Event.from_json(json.loads(line))
