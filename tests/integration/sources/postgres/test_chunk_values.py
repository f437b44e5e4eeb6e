"""A chunk read gives, value by value, the JSON the converters give for the text the server
prints, and the JSON the log gives: for every type the PostgreSQL source knows (and user types,
which stay text), NULLs, special values, TOAST-sized values, keyset bounds of a composite key.

`read_chunk` loads its result with psycopg's loaders, one per column (`loaders.py`); the reference
here is the text result converted with `convert`, as chunks were read before."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql
from psycopg.types.json import Jsonb

from airflow_provider_dblog.core.dump_plan import Chunk
from airflow_provider_dblog.core.event import EncodedLogEvent, Row, TableRef, key_of
from airflow_provider_dblog.core.log import Change, LogItem
from airflow_provider_dblog.devservices.postgres import PostgresInfo
from airflow_provider_dblog.lake.catalog import source_lake_schema
from airflow_provider_dblog.lake.schema import LakeSchemaError
from airflow_provider_dblog.sources.postgres import (
    PostgresChunkSource,
    PostgresLogReader,
    PostgresSourceConfig,
    ensure_setup,
)
from airflow_provider_dblog.sources.postgres.catalog import table_shape
from airflow_provider_dblog.sources.postgres.chunks import _raw_rows
from airflow_provider_dblog.sources.postgres.converters import convert
from tests.pg_helpers import read_until, wait_for

pytestmark = pytest.mark.integration

USER_TYPES = (
    "CREATE TYPE {s}.mood AS ENUM ('sad', 'ok', 'happy')",
    "CREATE DOMAIN {s}.posint AS int CHECK (VALUE > 0)",
    "CREATE DOMAIN {s}.flag AS bool",
    "CREATE DOMAIN {s}.label AS text",
    "CREATE TYPE {s}.pair AS (x int, y text)",
)

COLUMNS = {
    "i2": "smallint",
    "i4": "int",
    "i8": "bigint",
    "o": "oid",
    "num": "numeric",
    "num_p": "numeric(20, 6)",
    "f4": "real",
    "f8": "double precision",
    "t": "text",
    "vc": "varchar(20)",
    "bp": "char(5)",
    "ch": '"char"',
    "nm": "name",
    "by": "bytea",
    "b": "bool",
    "d": "date",
    "tm": "time",
    "ttz": "timetz",
    "ts": "timestamp(3)",
    "tstz": "timestamptz",
    "iv": "interval",
    "u": "uuid",
    "j": "json",
    "jb": "jsonb",
    "a_i2": "smallint[]",
    "a_i4": "int[]",
    "a_i8": "bigint[]",
    "a_o": "oid[]",
    "a_num": "numeric[]",
    "a_f4": "real[]",
    "a_f8": "double precision[]",
    "a_b": "bool[]",
    "a_t": "text[]",
    "a_vc": "varchar[]",
    "a_bp": "char(3)[]",
    "a_ch": '"char"[]',
    "a_nm": "name[]",
    "a_by": "bytea[]",
    "a_d": "date[]",
    "a_tm": "time[]",
    "a_ttz": "timetz[]",
    "a_ts": "timestamp[]",
    "a_tstz": "timestamptz[]",
    "a_iv": "interval[]",
    "a_u": "uuid[]",
    "a_j": "json[]",
    "a_jb": "jsonb[]",
    "mood": "{s}.mood",
    "a_mood": "{s}.mood[]",
    "d_int": "{s}.posint",
    "d_bool": "{s}.flag",
    "d_text": "{s}.label",
    "comp": "{s}.pair",
    "inet_col": "inet",
    "money_col": "money",
    "pt": "point",
    "rng": "int4range",
    "bits": "varbit",
    "tsv": "tsvector",
}
"""Column -> type; the key is (k text, n int), and `twice` is a generated column (never read)."""

BIG_TEXT = "".join(f"{i:06x}é" for i in range(20_000))  # ~140 kB, stored out of line
ROWS: list[dict[str, str | None]] = [
    {
        "k": "a",
        "n": "1",
        "i2": "7",
        "i4": "-42",
        "i8": "9007199254740993",
        "o": "12345",
        "num": "12345678901234567890.123456789",
        "num_p": "1.5",
        "f4": "1.1",
        "f8": "1.5e-7",
        "t": 'héllo "world" ✓ 🎉',
        "vc": "v",
        "bp": "ab",
        "ch": "q",
        "nm": "a name",
        "by": "\\x00ff10",
        "b": "true",
        "d": "2024-02-29",
        "tm": "12:34:56.789",
        "ttz": "12:34:56+02",
        "ts": "2024-02-29 23:59:59.5",
        "tstz": "2024-01-01 12:00:00+02",
        "iv": "1 year 2 mons 3 days 04:05:06.5",
        "u": "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
        "j": '{"b": [1, 2.5, null], "a": "x", "a": "dup"}',
        "jb": '{"b": [1, 2.50, null], "a": "x"}',
        "a_i2": "{1,NULL,-3}",
        "a_i4": "{1,NULL,3}",
        "a_i8": "{9223372036854775807}",
        "a_o": "{1,4294967295}",
        "a_num": "{1.10,NaN,-2}",
        "a_f4": "{0.1,NaN}",
        "a_f8": "{1.5,NULL,Infinity}",
        "a_b": "{t,f,NULL}",
        "a_t": '{"a b",NULL,"q\\"t","","NULL","a,b","{x}","back\\\\slash"}',
        "a_vc": "{x,y}",
        "a_bp": "{a,bc}",
        "a_ch": "{a,b}",
        "a_nm": '{"n 1",n2}',
        "a_by": '{"\\\\x00ff",NULL}',
        "a_d": "{2024-01-01,infinity}",
        "a_tm": "{00:00:01}",
        "a_ttz": "{00:00:01+01}",
        "a_ts": '{"2024-01-01 00:00:00"}',
        "a_tstz": '{"2024-01-01 00:00:00+05"}',
        "a_iv": '{"1 day",-00:00:01}',
        "a_u": "{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11}",
        "a_j": '{"{\\"a\\": 1, \\"a\\": 2}","[1, 2.0]",NULL}',
        "a_jb": '{"{\\"b\\": 1.50}","null"}',
        "mood": "happy",
        "a_mood": "{sad,ok}",
        "d_int": "5",
        "d_bool": "false",
        "d_text": "labelled",
        "comp": '(1,"a b")',
        "inet_col": "192.168.0.1/24",
        "money_col": "12.34",
        "pt": "(1,2)",
        "rng": "[1,10)",
        "bits": "101",
        "tsv": "a fat cat",
    },
    {"k": "a", "n": "2"},  # every other column NULL
    {
        "k": "b",
        "n": "1",
        "i2": "-32768",
        "i4": "2147483647",
        "i8": "-9223372036854775808",
        "o": "4294967295",
        "num": "NaN",
        "num_p": "-0.000001",
        "f4": "Infinity",
        "f8": "-Infinity",
        "t": "tab\there\nnewline \\ backslash 'quote' \u2028 \U0001f600",
        "vc": "",
        "bp": "",
        "ch": "x",
        "nm": "",
        "by": "\\x",
        "b": "false",
        "d": "0044-03-15 BC",
        "tm": "24:00:00",
        "ttz": "23:59:59.999999-14:59",
        "ts": "infinity",
        "tstz": "-infinity",
        "iv": "-1 year -2 mons +3 days -04:05:06.789",
        "u": "00000000-0000-0000-0000-000000000000",
        "j": '  {"big": 123456789012345678901234567890, "f": 1.0e2, "u": "\\u00e9"}  ',
        "jb": '{"n": 1.50, "e": 1e-3, "arr": [true, null], "s": "\\u00e9"}',
        "a_i4": "[0:2]={1,NULL,3}",
        "a_f8": "{NaN,-Infinity,-0,3}",
        "a_f4": "{-0,3,Infinity}",
        "a_t": "{}",
        "a_d": '{"0044-03-15 BC",-infinity}',
        "a_tstz": '{infinity,"1999-12-31 23:59:59.999999-08"}',
        "mood": "sad",
        "d_int": "2147483647",
        "d_bool": "true",
        "d_text": "",
        "comp": "(,)",
    },
    {
        "k": "b",
        "n": "2",
        "num": "Infinity",
        "num_p": "0",
        "f4": "3",
        "f8": "-0",
        "a_i4": "{{1,2},{3,4}}",
        "a_t": "{{a,b},{c,NULL}}",
        "a_num": "{-Infinity,0.000}",
        "jb": "[]",
        "j": "null",
    },
    {
        "k": "é",
        "n": "-1",
        "f8": "1e308",
        "f4": "1e-45",
        "num": "1e-20",
        "t": BIG_TEXT,
        "by": "\\x" + os.urandom(100_000).hex(),
        "jb": json.dumps({"items": list(range(10_000)), "text": BIG_TEXT}),
        "j": json.dumps([BIG_TEXT, 1.25]),
        "a_i4": "{" + ",".join(str(i) for i in range(30_000)) + "}",
        "a_t": "{" + ",".join(f'"{i} é"' for i in range(5_000)) + "}",
    },
]
KEY_ORDER = [("a", 1), ("a", 2), ("b", 1), ("b", 2), ("é", -1)]  # "é" sorts last in C and UTF-8


@dataclass(frozen=True)
class AllTypes:
    info: PostgresInfo
    config: PostgresSourceConfig
    table: TableRef


def column_types(schema: str) -> dict[str, str]:
    return {name: kind.format(s=schema) for name, kind in COLUMNS.items()}


@pytest.fixture
def all_types(postgres: PostgresInfo, monkeypatch: pytest.MonkeyPatch) -> Iterator[AllTypes]:
    """A table of every type with `ROWS` in it, in a schema of its own, and a source config whose
    slot is created (and dropped after) by `ensure_setup`; the rows are inserted after that, so
    the log carries them too."""
    tag = uuid.uuid4().hex[:10]
    schema, table = f"types_{tag}", TableRef(f"types_{tag}", "t")
    types = column_types(schema)
    definitions = ", ".join(f"{name} {kind}" for name, kind in types.items())
    with psycopg.connect(postgres.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
        for statement in USER_TYPES:
            conn.execute(statement.format(s=schema))
        conn.execute(
            f"CREATE TABLE {table} (k text, n int, {definitions}, "
            "twice int GENERATED ALWAYS AS (n * 2) STORED, PRIMARY KEY (k, n))"
        )
        for column in ("t", "by", "jb", "j", "a_i4", "a_t"):
            conn.execute(f"ALTER TABLE {table} ALTER COLUMN {column} SET STORAGE EXTERNAL")
    env = f"DBLOG_TEST_TYPES_{tag.upper()}"
    monkeypatch.setenv(env, postgres.password)
    config = PostgresSourceConfig(
        name="types",
        dsn=f"host={postgres.host} port={postgres.port} user={postgres.user} "
        f"dbname={postgres.dbname}",
        tables=(table,),
        password_env=env,
        slot=f"slot_{tag}",
        publication=f"pub_{tag}",
        watermark_schema=f"wm_{tag}",
    )
    ensure_setup(config)
    insert(config, table, {**types, "k": "text", "n": "int"}, ROWS)
    try:
        yield AllTypes(postgres, config, table)
    finally:
        with psycopg.connect(postgres.admin_dsn, autocommit=True) as conn:
            wait_for(
                lambda: (
                    not conn.execute(
                        "SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s AND active",
                        (config.slot,),
                    ).fetchall()[0][0]
                ),
                what=f"slot {config.slot} released",
            )
            conn.execute("SELECT pg_drop_replication_slot(%s)", (config.slot,))
            conn.execute(f"DROP PUBLICATION {config.publication}")
            conn.execute(f"DROP SCHEMA {schema}, {config.watermark_schema} CASCADE")


def insert(
    config: PostgresSourceConfig,
    table: TableRef,
    types: dict[str, str],
    rows: list[dict[str, str | None]],
) -> None:
    """Each row's values given as text, read by the column type's input function."""
    with config.connect() as conn, conn.transaction():
        for row in rows:
            names = list(row)
            statement = sql.SQL("INSERT INTO {} ({}) VALUES ({})").format(
                sql.Identifier(table.schema, table.name),
                sql.SQL(", ").join(sql.Identifier(n) for n in names),
                sql.SQL(", ").join(
                    sql.SQL("CAST(CAST(%s AS text) AS {})").format(sql.SQL(types[n])) for n in names
                ),
            )
            conn.execute(statement, [row[n] for n in names])


def converted(
    config: PostgresSourceConfig, table: TableRef, only_id: int | None = None
) -> list[Row]:
    """The table's rows (or the row whose `id` is `only_id`) as chunks were read before the
    loaders: the text result, each value through `convert` with its column's catalog type OID."""
    with config.connect() as conn:
        shape = table_shape(conn, table)
        query = sql.SQL("SELECT {} FROM {} WHERE {} ORDER BY {}").format(
            sql.SQL(", ").join(sql.Identifier(c.name) for c in shape.columns),
            sql.Identifier(table.schema, table.name),
            sql.SQL("true") if only_id is None else sql.SQL("id = %s"),
            sql.SQL(", ").join(sql.Identifier(c.name) for c in shape.key),
        )
        raw = _raw_rows(conn.execute(query, None if only_id is None else (only_id,)))
    return [
        {c.name: convert(c.type_oid, text) for c, text in zip(shape.columns, r, strict=True)}
        for r in raw
    ]


