"""The statements that apply a row event to its target table: an upsert of c/u/r, a delete of
d, by key; and the truncate of `t`.

Monotonic mode: a replay (the tailer re-sends everything after its last acknowledged position)
ends in the same state, since it repeats the same images in the same order; but while it catches
up, a key can go back to an older image for a moment. Monotonic mode rules that out, and any
other older image (a dump row older than what the target holds): it keeps the last applied
position of every key in `dblog_positions`, updated in the same statement as the row, and skips
an event whose position is not newer. Deleted keys keep their row there (marked `deleted`: a
tombstone), so an old image cannot bring a deleted row back. Tombstones older than a horizon no
older image can still come from are pruned (`prune_tombstones`, run by direct dumps: see
`core/direct.py`), so the table holds the live keys and the recent deletes. (Rows written before
the `deleted` column existed count as live and are never pruned.)

A JSON null and an SQL NULL arrive alike (None) and are written as SQL NULL. A column absent
from `after` (an unchanged TOAST value the source could not send) is left as it is in the
target.

Truncate (`t`): the target table is truncated in the batch's transaction. In monotonic mode the
truncate's position becomes the table's floor (a row of `dblog_positions` with the JSON key
`null`), its per-key rows are deleted, and every later statement also refuses an event at or
before the floor: no row positioned before the truncate comes back, whatever is replayed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from airflow_provider_dblog.core.event import Event, Op, Row, TableRef, key_of
from airflow_provider_dblog.core.position import Position
from airflow_provider_dblog.outputs.sql_apply.target import Target

POSITIONS_TABLE = "dblog_positions"

_CREATE_POSITIONS = sql.SQL(
    """CREATE TABLE IF NOT EXISTS {table} (
    source text NOT NULL,
    schema text NOT NULL,
    tbl text NOT NULL,
    key jsonb NOT NULL,
    commit numeric(20, 0) NOT NULL,
    seq int NOT NULL,
    deleted boolean NOT NULL DEFAULT false,
    PRIMARY KEY (source, schema, tbl, key)
)"""
).format(table=sql.Identifier(POSITIONS_TABLE))

# A positions table made before tombstones were marked: its rows count as live keys.
_ADD_DELETED = sql.SQL(
    "ALTER TABLE {table} ADD COLUMN IF NOT EXISTS deleted boolean NOT NULL DEFAULT false"
).format(table=sql.Identifier(POSITIONS_TABLE))
# The ALTER takes an exclusive lock even when the column exists: behind a stopped leader's
# open batch it would hang the new leader. So it runs only on a table made before the column.
_HAS_DELETED = sql.SQL(
    "SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass(%s) AND attname = 'deleted' "
    "AND NOT attisdropped"
)

_PRUNE_TOMBSTONES = sql.SQL(
    """DELETE FROM {table} WHERE source = %s AND schema = %s AND tbl = %s AND deleted
AND key <> 'null'::jsonb AND (commit, seq) < (%s::numeric, %s::int)"""
).format(table=sql.Identifier(POSITIONS_TABLE))

# The (only) CTE of a monotonic statement: records the event's position for its key if it is
# newer than the stored one and after the table's floor (its last truncate), and returns a row
# only then. A delete leaves its key's row marked `deleted`.
_NEWER = sql.SQL(
    """WITH newer AS (
    INSERT INTO {table} AS p (source, schema, tbl, key, commit, seq, deleted)
    SELECT e.* FROM (VALUES (%s, %s, %s, %s::jsonb, %s::numeric, %s::int, %s::boolean))
        AS e (source, schema, tbl, key, commit, seq, deleted)
    WHERE NOT EXISTS (
        SELECT FROM {table} f
        WHERE f.source = e.source AND f.schema = e.schema AND f.tbl = e.tbl
        AND f.key = 'null'::jsonb AND (f.commit, f.seq) >= (e.commit, e.seq)
    )
    ON CONFLICT (source, schema, tbl, key)
    DO UPDATE SET commit = EXCLUDED.commit, seq = EXCLUDED.seq, deleted = EXCLUDED.deleted
    WHERE (p.commit, p.seq) < (EXCLUDED.commit, EXCLUDED.seq)
    RETURNING 1
) """
).format(table=sql.Identifier(POSITIONS_TABLE))

# Raises a table's floor to a truncate's position; a row only if the truncate is newer.
_RAISE_FLOOR = sql.SQL(
    """INSERT INTO {table} AS p (source, schema, tbl, key, commit, seq)
