"""What the SQL of a binlog QUERY event says to the mapper (`changes.py`): a transaction's BEGIN
or end, a TRUNCATE of which table, or DDL and the tables it names.

Read from the statement's text as the server logged it, quoted names or not; a name that only
appears inside a longer name does not count.
"""

from __future__ import annotations

import re

from airflow_provider_dblog.core.event import TableRef

_BEGIN = re.compile(r"\s*BEGIN\s*;?\s*$", re.IGNORECASE)
_END = re.compile(r"\s*(COMMIT|ROLLBACK)\s*;?\s*$", re.IGNORECASE)
_DDL = re.compile(r"\s*(ALTER|CREATE|DROP|RENAME)\b", re.IGNORECASE)
_NAME = r"(`(?:[^`]|``)+`|[A-Za-z0-9_$]+)"
_TRUNCATE = re.compile(
    rf"\s*TRUNCATE\s+(?:TABLE\s+)?{_NAME}(?:\s*\.\s*{_NAME})?\s*;?\s*$", re.IGNORECASE
)


def is_begin(sql: str) -> bool:
    return _BEGIN.match(sql) is not None


def is_end(sql: str) -> bool:
    """A COMMIT or ROLLBACK: a non-transactional table's changes are logged either way."""
    return _END.match(sql) is not None


def is_ddl(sql: str) -> bool:
    return _DDL.match(sql) is not None


def truncated(sql: str, schema: str) -> TableRef | None:
    """The table a TRUNCATE statement empties (`schema` is the statement's default database);
    None for any other statement."""
    match = _TRUNCATE.match(sql)
    if match is None:
        return None
    first, second = match.groups()
    if second:
        return TableRef(_unquote(first), _unquote(second))
    return TableRef(schema, _unquote(first))


def names(sql: str, table: TableRef) -> bool:
    """Whether `sql` names `table` (quoted or not, qualified or not)."""
    name = re.escape(table.name)
    return re.search(rf"(?<![\w$]){name}(?![\w$])|`{name}`", sql, re.IGNORECASE) is not None


def _unquote(name: str) -> str:
    return name[1:-1].replace("``", "`") if name.startswith("`") else name
