"""A captured table's columns as schema events carry them: names, types, nullability, defaults.

Source-neutral: types and defaults are text in the source's own SQL, as its catalog prints them,
so a target of the same database type can use them as they are.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Column:
    """One column as the source's SQL spells it: `type` as the catalog prints it (PostgreSQL
    `format_type`, MySQL `COLUMN_TYPE`), `default` the default expression's text (None: no
    default)."""

    name: str
    type: str
    nullable: bool
    default: str | None

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "type": self.type,
            "nullable": self.nullable,
            "default": self.default,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Column:
        name, type_, nullable, default = (
            data["name"],
            data["type"],
            data["nullable"],
            data["default"],
        )
        if not (
            isinstance(name, str)
            and isinstance(type_, str)
            and isinstance(nullable, bool)
            and (default is None or isinstance(default, str))
        ):
            raise ValueError(f"not a column description: {dict(data)!r}")
        return cls(name, type_, nullable, default)


@dataclass(frozen=True, slots=True)
class TableSchema:
    """A table's columns in table order and its primary-key columns in key order."""

    columns: tuple[Column, ...]
    key: tuple[str, ...]

    def __post_init__(self) -> None:
        names = [c.name for c in self.columns]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate column names in {names}")
        missing = [k for k in self.key if k not in names]
        if missing:
            raise ValueError(f"key columns {missing} are not columns of the table")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    @property
    def signature(self) -> tuple[tuple[str, str], ...]:
        """What a schema change is a change of: the columns' names, order and types.

        A log reader learns these from the log itself, as of the description's position, so a
        replay describes them alike. Nullability, defaults and the primary key come from the
        catalog when the description is read (pgoutput does not send them): they ride along,
        and a change of them alone is no schema change."""
        return tuple((c.name, c.type) for c in self.columns)

    def column(self, name: str) -> Column | None:
        return next((c for c in self.columns if c.name == name), None)

    def to_json(self) -> dict[str, Any]:
        return {"columns": [c.to_json() for c in self.columns], "key": list(self.key)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TableSchema:
        columns, key = data["columns"], data["key"]
        if not isinstance(columns, list) or not isinstance(key, list):
            raise ValueError(f"not a table schema: {dict(data)!r}")
        if not all(isinstance(k, str) for k in key):
            raise ValueError(f"key columns are names, got {key!r}")
        return cls(tuple(Column.from_json(c) for c in columns), tuple(key))
