"""The pure parts of the PostgreSQL source: the pgoutput decoder (on bytes built here), the
value converters, the config checks and the preflight rules."""

from __future__ import annotations

import struct

import pytest

from airflow_provider_dblog.core.event import TableRef
from airflow_provider_dblog.sources.base import (
    NoPrimaryKey,
    SourceError,
    UnknownTable,
)
from airflow_provider_dblog.sources.postgres import (
    pgoutput,
    setup,
)
from airflow_provider_dblog.sources.postgres.config import PostgresSourceConfig
from airflow_provider_dblog.sources.postgres.converters import convert, parse_array, to_text
from airflow_provider_dblog.sources.postgres.pgoutput import (
    UNCHANGED_TOAST,
    Begin,
    Column,
    Commit,
    DecodeError,
    Delete,
    Insert,
    OriginMessage,
    Relation,
    Truncate,
    Type,
    Update,
    decode,
)
from tests.unit.pgoutput_bytes import PG_TS, TOAST, cstr, tuple_data

pytestmark = pytest.mark.unit

# --- pgoutput -----------------------------------------------------------------------------


def test_begin_and_commit() -> None:
    begin = decode(b"B" + struct.pack("!QqI", 0x1_0000_0010, PG_TS, 742))
    assert begin == Begin(0x1_0000_0010, PG_TS + pgoutput.PG_EPOCH_MICROS, 742)
    commit = decode(b"C" + struct.pack("!BQQq", 0, 0x1_0000_0010, 0x1_0000_0040, PG_TS))
    assert commit == Commit(0, 0x1_0000_0010, 0x1_0000_0040, PG_TS + pgoutput.PG_EPOCH_MICROS)


def test_relation_with_key_flags_and_type_oids() -> None:
    data = (
        b"R"
        + struct.pack("!I", 16385)
        + cstr("public")
        + cstr("orders")
        + b"d"
        + struct.pack("!H", 2)
        + b"\x01"
        + cstr("id")
        + struct.pack("!Ii", 20, -1)
        + b"\x00"
        + cstr("note")
        + struct.pack("!Ii", 1043, 54)
    )
    assert decode(data) == Relation(
        16385,
        "public",
        "orders",
        "d",
        (Column("id", 20, -1, True), Column("note", 1043, 54, False)),
    )


def test_type_and_origin() -> None:
    assert decode(b"Y" + struct.pack("!I", 99999) + cstr("public") + cstr("mood")) == Type(
        99999, "public", "mood"
    )
    assert decode(b"O" + struct.pack("!Q", 77) + cstr("upstream")) == OriginMessage(77, "upstream")


def test_insert_with_null_and_text() -> None:
    message = decode(b"I" + struct.pack("!I", 5) + b"N" + tuple_data("1", None, "héllo"))
    assert message == Insert(5, ("1", None, "héllo"))


def test_update_without_old_tuple_keeps_unchanged_toast_marker() -> None:
    message = decode(b"U" + struct.pack("!I", 5) + b"N" + tuple_data("1", TOAST))
    assert message == Update(5, None, False, ("1", UNCHANGED_TOAST))


@pytest.mark.parametrize(("marker", "key_only"), [(b"K", True), (b"O", False)])
def test_update_with_old_key_or_old_row(marker: bytes, key_only: bool) -> None:
    data = (
        b"U" + struct.pack("!I", 5) + marker + tuple_data("1", None) + b"N" + tuple_data("2", "x")
    )
    message = decode(data)
    assert isinstance(message, Update)
    assert message.old == ("1", None)
    assert message.old_is_key_only is key_only
    assert message.new == ("2", "x")


@pytest.mark.parametrize(("marker", "key_only"), [(b"K", True), (b"O", False)])
def test_delete(marker: bytes, key_only: bool) -> None:
    message = decode(b"D" + struct.pack("!I", 5) + marker + tuple_data("7"))
    assert message == Delete(5, ("7",), key_only)


