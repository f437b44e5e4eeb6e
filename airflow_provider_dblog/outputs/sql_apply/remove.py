"""Removing given keys from the SQL-apply target's tables: what a verify's repair does with the
keys the target holds and the source does not (`verify/repair.py`), which no event of the log
and no dump would remove. When it is safe to remove them is the repair's business; this module
only deletes, by key, with each value cast to its column's type as the output's statements do.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import TupleRow

from airflow_provider_dblog.core.event import Key, TableRef
from airflow_provider_dblog.libpq_tls import tls_refusal
from airflow_provider_dblog.outputs.base import OutputError, OutputUnavailable
from airflow_provider_dblog.outputs.sql_apply.target import Target, describe


class TargetKeys:
    """Removes keys of source tables from their target tables (`target_of` them), on one
    autocommit connection opened at once."""

    def __init__(
        self, dsn: str, target_of: Callable[[TableRef], TableRef], *, connect_timeout: int = 10
    ) -> None:
        self._target_of = target_of
        self._targets: dict[TableRef, Target] = {}
        try:
            self._conn: psycopg.Connection[TupleRow] = psycopg.connect(
                dsn, autocommit=True, connect_timeout=connect_timeout
            )
        except psycopg.OperationalError as exc:
            refused = tls_refusal(str(exc))
            if refused is not None:
                raise OutputError(f"cannot connect to the sql_apply target: {refused}") from None
            raise OutputUnavailable(f"cannot connect to the sql_apply target: {exc}") from None

    def remove(self, table: TableRef, keys: Sequence[Key]) -> int:
        """Delete the rows of `keys` (values in the target's key order, the source's) from the
        target table of `table`, in one statement; returns the rows deleted."""
        if not keys:
            return 0
        try:
            target = self._target(table)
            one = sql.SQL("({})").format(
                sql.SQL(", ").join(target.placeholder(c) for c in target.key)
            )
            statement = sql.SQL("DELETE FROM {} WHERE ({}) IN ({})").format(
                sql.Identifier(target.ref.schema, target.ref.name),
                sql.SQL(", ").join(sql.Identifier(c) for c in target.key),
                sql.SQL(", ").join([one] * len(keys)),
            )
            params: list[Any] = [
                target.columns[c].adapt(value)
                for key in keys
                for c, value in zip(target.key, key, strict=True)
            ]
            return self._conn.execute(statement, params).rowcount
        except psycopg.OperationalError as exc:
            raise OutputUnavailable(f"the sql_apply target went away: {exc}") from None

    def _target(self, table: TableRef) -> Target:
        target = self._targets.get(table)
        if target is None:
            target = self._targets[table] = describe(self._conn, table, self._target_of(table))
        return target

    def close(self) -> None:
        self._conn.close()
