"""Schema evolution in the compaction: a lake table created for a table the lake does not hold
yet, and the run's schema events (`s`) folded into a table before its rows.

A schema event adds (ADD COLUMN) the columns the last schema event folded into the table did not
list, even those the table has already (created from the source's catalog after the ALTER, by a
direct dump or by the compaction); at the table's first, the columns the table lacks or holds
unfolded (a direct dump gave the table rows without them: `LakeTable.unfolded`). A constant
default is written into the rows positioned before the event (other defaults leave them null),
and rows of the run positioned before it get it too, partial ones included
(`table_fold.lake_row`); each column added is recorded with the event's position and its
constant default (`LakeTable.folded`: for a direct chunk read before the event and committed
after the fold, and for a run started again after one that died past the record), then the event
itself (`LakeTable.fold_schema`). Every step can be done again, so a run that dies between them
converges when started again. A column the source dropped stays in the lake, null in rows
written whole after the drop (an update folded without an earlier image of its row keeps the
stored value there, as it keeps an unchanged TOASTed one); a type change keeps the lake column's
type (a value it cannot hold stops the run, saying to rebuild the table).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from airflow_provider_dblog.compaction.rules import SCHEMA, Change
from airflow_provider_dblog.core.event import JsonValue, TableRef
from airflow_provider_dblog.core.position import Position
from airflow_provider_dblog.core.schema import TableSchema
from airflow_provider_dblog.lake.schema import LakeSchema, LakeSchemaError, lake_column, lake_schema
from airflow_provider_dblog.lake.table import LakeTable

Describe = Callable[[TableRef], LakeSchema]
"""A table's lake schema from the source's catalog."""


@dataclass(frozen=True, slots=True)
class AddedColumn:
    """A column whose ADD the compaction folded: where, and the value older rows hold."""

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


def schema_changes(changes: Iterable[Change]) -> list[tuple[Position, TableSchema]]:
    """A table's `s` events of the run, in position order."""
    found = [
        (Position(c.commit, c.seq), TableSchema.from_json(c.after))
        for c in changes
        if c.op == SCHEMA and c.after is not None
    ]
    return sorted(found, key=lambda pair: pair[0])


def new_table(
    output: Path,
    table: TableRef,
    changes: list[Change],
    describe: Describe | None,
    source_type: str,
) -> LakeTable:
    """A new lake table: the catalog's schema, or else the run's first schema event's."""
    if describe is not None:
        schema = describe(table)
    else:
        described = schema_changes(changes)
        if not described:
            raise LakeSchemaError(
                f"no schema for {table}: the run has no schema event of it and no source "
                "catalog was given (pass --config)"
            )
        schema = lake_schema(source_type, table, described[0][1])
    return LakeTable.open_or_create(output, table, schema)


def evolve(lake: LakeTable, changes: list[Change]) -> dict[str, AddedColumn]:
    """Fold the run's schema events of the table into it; every ADD folded so far, by column:
    this run's, and those of earlier runs (one that died may have folded this run's events
    already): rows of the run positioned before an ADD that lack its column hold its default."""
    added = {
        name: AddedColumn((at.commit, at.seq), default)
        for name, (at, default) in lake.added().items()
    }
    for position, described in schema_changes(changes):
        _fold_schema(lake, position, described, added)
    return added


def _fold_schema(
    lake: LakeTable, position: Position, described: TableSchema, added: dict[str, AddedColumn]
) -> None:
    """Fold one schema event: the columns it adds get their constant default in the rows
    positioned before it. It adds the columns the last schema event folded did not list,
    and at the table's first the columns the table lacks or holds unfolded (the others
    were there before the log first described the table). An event at or before the last
    one folded was folded by a run that died before its rows' commit."""
    last = lake.folded_schema
    if last is not None and position <= last.at:
        return
    new = [lake_column(lake.schema.source, c.name, c.type) for c in described.columns]
    lake.add_columns(new)
    unfolded = lake.unfolded
    for column in new:
        if column.name not in unfolded and (last is None or column.name in last.columns):
            continue
        described_column = described.column(column.name)
        default = constant_default(described_column.default if described_column else None)
        added[column.name] = AddedColumn((position.commit, position.seq), default)
        if default is not None:
            lake.fill(column, default, position)
        lake.folded(column.name, position, default)
    lake.fold_schema(position, (c.name for c in new))