def assert_same_json(read: list[Row], expected: list[Row]) -> None:
    """Row by row, column by column, the same JSON (so 1 and 1.0, 1 and true, 1 and "1" differ),
    the columns in the same order."""
    assert len(read) == len(expected)
    for index, (got, want) in enumerate(zip(read, expected, strict=True)):
        assert list(got) == list(want)
        for column, value in want.items():
            assert json.dumps(got[column]) == json.dumps(value), (index, column)


def typed_rows(items: list[LogItem]) -> list[Row]:
    """The rows of the all-types table among the log's changes (not the watermark's)."""
    return [
        i.event.after
        for i in items
        if isinstance(i, Change)
        and i.event.after is not None
        and "twice" not in i.event.after
        and "k" in i.event.after
    ]


def all_rows_logged(items: list[LogItem]) -> bool:
    return len(typed_rows(items)) >= len(ROWS)


def test_every_type_reads_as_the_converters_and_the_log_give_it(all_types: AllTypes) -> None:
    source = PostgresChunkSource(all_types.config)
    reader = PostgresLogReader(all_types.config, idle_after=0.2)
    try:
        read = list(source.read_chunk(Chunk(all_types.table, 0)).rows)
        logged = [row for row in typed_rows(read_until(reader.items(), all_rows_logged))]
    finally:
        reader.close()
        source.close()
    assert [(r["k"], r["n"]) for r in read] == KEY_ORDER
    assert_same_json(read, converted(all_types.config, all_types.table))
    by_key = {(r["k"], r["n"]): r for r in logged if r is not None}
    assert_same_json(read, [by_key[key] for key in KEY_ORDER])
    first, nulls, edges, floats, toasted = read
    assert "twice" not in first
    assert set(nulls.values()) == {"a", 2, None}
    # What each kind of type becomes, so the comparisons above compare something.
    assert (first["i8"], first["o"], first["b"], first["f4"]) == (
        9007199254740993,
        12345,
        True,
        1.1,
    )
    assert first["num"] == "12345678901234567890.123456789" and first["bp"] == "ab   "
    assert first["by"] == "AP8Q" and first["j"] == {"b": [1, 2.5, None], "a": "dup"}
    assert first["a_t"] == ["a b", None, 'q"t', "", "NULL", "a,b", "{x}", "back\\slash"]
    assert first["a_by"] == ["AP8=", None] and first["a_j"] == [{"a": 2}, [1, 2.0], None]
    assert (first["mood"], first["a_mood"], first["d_int"], first["d_bool"]) == (
        "happy",
        "{sad,ok}",
        "5",
        "f",
    )
    assert (edges["num"], edges["f4"], edges["f8"], edges["d"]) == (
        "NaN",
        "Infinity",
        "-Infinity",
        "0044-03-15 BC",
    )
    assert edges["a_i4"] == [1, None, 3] and edges["a_f8"] == ["NaN", "-Infinity", -0.0, 3.0]
    assert json.dumps(floats["f4"]) == "3.0" and json.dumps(floats["f8"]) == "-0.0"
    assert floats["a_i4"] == [[1, 2], [3, 4]] and floats["j"] is None
    assert toasted["t"] == BIG_TEXT and len(toasted["a_i4"]) == 30_000


