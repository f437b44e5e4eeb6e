"""Making a PostgreSQL database a DBLog source, and checking that it is one.

`ensure_setup` creates what is missing (watermark schema and table with its one row, the
publication, the pgoutput slot) and is safe to run again; for a read-only source, only the slot
(the publication must exist: creating one takes owning the tables). `preflight` only reads,
and raises a SourceError subclass whose message says what to change. The `check_*` functions
are the pure rules, taking values read from the server. A session lost meanwhile raises
`SourceUnavailable`, any other refusal of the server (a missing grant) a one-line `SourceError`
(`errors.source_errors`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence

import psycopg
from psycopg import sql
from psycopg.rows import TupleRow

from airflow_provider_dblog.core.event import TableRef
from airflow_provider_dblog.sources.base import NoPrimaryKey, SourceError, UnknownTable
from airflow_provider_dblog.sources.postgres.config import PostgresSourceConfig
from airflow_provider_dblog.sources.postgres.errors import source_errors

_TABLE_FACTS = """
SELECT c.relkind::text,
       c.relreplident::text,
       EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary),
       ARRAY(
           SELECT format('%%I (%%s)', x.relname,
                         (SELECT string_agg(quote_ident(a.attname), ', ' ORDER BY k.ord)
                          FROM unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
                          JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = k.attnum))
           FROM pg_index i JOIN pg_class x ON x.oid = i.indexrelid
           WHERE i.indrelid = c.oid AND i.indisunique AND i.indimmediate AND i.indpred IS NULL
             AND i.indexprs IS NULL
             AND NOT EXISTS (
                 SELECT 1 FROM unnest(i.indkey) AS k(attnum)
                 JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = k.attnum
                 WHERE NOT a.attnotnull)
           ORDER BY x.relname)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %s AND c.relname = %s
"""
"""A table's kind, replica identity, whether it has a primary key, and the unique indexes
that could key it (immediate, not partial, on plain NOT NULL columns) as `name (columns)`."""

TableFacts = tuple[str, str, bool, list[str]]

_PUBLISHED = """
SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s
"""

PUBLISH = "insert, update, delete, truncate"
"""What the publication publishes: every row change, and TRUNCATE (a table-level event)."""

_PUBLISHED_OPERATIONS = """
SELECT pubinsert, pubupdate, pubdelete, pubtruncate FROM pg_publication WHERE pubname = %s
"""


def check_wal_level(wal_level: str) -> None:
    if wal_level != "logical":
        raise SourceError(
            f"wal_level is {wal_level!r}: set wal_level = logical in postgresql.conf "
            "(or ALTER SYSTEM SET wal_level = logical) and restart PostgreSQL"
        )


def check_server_encoding(encoding: str) -> None:
    if encoding != "UTF8":
        raise SourceError(f"the database encoding is {encoding}: DBLog reads UTF8 databases only")


def check_replication_role(role: str, can_replicate: bool) -> None:
    if not can_replicate:
        raise SourceError(
            f"role {role!r} may not replicate: ALTER ROLE {role} REPLICATION "
            "(and allow it in pg_hba.conf for replication connections)"
        )


def check_table(table: TableRef, facts: TableFacts | None) -> None:
    """`facts` is `_TABLE_FACTS`'s row, None when the table is unknown. A table is keyed by its
    primary key, or, without one, by its replica identity index: the unique index on NOT NULL
    columns that its updates and deletes carry in the log (`catalog.row_key`)."""
    if facts is None:
        raise UnknownTable(f"captured table {table} does not exist: create it or stop capturing it")
    kind, identity, has_primary_key, candidates = facts
    if kind not in ("r", "p"):
        raise UnknownTable(f"{table} is not a table (relkind {kind!r}): capture tables only")
    if not has_primary_key:
        if identity == "i":
            return
        if candidates:
            ways = "; ".join(
                f"ALTER TABLE {table} REPLICA IDENTITY USING INDEX {c.split(' ', 1)[0]}"
                for c in candidates
            )
            unique = f"its unique indexes on NOT NULL columns: {', '.join(candidates)}. Key it by "
            unique += f"one of them ({ways}), or add a primary key"
        else:
            unique = (
                "it has no unique index on NOT NULL columns either (a unique index on nullable "
                "columns cannot key rows: NULLs repeat). Add a primary key "
                f"(ALTER TABLE {table} ADD PRIMARY KEY (...)), or a unique index on NOT NULL "
                "columns and make it the replica identity"
            )
        raise NoPrimaryKey(
            f"captured table {table} has no primary key, and its replica identity names no "
            f"unique index: DBLog chunks and reconciles by a key; {unique}; or stop capturing it"
        )
    if identity not in ("d", "f"):
        raise SourceError(
            f"{table} has REPLICA IDENTITY {'NOTHING' if identity == 'n' else 'USING INDEX'}: "
            f"updates and deletes would not carry the primary key; "
            f"ALTER TABLE {table} REPLICA IDENTITY DEFAULT (or FULL)"
        )


def check_publication(
    publication: str, published: Collection[TableRef] | None, wanted: Iterable[TableRef]
) -> None:
    """`published` is None when the publication does not exist."""
    if published is None:
        tables = ", ".join(str(t) for t in wanted)
        raise SourceError(
            f"publication {publication!r} does not exist: run ensure_setup (dblog tail), or "
            f"have the tables' owner run CREATE PUBLICATION {publication} FOR TABLE {tables} "
            f"WITH (publish = '{PUBLISH}') (a read-only source does not create it)"
        )
    missing = [str(t) for t in wanted if t not in published]
    if missing:
        raise SourceError(
            f"publication {publication!r} lacks {', '.join(missing)}: run ensure_setup or "
            f"ALTER PUBLICATION {publication} ADD TABLE {', '.join(missing)}"
        )


def check_published_operations(publication: str, flags: tuple[bool, bool, bool, bool]) -> None:
    """`flags` is the publication's (insert, update, delete, truncate)."""
    missing = [op for op, on in zip(PUBLISH.split(", "), flags, strict=True) if not on]
    if missing:
        raise SourceError(
            f"publication {publication!r} does not publish {', '.join(missing)}: run "
            f"ensure_setup or ALTER PUBLICATION {publication} SET (publish = '{PUBLISH}')"
        )