VALUES (%s, %s, %s, 'null'::jsonb, %s::numeric, %s::int)
ON CONFLICT (source, schema, tbl, key)
DO UPDATE SET commit = EXCLUDED.commit, seq = EXCLUDED.seq
WHERE (p.commit, p.seq) < (EXCLUDED.commit, EXCLUDED.seq)
RETURNING 1"""
).format(table=sql.Identifier(POSITIONS_TABLE))

_DROP_KEY_POSITIONS = sql.SQL(
    "DELETE FROM {table} WHERE source = %s AND schema = %s AND tbl = %s AND key <> 'null'::jsonb"
).format(table=sql.Identifier(POSITIONS_TABLE))


def create_positions(conn: psycopg.Connection[Any]) -> None:
    """Make `dblog_positions` if missing (with its `deleted` column, added to an older one)."""
    conn.execute(_CREATE_POSITIONS)
    if conn.execute(_HAS_DELETED, (POSITIONS_TABLE,)).fetchone() is None:
        conn.execute(_ADD_DELETED)


Shape = tuple[TableRef, tuple[str, ...] | None]
"""What one statement serves: a target table, and the columns upserted (None: a delete)."""


@dataclass(frozen=True)
class Action:
    """One statement's worth of an event: upsert `values`, or delete `key` when values is None."""

    event: Event
    target: Target
    key: Row
    values: Row | None

    def shape(self) -> Shape:
        return self.target.ref, None if self.values is None else tuple(self.values)


def changed_key(event: Event, target: Target) -> Row | None:
    """The old key of an update that changed the primary key: that row must go."""
    if event.op is not Op.UPDATE or not event.before:
        return None
    if not all(c in event.before for c in target.key):
        return None
    if key_of(event.before, target.key) == key_of(event.key, target.key):
        return None
    return {c: event.before[c] for c in target.key}


class Statements:
    """The statement of each shape of action, built once and kept until `clear` (a target table
    described again may have other columns or types)."""

    def __init__(self, *, monotonic: bool) -> None:
        self.monotonic = monotonic
        self._built: dict[Shape, sql.Composed] = {}

    def clear(self) -> None:
        self._built.clear()

    def of(self, action: Action) -> sql.Composed:
        shape = action.shape()
        statement = self._built.get(shape)
        if statement is None:
            statement = self._built[shape] = self._build(action.target, shape[1])
        return statement

    def _build(self, target: Target, columns: tuple[str, ...] | None) -> sql.Composed:
        table = sql.Identifier(target.ref.schema, target.ref.name)
        newer = sql.SQL(" AND EXISTS (SELECT FROM newer)") if self.monotonic else sql.SQL("")
        prefix = _NEWER if self.monotonic else sql.SQL("")
        if columns is None:
            match = sql.SQL(" AND ").join(
                sql.SQL("{} = {}").format(sql.Identifier(c), target.placeholder(c))
                for c in target.key
            )
            return sql.SQL("{}DELETE FROM {} WHERE {}{}").format(prefix, table, match, newer)
        names = sql.SQL(", ").join(map(sql.Identifier, columns))
        values = sql.SQL(", ").join(target.placeholder(c) for c in columns)
        updates = [c for c in columns if c not in target.key]
        on_conflict: sql.Composable
        if updates:
            on_conflict = sql.SQL("DO UPDATE SET {}").format(
                sql.SQL(", ").join(
                    sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(c)) for c in updates
                )
            )
        else:
            on_conflict = sql.SQL("DO NOTHING")
        source = (
            sql.SQL("SELECT {} WHERE EXISTS (SELECT FROM newer)").format(values)
            if self.monotonic
            else sql.SQL("VALUES ({})").format(values)
        )
        return sql.SQL("{}INSERT INTO {} ({}) {} ON CONFLICT ({}) {}").format(
            prefix,
            table,
            names,
            source,
            sql.SQL(", ").join(map(sql.Identifier, target.key)),
            on_conflict,
        )

    def params(self, action: Action) -> list[Any]:
        params: list[Any] = []
        if self.monotonic:
            event = action.event
            params += [event.source.name, event.table.schema, event.table.name]
            params += [Jsonb(action.key), event.position.commit, event.position.seq]
            params.append(action.values is None)
        columns = action.target.columns
        if action.values is None:
            return params + [columns[c].adapt(action.key[c]) for c in action.target.key]
        return params + [
            None if v is None else columns[c].adapt(v) for c, v in action.values.items()
        ]

    def truncate(self, conn: psycopg.Connection[Any], event: Event, target: Target) -> None:
        """Apply a `t` event (see the module docstring)."""
        table = sql.Identifier(target.ref.schema, target.ref.name)
        if self.monotonic:
            where = (event.source.name, event.table.schema, event.table.name)
            position = (event.position.commit, event.position.seq)
            if conn.execute(_RAISE_FLOOR, (*where, *position)).fetchone() is None:
                return  # a replay: the floor is at or past it
            conn.execute(_DROP_KEY_POSITIONS, where)
        conn.execute(sql.SQL("TRUNCATE {}").format(table))


def prune_tombstones(
    conn: psycopg.Connection[Any], source_name: str, table: TableRef, before: Position
) -> int:
    """Forget the deleted keys of `table` positioned before `before`; how many were."""
    cur = conn.execute(
        _PRUNE_TOMBSTONES, (source_name, table.schema, table.name, before.commit, before.seq)
    )
    return max(cur.rowcount, 0)