def test_truncate() -> None:
    message = decode(b"T" + struct.pack("!IBII", 2, 1, 10, 11))
    assert message == Truncate(1, (10, 11))


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"Z",
        b"B" + struct.pack("!Q", 1),  # too short
        b"B" + struct.pack("!QqI", 1, 2, 3) + b"x",  # trailing byte
        b"I" + struct.pack("!I", 5) + b"X" + tuple_data("1"),
        b"I" + struct.pack("!I", 5) + b"N" + struct.pack("!H", 1) + b"b",  # binary: v2+ only
        b"I" + struct.pack("!I", 5) + b"N" + struct.pack("!H", 1) + b"t" + struct.pack("!I", 9),
        b"D" + struct.pack("!I", 5) + b"N" + tuple_data("1"),
        b"Y" + struct.pack("!I", 1) + b"unterminated",
    ],
)
def test_malformed_messages_raise_decode_error(data: bytes) -> None:
    with pytest.raises(DecodeError):
        decode(data)


# --- converters ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("oid", "text", "expected"),
    [
        (21, "-3", -3),
        (23, "42", 42),
        (20, "9223372036854775807", 9223372036854775807),
        (1700, "12345678901234567890.000000001", "12345678901234567890.000000001"),
        (1700, "NaN", "NaN"),
        (700, "1.5", 1.5),
        (701, "-0.1", -0.1),
        (701, "NaN", "NaN"),
        (701, "Infinity", "Infinity"),
        (701, "-Infinity", "-Infinity"),
        (16, "t", True),
        (16, "f", False),
        (25, "text", "text"),
        (1043, "", ""),
        (1042, "ab  ", "ab  "),
        (2950, "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"),
        (1184, "2024-01-02 03:04:05.123456+00", "2024-01-02 03:04:05.123456+00"),
        (1082, "2024-01-02", "2024-01-02"),
        (114, '{"b": 1, "a": [true, null]}', {"b": 1, "a": [True, None]}),
        (3802, '"just a string"', "just a string"),
        (17, "\\x00ff10", "AP8Q"),
        (17, "\\x", ""),
        (123456, "(1,2)", "(1,2)"),  # a type we do not know stays its text
        (25, None, None),
    ],
)
def test_scalar_conversions(oid: int, text: str | None, expected: object) -> None:
    assert convert(oid, text) == expected


@pytest.mark.parametrize(
    ("oid", "text", "expected"),
    [
        (1007, "{}", []),
        (1007, "{1,NULL,3}", [1, None, 3]),
        (1007, "{{1,2},{3,4}}", [[1, 2], [3, 4]]),
        (1007, "[0:1]={5,6}", [5, 6]),
        (
            1009,
            '{plain,"with space","quote\\"d","back\\\\slash","NULL",NULL,"{x}",""}',
            ["plain", "with space", 'quote"d', "back\\slash", "NULL", None, "{x}", ""],
        ),
        (1000, "{t,f}", [True, False]),
        (1001, '{"\\\\x0102"}', ["AQI="]),
        (3807, '{"{\\"a\\": 1}",null}', [{"a": 1}, None]),
        (1022, "{NaN,1.25}", ["NaN", 1.25]),
    ],
)
def test_array_conversions(oid: int, text: str, expected: object) -> None:
    assert convert(oid, text) == expected


@pytest.mark.parametrize("text", ["{1,2", "1,2}", "{1,2}x", '{"a}', "{1 2"])
def test_malformed_arrays_raise(text: str) -> None:
    with pytest.raises(ValueError):
        parse_array(text, lambda item: item)


@pytest.mark.parametrize(
    ("oid", "value", "text"),
    [
        (20, 5, "5"),
        (16, True, "t"),
        (17, "AP8Q", "\\x00ff10"),
        (1700, "1.50", "1.50"),
        (2950, "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"),
    ],
)
def test_to_text_inverts_convert(oid: int, value: object, text: str) -> None:
    assert to_text(oid, value) == text
    assert convert(oid, text) == value


@pytest.mark.parametrize(("oid", "value"), [(1007, (1, 2)), (25, None), (3802, {"a": 1})])
def test_to_text_refuses_what_cannot_be_a_key(oid: int, value: object) -> None:
    with pytest.raises(ValueError):
        to_text(oid, value)


# --- config -------------------------------------------------------------------------------

TABLES = (TableRef("public", "t"),)
DSN = "host=localhost port=5432 user=dblog dbname=dblog"


