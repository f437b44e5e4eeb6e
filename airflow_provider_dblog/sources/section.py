"""What every source type's `[source]` section shares: the required keys, the value types, the
captured tables, the password's variable and the watermark table's place.

Each type's configuration (`postgres/config.py`, `mysql/config.py`) checks its own options and
calls these for the rest, so a mistake common to all types is named the same way for each.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

from airflow_provider_dblog.core.event import TableRef
from airflow_provider_dblog.sources.base import SourceError

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_WHAT = {int: "an integer", bool: "true or false", str: "text", dict: "a table of names"}


def read_section(
    section: Mapping[str, Any],
    config_class: type,
    *,
    kind: str,
    typed: Mapping[str, type] | None = None,
    table_word: str,
    default_schema: str | None,
) -> tuple[dict[str, Any], tuple[TableRef, ...]]:
    """The section's options but `type` and `tables`, and its tables as `TableRef`s.

    Options are the fields of `config_class`; each is text unless `typed` says otherwise.
    Tables without a `table_word` ('schema', 'database') are in `default_schema`."""
    for required in ("name", "dsn", "tables"):
        if required not in section:
            raise SourceError(f"[source] needs '{required}'")
    fields = {f.name for f in dataclasses.fields(config_class)}
    unknown = sorted(set(section) - fields - {"type"})
    if unknown:
        raise SourceError(
            f"[source] has unknown option(s) {', '.join(unknown)}; "
            f"known for {kind}: {', '.join(sorted(fields))}"
        )
    for name, value in section.items():
        wanted = (typed or {}).get(name, str)
        wrong_bool = isinstance(value, bool) and wanted is not bool
        if name not in ("type", "tables") and (not isinstance(value, wanted) or wrong_bool):
            raise SourceError(f"[source] {name} must be {_WHAT[wanted]}, got {value!r}")
    tables = section["tables"]
    if (
        isinstance(tables, str)
        or not isinstance(tables, list | tuple)
        or not all(isinstance(t, str) for t in tables)
    ):
        raise SourceError(f"[source] tables must be a list of '{table_word}.table', got {tables!r}")
    try:
        refs = tuple(TableRef.parse(t, default_schema=default_schema) for t in tables)
    except ValueError as exc:
        raise SourceError(f"[source] tables: {exc}") from None
    return {k: v for k, v in section.items() if k not in ("type", "tables")}, refs


def check_common(
    *,
    label: str,
    name: str,
    password_env: str | None,
    tables: tuple[TableRef, ...],
    watermark: TableRef,
    table_word: str,
) -> None:
    """The checks every source's configuration makes; `label` names the source type."""
    if not name:
        raise SourceError(f"the {label} source needs a name (it goes into every event)")
    if password_env is not None and not _ENV_NAME.fullmatch(password_env):
        raise SourceError(f"password_env must name an environment variable: {password_env!r}")
    if not tables:
        raise SourceError(f"the {label} source captures no table: list at least one")
    if not all(isinstance(t, TableRef) for t in tables):
        raise SourceError(f"tables must be TableRef values ('{table_word}.table')")
    if len(set(tables)) != len(tables):
        raise SourceError("a captured table is listed twice")
    if watermark in tables:
        raise SourceError(f"the watermark table {watermark} cannot also be captured")