def check_slot(slot: str, facts: tuple[str | None, str | None] | None, database: str) -> None:
    """`facts` is the slot's (plugin, database), None when the slot does not exist."""
    if facts is None:
        raise SourceError(f"replication slot {slot!r} does not exist: run ensure_setup")
    plugin, slot_database = facts
    if plugin != "pgoutput" or slot_database != database:
        raise SourceError(
            f"replication slot {slot!r} is a {plugin or 'physical'} slot of database "
            f"{slot_database}: it must be a pgoutput slot of {database}; pick another slot name"
        )


_MAY_SELECT = "SELECT has_table_privilege(quote_ident(%s) || '.' || quote_ident(%s), 'SELECT')"


def preflight(config: PostgresSourceConfig) -> None:
    """Raise the first reason `config` cannot be used as a source; return if it can."""
    with source_errors(f"cannot check source {config.name}"), config.connect() as conn:
        _check_server(conn)
        for table in config.tables:
            check_table(table, _table_facts(conn, table))
        if config.read_only:
            check_readable(_unreadable(conn, config.tables))
        elif _table_facts(conn, config.watermark) is None:
            raise SourceError(
                f"watermark table {config.watermark} does not exist: run ensure_setup"
            )
        check_publication(config.publication, _published(conn, config.publication), _wanted(config))
        check_published_operations(config.publication, _operations(conn, config.publication))
        check_slot(config.slot, _slot_facts(conn, config.slot), _database(conn))


def check_readable(unreadable: Sequence[TableRef]) -> None:
    """A read-only source's role reads the captured tables: `unreadable` are those it may not
    SELECT from."""
    if unreadable:
        names = ", ".join(str(t) for t in unreadable)
        raise SourceError(
            f"the role may not read {names}: GRANT SELECT ON {names} TO it (a read-only "
            "source needs SELECT on the captured tables and REPLICATION, nothing more)"
        )


_SETUP_LOCK = 431148003176
"""The advisory lock `ensure_setup` holds: two tailers starting at once would both find the
watermark table (or publication, or slot) missing, and the second's CREATE would fail; IF NOT
EXISTS does not make concurrent creations safe in PostgreSQL."""