def test_updates_and_deletes_of_every_type_log_what_a_chunk_reads(all_types: AllTypes) -> None:
    """An update under the default identity logs the new row (an unchanged TOASTed value left
    out); under FULL identity the old row too; a delete logs the old row: each value as the
    chunk read gives it, and nearly all read straight from the bytes."""
    table = all_types.table
    source = PostgresChunkSource(all_types.config)
    reader = PostgresLogReader(all_types.config, idle_after=0.2)
    try:
        read = list(source.read_chunk(Chunk(table, 0)).rows)
        items = reader.items()
        read_until(items, all_rows_logged)
        with all_types.config.connect() as conn:
            conn.execute(f"UPDATE {table} SET n = n")
            # PostgreSQL 18 refuses FULL identity beside a generated column it does not publish.
            conn.execute(f"ALTER TABLE {table} DROP COLUMN twice, REPLICA IDENTITY FULL")
            conn.execute(f"UPDATE {table} SET n = n")
            conn.execute(f"DELETE FROM {table}")
        done = len(ROWS) * 3
        logged = [
            i.event
            for i in read_until(
                items, lambda seen: sum(isinstance(i, Change) for i in seen) >= done
            )
            if isinstance(i, Change)
        ]
    finally:
        reader.close()
        source.close()
    by_key = {(r["k"], r["n"]): r for r in read}
    ops = [e.op.value for e in logged]
    assert ops == ["u"] * len(ROWS) * 2 + ["d"] * len(ROWS)
    for event in logged:
        row = by_key[(event.key["k"], event.key["n"])]
        if event.after is not None:  # an update: every value sent, TOASTed ones may be left out
            assert_same_json([event.after], [{c: v for c, v in row.items() if c in event.after}])
            assert set(row) - set(event.after) <= {"twice", "t", "by", "jb", "j", "a_t", "a_i4"}
        if event.before is not None:  # FULL identity, and every delete: the whole old row
            assert_same_json([event.before], [{c: v for c, v in row.items() if c != "twice"}])
    from_bytes = [e for e in logged if isinstance(e, EncodedLogEvent)]
    assert len(from_bytes) >= len(ROWS) * 2  # the deletes and the rows without TOAST at least


