"""A verify request from what a person gave, checked whole before anything is stored.

What to verify is said as a dump says it, and checked by the dump's own checks
(`dump/request.build_request`): the tables (all captured ones, or one), a key list of one table,
a filter on one table. A verify also takes a key range of one table (`after` < key <= `upto`,
either bound optional), each bound checked as a key of the list would be, and the target,
which must be one the deployment has, that verify can read, and that holds every table named,
keyed as the source keys it, and can run the filter: a filter runs on both sides.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from airflow_provider_dblog.config import Config
from airflow_provider_dblog.core.errors import InvalidRequest
from airflow_provider_dblog.core.event import JsonValue, Key, TableRef, freeze
from airflow_provider_dblog.dump.request import build_request, checked_keys
from airflow_provider_dblog.sources.base import ChunkSource
from airflow_provider_dblog.verify.reader import TargetReader
from airflow_provider_dblog.verify.targets import check_target

DEFAULT_CHUNK_SIZE = 50_000
"""Rows a verify chunk reads on each side: two reads and three log points a chunk, and no row
passes the tailer, so chunks can be larger than a sequenced dump's. A chunk also waits for the
target to have applied the log through its hw (up to the tailer's `checkpoint_s` and more),
which a large chunk spreads over its rows; both sides' rows of a chunk are held at once."""


@dataclass(frozen=True)
class VerifyRequest:
    verify_id: str
    tables: tuple[TableRef, ...]
    key_columns: Mapping[TableRef, tuple[str, ...]]
    target: str
    chunk_size: int
    keys: tuple[Key, ...] | None = None
    where: str | None = None
    after: Key | None = None
    upto: Key | None = None
    read_only: bool = False
    parallelism: int = 1
    """Chunks of a table verified at once, each its own window (`runner.py`)."""

    def to_json(self) -> dict[str, JsonValue]:
        return {
            "tables": [str(t) for t in self.tables],
            "key_columns": {str(t): list(c) for t, c in self.key_columns.items()},
            "target": self.target,
            "chunk_size": self.chunk_size,
            "keys": None if self.keys is None else [list(k) for k in self.keys],
            "where": self.where,
            "after": None if self.after is None else list(self.after),
            "upto": None if self.upto is None else list(self.upto),
            "read_only": self.read_only,
            "parallelism": self.parallelism,
        }

    @classmethod
    def from_json(cls, verify_id: str, data: Mapping[str, JsonValue]) -> VerifyRequest:
        def key(value: JsonValue) -> Key | None:
            return None if value is None else tuple(freeze(v) for v in value)

        keys = data["keys"]
        return cls(
            verify_id,
            tuple(TableRef.parse(t) for t in data["tables"]),
            {TableRef.parse(t): tuple(c) for t, c in data["key_columns"].items()},
            data["target"],
            int(data["chunk_size"]),
            None if keys is None else tuple(tuple(freeze(v) for v in k) for k in keys),
            data["where"],
            key(data["after"]),
            key(data["upto"]),
            bool(data["read_only"]),
            int(data.get("parallelism", 1)),
        )

    def describe(self) -> str:
        """What the run verifies, for its report's first line."""
        tables = ", ".join(str(t) for t in self.tables)
        if self.keys is not None:
            tables += f" ({len(self.keys)} keys)"
        if self.after is not None or self.upto is not None:
            low = "" if self.after is None else f"{list(self.after)} < "
            high = "" if self.upto is None else f" <= {list(self.upto)}"
            tables += f" ({low}key{high})"
        if self.where is not None:
            tables += f" where {self.where}"
        return f"{tables} against {self.target}"


def build_verify_request(
    config: Config,
    source: ChunkSource,
    *,
    verify_id: str,
    table: str | None,
    keys: str | None,
    where: str | None,
    after: str | None,
    upto: str | None,
    chunk_size: int | None,
    target: str,
    reader: TargetReader | None = None,
    parallelism: int = 1,
) -> VerifyRequest:
    """The request checked: the dump's checks of the tables, keys and filter (and the source
    being set up), then the range's bounds, then the target (`reader`, when given, must hold
    each table keyed as the source keys it, and run the filter the source accepted). Raises
    `InvalidRequest` (or the source's error) naming what is wrong."""
    check_target(config, target)
    ranged = after is not None or upto is not None
    if ranged and (table is None or keys is not None):
        raise InvalidRequest("a key range (after, upto) needs exactly one table and no keys")
    request, key_columns = build_request(
        config,
        source,
        dump_id=verify_id,
        tables=None if table is None else [table],
        keys=keys,
        chunk_size=chunk_size or DEFAULT_CHUNK_SIZE,
        parallelism=parallelism,
        mode="sequenced",
        where=where,
    )
    bounds: list[Key | None] = []
    for name, text in (("after", after), ("upto", upto)):
        bound = None if text is None else _bound(source, request.tables[0], key_columns, name, text)
        bounds.append(bound)
    if reader is not None:
        for ref in request.tables:
            reader.check_table(ref, key_columns[ref])
            if request.where is not None:
                reader.check_filter(ref, request.where)
    return VerifyRequest(
        verify_id,
        request.tables,
        key_columns,
        target,
        request.chunk_size,
        request.keys if keys is not None else None,
        request.where,
        bounds[0],
        bounds[1],
        request.read_only,
        request.parallelism,
    )


def _bound(
    source: ChunkSource,
    table: TableRef,
    key_columns: Mapping[TableRef, tuple[str, ...]],
    name: str,
    text: str,
) -> Key:
    """One key, as `--keys` takes one: `7`, or JSON `["eu", 7]` for a composite key."""
    columns = key_columns[table]
    given = f"[{text}]" if text.strip().startswith("[") else text
    try:
        parsed = checked_keys(source, table, given, columns)
    except InvalidRequest as exc:
        raise InvalidRequest(f"{name}: {exc}") from None
    if len(parsed) != 1:
        raise InvalidRequest(f"{name} must be one key of {table}, got {text!r}")
    return parsed[0]