def ensure_setup(config: PostgresSourceConfig) -> None:
    """Create the watermark table, publication and slot if missing; check everything else.
    A read-only source only gets its slot (REPLICATION is enough): the rest is checked. One
    setup at a time per server (`_SETUP_LOCK`, released with the connection)."""
    with source_errors(f"cannot set up source {config.name}"), config.connect() as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (_SETUP_LOCK,))
        if config.read_only:
            _ensure_slot(conn, config.slot)
            preflight(config)
            return
        _check_server(conn)
        for table in config.tables:
            check_table(table, _table_facts(conn, table))
        watermark = _identifier(config.watermark)
        conn.execute(
            sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(
                sql.Identifier(config.watermark_schema)
            )
        )
        conn.execute(
            sql.SQL("CREATE TABLE IF NOT EXISTS {} (id int PRIMARY KEY, value text)").format(
                watermark
            )
        )
        conn.execute(
            sql.SQL(
                "INSERT INTO {} (id, value) VALUES (1, NULL) ON CONFLICT (id) DO NOTHING"
            ).format(watermark)
        )
        if config.replica_identity_full:
            for table in config.tables:
                conn.execute(
                    sql.SQL("ALTER TABLE {} REPLICA IDENTITY FULL").format(_identifier(table))
                )
        wanted = _wanted(config)
        published = _published(conn, config.publication)
        publication = sql.Identifier(config.publication)
        if published is None:
            conn.execute(
                sql.SQL("CREATE PUBLICATION {} FOR TABLE {} WITH (publish = {})").format(
                    publication,
                    sql.SQL(", ").join(_identifier(t) for t in wanted),
                    sql.Literal(PUBLISH),
                )
            )
        else:
            if not all(_operations(conn, config.publication)):
                conn.execute(
                    sql.SQL("ALTER PUBLICATION {} SET (publish = {})").format(
                        publication, sql.Literal(PUBLISH)
                    )
                )
            missing = [t for t in wanted if t not in published]
            if missing:
                conn.execute(
                    sql.SQL("ALTER PUBLICATION {} ADD TABLE {}").format(
                        publication, sql.SQL(", ").join(_identifier(t) for t in missing)
                    )
                )
        _ensure_slot(conn, config.slot)


def _ensure_slot(conn: psycopg.Connection[TupleRow], slot: str) -> None:
    facts = _slot_facts(conn, slot)
    if facts is None:
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    else:
        check_slot(slot, facts, _database(conn))


def _wanted(config: PostgresSourceConfig) -> tuple[TableRef, ...]:
    """The tables the publication publishes: the captured ones and the watermark table."""
    return config.tables if config.read_only else (*config.tables, config.watermark)


def _unreadable(conn: psycopg.Connection[TupleRow], tables: Sequence[TableRef]) -> list[TableRef]:
    found = []
    for table in tables:
        row = conn.execute(_MAY_SELECT, (table.schema, table.name)).fetchone()
        if row is None or not row[0]:
            found.append(table)
    return found


def _check_server(conn: psycopg.Connection[TupleRow]) -> None:
    row = conn.execute(
        "SELECT current_setting('wal_level'), current_setting('server_encoding'), current_user,"
        " rolreplication OR rolsuper FROM pg_roles WHERE rolname = current_user"
    ).fetchone()
    assert row is not None
    wal_level, encoding, role, can_replicate = row
    check_wal_level(wal_level)
    check_server_encoding(encoding)
    check_replication_role(role, can_replicate)


def _identifier(table: TableRef) -> sql.Identifier:
    return sql.Identifier(table.schema, table.name)


def _table_facts(conn: psycopg.Connection[TupleRow], table: TableRef) -> TableFacts | None:
    row = conn.execute(_TABLE_FACTS, (table.schema, table.name)).fetchone()
    return None if row is None else (row[0], row[1], row[2], list(row[3]))


def _published(conn: psycopg.Connection[TupleRow], publication: str) -> set[TableRef] | None:
    exists = conn.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (publication,))
    if exists.fetchone() is None:
        return None
    return {TableRef(s, t) for s, t in conn.execute(_PUBLISHED, (publication,))}


def _operations(
    conn: psycopg.Connection[TupleRow], publication: str
) -> tuple[bool, bool, bool, bool]:
    row = conn.execute(_PUBLISHED_OPERATIONS, (publication,)).fetchone()
    assert row is not None  # checked to exist before
    return (row[0], row[1], row[2], row[3])


def _slot_facts(
    conn: psycopg.Connection[TupleRow], slot: str
) -> tuple[str | None, str | None] | None:
    row = conn.execute(
        "SELECT plugin, database FROM pg_replication_slots WHERE slot_name = %s", (slot,)
    ).fetchone()
    return None if row is None else (row[0], row[1])


def _database(conn: psycopg.Connection[TupleRow]) -> str:
    row = conn.execute("SELECT current_database()").fetchone()
    assert row is not None
    return str(row[0])