def assert_same_lake_columns(
    source: PostgresChunkSource, config: PostgresSourceConfig, chunk: Chunk
) -> None:
    """A chunk read as text columns (the lake's direct dumps) gives the lake the same Arrow
    table as its rows read by the loaders, and the same last key."""
    schema = source_lake_schema(config, chunk.table)
    rows = source.read_chunk(chunk).rows
    text = source.read_chunk_text(chunk)
    assert text.rows == len(rows)
    by_rows, by_text = schema.values_to_arrow(rows), schema.values_from_text(text.columns)
    assert by_text.schema == by_rows.schema
    for name in by_rows.column_names:  # repr: NaN equals NaN, 1 differs from 1.0 and True
        assert repr(by_text[name].to_pylist()) == repr(by_rows[name].to_pylist()), name
    assert text.last_key == (key_of(rows[-1], source.key_columns(chunk.table)) if rows else None)


def test_every_type_reads_into_the_lake_alike_by_columns_and_by_rows(all_types: AllTypes) -> None:
    """The lake refuses the row of two-dimensional arrays (`("b", 2)`) whichever way it is read;
    every other row, TOAST-sized included, gives the same columns."""
    table = all_types.table
    flat = tuple(key for key in KEY_ORDER if key != ("b", 2))
    source = PostgresChunkSource(all_types.config)
    try:
        assert_same_lake_columns(source, all_types.config, Chunk(table, 0, keys=flat))
        middle = Chunk(table, 1, after=KEY_ORDER[0], upto=KEY_ORDER[2])
        assert_same_lake_columns(source, all_types.config, middle)
        assert_same_lake_columns(source, all_types.config, Chunk(table, 2, limit=2))
        nothing = Chunk(table, 3, after=KEY_ORDER[-1])
        assert source.read_chunk_text(nothing).rows == 0
        assert_same_lake_columns(source, all_types.config, nothing)
        schema = source_lake_schema(all_types.config, table)
        two_dimensions = Chunk(table, 4, keys=(("b", 2),))
        with pytest.raises(LakeSchemaError, match="a_i4"):
            schema.values_to_arrow(source.read_chunk(two_dimensions).rows)
        with pytest.raises(LakeSchemaError, match="a_i4"):
            schema.values_from_text(source.read_chunk_text(two_dimensions).columns)
    finally:
        source.close()


