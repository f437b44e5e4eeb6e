"""`ChunkSource.check_keys` and `check_ready` on PostgreSQL: key values cast by the server to
their columns' types and normalised as the log converts them, a refused value named with its
column and type; a source with no watermark table answered with what to run."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator

import psycopg
import pytest

from airflow_provider_dblog.core.event import TableRef
from airflow_provider_dblog.devservices.postgres import PostgresInfo
from airflow_provider_dblog.sources.base import InvalidKey, NoPrimaryKey, NotSetUp, UnknownTable
from airflow_provider_dblog.sources.postgres.chunks import PostgresChunkSource
from airflow_provider_dblog.sources.postgres.config import PostgresSourceConfig

pytestmark = pytest.mark.integration
INTS = TableRef("public", "ints")
MIXED = TableRef("public", "mixed")
BYTES = TableRef("public", "bytes")


@pytest.fixture(scope="module")
def chunks(pg15: PostgresInfo) -> Iterator[PostgresChunkSource]:
    """A database with keys of several types and no watermark table (no tailer ever ran)."""
    db = f"checks_{secrets.token_hex(4)}"
    with psycopg.connect(pg15.admin_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {db} OWNER {pg15.user}")
    base = pg15.dsn.rsplit("/", 1)[0]
    with psycopg.connect(f"{base}/{db}", autocommit=True) as conn:
        conn.execute("CREATE TABLE ints (id int PRIMARY KEY)")
        conn.execute(
            "CREATE TABLE mixed (region text, day date, id uuid, flag boolean, "
            "PRIMARY KEY (region, day, id, flag))"
        )
        conn.execute("CREATE TABLE bytes (b bytea PRIMARY KEY)")
        conn.execute("CREATE TABLE loose (v int)")
    config = PostgresSourceConfig(
        name="checks",
        dsn=f"host={pg15.host} port={pg15.port} dbname={db} user={pg15.user}",
        tables=(INTS, MIXED, BYTES),
        password_env="CHECKS_PASSWORD",
    )
    os.environ["CHECKS_PASSWORD"] = pg15.password
    source = PostgresChunkSource(config)
    try:
        yield source
    finally:
        source.close()
        with psycopg.connect(pg15.admin_dsn, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE {db} WITH (FORCE)")


def test_keys_are_normalised_as_the_log_converts_them(chunks: PostgresChunkSource) -> None:
    assert chunks.check_keys(INTS, [("7",), (7,), (" 007 ",), ("8",)]) == ((7,), (8,))
    uid = "A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11"
    assert chunks.check_keys(
        MIXED, [("eu", "2024-1-2", uid, "yes"), ("eu", "2024-01-02", uid.lower(), True)]
    ) == (("eu", "2024-01-02", uid.lower(), True),)
    # bytea as events carry it (base64) or as PostgreSQL spells it (hex).
    assert chunks.check_keys(BYTES, [("AQI=",), ("\\x0102",)]) == (("AQI=",),)
    assert chunks.check_keys(INTS, []) == ()


@pytest.mark.parametrize(
    ("table", "key", "named"),
    [
        (INTS, ("abc",), "'abc' is not a valid integer for column id of public.ints"),
        (INTS, ("99999999999",), "'99999999999' is not a valid integer for column id"),
        (INTS, (1.5,), "1.5 is not a valid integer for column id"),
        (
            MIXED,
            ("eu", "2024-13-01", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", True),
            "'2024-13-01' is not a valid date for column day",
        ),
        (MIXED, ("eu", "2024-01-01", "nope", True), "'nope' is not a valid uuid for column id"),
        (
            MIXED,
            ("eu", "2024-01-01", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "maybe"),
            "'maybe' is not a valid boolean for column flag",
        ),
        (BYTES, ("***",), "is not a valid bytea for column b"),
    ],
)
def test_a_refused_value_is_named_with_its_column_and_type(
    chunks: PostgresChunkSource, table: TableRef, key: tuple[object, ...], named: str
) -> None:
    good = ("1",) if table == INTS else None
    keys = [k for k in (good, key) if k is not None]
    with pytest.raises(InvalidKey, match=r"^key value ") as refused:
        chunks.check_keys(table, keys)
    assert named in str(refused.value)
    assert "\n" not in str(refused.value)


def test_unknown_table_no_primary_key_and_arity(chunks: PostgresChunkSource) -> None:
    with pytest.raises(UnknownTable):
        chunks.check_keys(TableRef("public", "nope"), [("1",)])
    with pytest.raises(NoPrimaryKey):
        chunks.check_keys(TableRef("public", "loose"), [("1",)])
    with pytest.raises(InvalidKey, match="has 1 value"):
        chunks.check_keys(MIXED, [("eu",)])


def test_a_source_without_its_watermark_table_says_what_to_run(
    chunks: PostgresChunkSource,
) -> None:
    with pytest.raises(NotSetUp, match="dblog tail"):
        chunks.check_ready()