def test_config_defaults() -> None:
    config = PostgresSourceConfig(name="pg", dsn=DSN, tables=TABLES)
    assert (config.slot, config.publication) == ("dblog", "dblog")
    assert config.watermark == TableRef("dblog", "watermark")
    assert config.replica_identity_full is False


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"name": ""}, "needs a name"),
        ({"dsn": "host=localhost password=secret"}, "must not hold the password"),
        ({"dsn": "postgresql://u:secret@localhost/db"}, "must not hold the password"),
        ({"dsn": "host=localhost port"}, "malformed"),
        ({"tables": ()}, "captures no table"),
        ({"tables": ("public.t",)}, "TableRef"),
        ({"tables": (TableRef("a", "b"), TableRef("a", "b"))}, "twice"),
        ({"slot": "Has-Caps"}, "replication slot name"),
        ({"slot": "x" * 64}, "replication slot name"),
        ({"password_env": "not a name"}, "environment variable"),
        ({"publication": ""}, "publication must not be empty"),
        ({"tables": (TableRef("dblog", "watermark"),)}, "cannot also be captured"),
    ],
)
def test_malformed_config_is_refused(changes: dict[str, object], message: str) -> None:
    arguments: dict[str, object] = {"name": "pg", "dsn": DSN, "tables": TABLES, **changes}
    with pytest.raises(SourceError, match=message) as raised:
        PostgresSourceConfig(**arguments)  # type: ignore[arg-type]
    assert "secret" not in str(raised.value)


def test_connect_needs_the_password_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DBLOG_TEST_NO_SUCH_PASSWORD", raising=False)
    config = PostgresSourceConfig(
        name="pg", dsn=DSN, tables=TABLES, password_env="DBLOG_TEST_NO_SUCH_PASSWORD"
    )
    with pytest.raises(SourceError, match="DBLOG_TEST_NO_SUCH_PASSWORD"):
        config.connect()


# --- preflight rules ----------------------------------------------------------------------


def test_wal_level_rule() -> None:
    setup.check_wal_level("logical")
    with pytest.raises(SourceError, match="wal_level = logical"):
        setup.check_wal_level("replica")


def test_encoding_rule() -> None:
    setup.check_server_encoding("UTF8")
    with pytest.raises(SourceError, match="UTF8 databases only"):
        setup.check_server_encoding("LATIN1")


def test_replication_role_rule() -> None:
    setup.check_replication_role("dblog", True)
    with pytest.raises(SourceError, match="ALTER ROLE app REPLICATION"):
        setup.check_replication_role("app", False)


def test_table_rules() -> None:
    table = TableRef("public", "t")
    setup.check_table(table, ("r", "d", True, []))
    setup.check_table(table, ("p", "f", True, []))
    setup.check_table(table, ("r", "i", False, ["t_code (code)"]))  # keyed by that index
    with pytest.raises(UnknownTable, match="does not exist"):
        setup.check_table(table, None)
    with pytest.raises(UnknownTable, match="not a table"):
        setup.check_table(table, ("v", "d", False, []))
    with pytest.raises(NoPrimaryKey, match=r"ADD PRIMARY KEY.*unique index on NOT NULL"):
        setup.check_table(table, ("r", "d", False, []))
    with pytest.raises(NoPrimaryKey, match="REPLICA IDENTITY USING INDEX a; ALTER TABLE"):
        setup.check_table(table, ("r", "f", False, ["a (x)", "b (y, z)"]))
    with pytest.raises(SourceError, match="REPLICA IDENTITY NOTHING"):
        setup.check_table(table, ("r", "n", True, []))


def test_publication_and_slot_rules() -> None:
    a, b = TableRef("public", "a"), TableRef("public", "b")
    setup.check_publication("p", {a, b}, [a, b])
    with pytest.raises(SourceError, match="does not exist"):
        setup.check_publication("p", None, [a])
    with pytest.raises(SourceError, match=r"ADD TABLE public\.b"):
        setup.check_publication("p", {a}, [a, b])
    setup.check_slot("s", ("pgoutput", "db"), "db")
    with pytest.raises(SourceError, match="does not exist"):
        setup.check_slot("s", None, "db")
    with pytest.raises(SourceError, match="test_decoding slot"):
        setup.check_slot("s", ("test_decoding", "db"), "db")