def test_keyset_bounds_on_the_composite_key_read_the_same_rows(all_types: AllTypes) -> None:
    source = PostgresChunkSource(all_types.config)
    try:
        everything = list(source.read_chunk(Chunk(all_types.table, 0)).rows)
        split = source.split_keys(all_types.table, None, ("é", -1), 2, 5)
        assert split == [("a", 2), ("b", 2)]
        chunks = [
            Chunk(all_types.table, 1, upto=split[0]),
            Chunk(all_types.table, 2, after=split[0], upto=split[1]),
            Chunk(all_types.table, 3, after=split[1], upto=("é", -1)),
        ]
        walked = [row for chunk in chunks for row in source.read_chunk(chunk).rows]
        limited = source.read_chunk(Chunk(all_types.table, 4, after=("a", 1), limit=2)).rows
        picked = source.read_chunk(Chunk(all_types.table, 5, keys=(("b", 1), ("a", 1)))).rows
    finally:
        source.close()
    assert_same_json(walked, everything)
    assert_same_json(list(limited), everything[1:3])
    assert_same_json(list(picked), [everything[0], everything[2]])


# --- generated values ----------------------------------------------------------------------

TEXTS = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"))
JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | TEXTS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXTS, inner, max_size=4),
    max_leaves=10,
)
GENERATED = {
    "t": ("text", TEXTS),
    "f8": ("float8", st.floats()),
    "f4": ("real", st.floats(width=32)),
    "by": ("bytea", st.binary(max_size=64)),
    "jb": ("jsonb", JSON_VALUES.map(Jsonb)),
    "a_t": ("text[]", st.lists(st.none() | TEXTS, max_size=5)),
    "a_f8": ("float8[]", st.lists(st.none() | st.floats(), max_size=5)),
    "i8": ("bigint", st.integers(-(2**63), 2**63 - 1)),
    "b": ("bool", st.booleans()),
}


@pytest.fixture
def generated_table(pg15: PostgresInfo, monkeypatch: pytest.MonkeyPatch) -> Iterator[AllTypes]:
    table = TableRef("public", f"gen_{uuid.uuid4().hex[:10]}")
    definitions = ", ".join(f"{name} {kind}" for name, (kind, _) in GENERATED.items())
    with psycopg.connect(pg15.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (id serial PRIMARY KEY, {definitions})")
    monkeypatch.setenv("DBLOG_TEST_GEN_PASSWORD", pg15.password)
    config = PostgresSourceConfig(
        name="gen",
        dsn=f"host={pg15.host} port={pg15.port} user={pg15.user} dbname={pg15.dbname}",
        tables=(table,),
        password_env="DBLOG_TEST_GEN_PASSWORD",
    )
    yield AllTypes(pg15, config, table)
    with psycopg.connect(pg15.dsn, autocommit=True) as conn:
        conn.execute(f"DROP TABLE {table}")


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(values=st.fixed_dictionaries({name: strategy for name, (_, strategy) in GENERATED.items()}))
def test_generated_values_read_as_the_converters_give_them(
    generated_table: AllTypes, values: dict[str, Any]
) -> None:
    table = generated_table.table
    names = list(values)
    with generated_table.config.connect() as conn:
        row = conn.execute(
            sql.SQL("INSERT INTO {} ({}) VALUES ({}) RETURNING id").format(
                sql.Identifier(table.schema, table.name),
                sql.SQL(", ").join(sql.Identifier(n) for n in names),
                sql.SQL(", ").join(sql.Placeholder() for _ in names),
            ),
            [values[n] for n in names],
        ).fetchone()
    assert row is not None
    source = PostgresChunkSource(generated_table.config)
    try:
        read = list(source.read_chunk(Chunk(table, 0, keys=((row[0],),))).rows)
    finally:
        source.close()
    assert_same_json(read, converted(generated_table.config, table, row[0]))
    source = PostgresChunkSource(generated_table.config)
    try:
        assert_same_lake_columns(source, generated_table.config, Chunk(table, 0, keys=((row[0],),)))
    finally:
        source.close()
