"""Positions and the event envelope: ordering, stable JSON."""

from __future__ import annotations

import dataclasses
import json
import json.encoder
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_provider_dblog.core.event import (
    EncodedLogEvent,
    Event,
    LogOrigin,
    Op,
    Origin,
    PlainEvent,
    SourceInfo,
    TableRef,
    key_of,
    table_event,
)
from airflow_provider_dblog.core.event_codec import decode, encode, encode_lines, log_line_format
from airflow_provider_dblog.core.position import Position
from airflow_provider_dblog.core.reconciler import ChunkRows, Closed, Reconciler, Window
from airflow_provider_dblog.core.schema import Column, TableSchema

pytestmark = pytest.mark.unit


def test_positions_order_by_commit_then_seq() -> None:
    assert Position(1, 9) < Position(2, 0) < Position(2, 1)
    assert Position.from_json([5, 3]) == Position(5, 3)
    with pytest.raises(ValueError, match="two integers"):
        Position.from_json([1, "2"])
    with pytest.raises(ValueError, match="out of range"):
        Position(-1, 0)


def test_table_ref_parse() -> None:
    assert TableRef.parse("app.users") == TableRef("app", "users")
    assert TableRef.parse("users", default_schema="public") == TableRef("public", "users")
    with pytest.raises(ValueError, match=r"schema\.table"):
        TableRef.parse("users")


def sample_event() -> Event:
    source = SourceInfo("pg", "db", "app", "users", Position(7, 1), Origin.LOG, txid=9, ts_ms=1)
    after = {"id": 1, "name": "Zoë", "tags": ["a"], "doc": {"z": 1, "a": [1, 2]}}
    return PlainEvent(Op.CREATE, {"id": 1}, None, after, source, 2)


def test_encoding_is_stable_and_round_trips() -> None:
    event = sample_event()
    line = encode(event)
    assert line.startswith('{"op":"c","key":{"id":1},"before":null,"after":{"id":1,"name":"Zoë"')
    assert '"position":[7,1]' in line and "\n" not in line
    assert decode(line) == event
    assert encode(decode(line)) == line


def test_decode_refuses_what_is_not_an_event() -> None:
    with pytest.raises(ValueError, match="not a DBLog event"):
        decode('{"op": "c"}')


def test_table_level_events_have_the_documented_shape_and_round_trip() -> None:
    source = SourceInfo("pg", "db", "app", "users", Position(7, 2), Origin.LOG, txid=9, ts_ms=1)
    truncate = table_event(Op.TRUNCATE, source, 3)
    assert encode(truncate).startswith('{"op":"t","key":{},"before":null,"after":null,"source"')
    columns = (Column("id", "integer", False, None), Column("flag", "integer", True, "7"))
    schema = table_event(Op.SCHEMA, source, 4, TableSchema(columns, ("id",)))
    assert json.loads(encode(schema))["table_schema"] == {
        "columns": [
            {"name": "id", "type": "integer", "nullable": False, "default": None},
            {"name": "flag", "type": "integer", "nullable": True, "default": "7"},
        ],
        "key": ["id"],
    }
    assert encode(schema).startswith('{"op":"s","key":{},"before":null,"after":null,"table_')
    for event in (truncate, schema):
        assert decode(encode(event)) == event
        assert encode_lines([event]) == [(encode(event) + "\n").encode()]


def test_only_a_schema_event_carries_a_table_schema() -> None:
    source = sample_event().source
    with pytest.raises(ValueError, match="row operation"):
        table_event(Op.CREATE, source, 1)
    with pytest.raises(ValueError, match="only a schema event"):
        table_event(Op.SCHEMA, source, 1)
    with pytest.raises(ValueError, match="only a schema event"):
        table_event(Op.TRUNCATE, source, 1, TableSchema((), ()))
    line = json.loads(encode(table_event(Op.TRUNCATE, source, 1)))
    with pytest.raises(ValueError, match="only a schema event"):
        decode(json.dumps({**line, "op": "s"}))
    with pytest.raises(ValueError, match="not columns of the table"):
        TableSchema((Column("a", "text", True, None),), ("b",))
    with pytest.raises(ValueError, match="not a column description"):
        Column.from_json({"name": "a", "type": "text", "nullable": "yes", "default": None})


def test_keys_are_hashable_in_primary_key_order() -> None:
    row = {"b": [1, 2], "a": "x", "v": 0}
    assert key_of(row, ("a", "b")) == ("x", (1, 2))
    assert hash(key_of(row, ("a", "b")))
    with pytest.raises(ValueError, match="no primary-key column"):
        key_of(row, ("missing",))


# -- encode_lines: the batch encoder the NDJSON output uses -----------------------------------

ROW_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=6,
)
ROWS = st.dictionaries(st.text(max_size=5), ROW_VALUES, max_size=4)
TEXT_OR_NONE = st.none() | st.text(max_size=8)
INT_OR_NONE = st.none() | st.integers(0, 2**70)


COLUMNS = st.builds(Column, st.text(max_size=5), st.text(max_size=8), st.booleans(), TEXT_OR_NONE)
TABLE_SCHEMAS = st.lists(COLUMNS, max_size=3, unique_by=lambda c: c.name).map(
    lambda columns: TableSchema(tuple(columns), tuple(c.name for c in columns[:1]))
)


@st.composite
def events(draw: st.DrawFn) -> Event:
    source = SourceInfo(
        draw(st.text(max_size=8)),
        draw(st.text(max_size=8)),
        draw(st.text(max_size=8)),
        draw(st.text(max_size=8)),
        Position(draw(st.integers(0, 2**64 - 1)), draw(st.integers(0, 2**40))),
        draw(st.sampled_from(Origin)),
        draw(TEXT_OR_NONE),
        draw(TEXT_OR_NONE),
        draw(INT_OR_NONE),
        draw(INT_OR_NONE),
    )
    op = draw(st.sampled_from(Op))
    return PlainEvent(
        op,
        draw(ROWS),
        draw(st.none() | ROWS),
        draw(st.none() | ROWS),
        source,
        draw(st.integers(0, 2**40)),
        draw(TABLE_SCHEMAS) if op is Op.SCHEMA else None,
    )


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(events(), max_size=3))
def test_encode_lines_is_encode_byte_for_byte(batch: list[Event]) -> None:
    assert encode_lines(batch) == [(encode(e) + "\n").encode() for e in batch]


PLAIN_VALUES = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(2**200), max_value=2**200)
    | st.text(st.characters(codec="utf-8"))  # every code point but the lone surrogates
)
"""Row values the fast path (msgspec) encodes: the types a typical row holds."""
ANY_VALUES = st.recursive(
    PLAIN_VALUES | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=6,
)
"""Every kind of JSON value, floats (1e+16, 5e-324, -0.0, ...) and nesting included."""


@st.composite
def row_events(draw: st.DrawFn) -> Event:
    """Row events of the log and of dumps, their rows either plain or of any JSON values."""
    values = draw(st.sampled_from([PLAIN_VALUES, ANY_VALUES]))
    rows = st.dictionaries(st.text(st.characters(codec="utf-8"), max_size=6), values, max_size=5)
    origin = draw(st.sampled_from(Origin))
    dump = origin is Origin.DUMP
    source = SourceInfo(
        draw(st.text(max_size=8)),
        draw(st.text(max_size=8)),
        draw(st.text(max_size=8)),
        draw(st.text(max_size=8)),
        Position(draw(st.integers(0, 2**64 - 1)), draw(st.integers(0, 2**40))),
        origin,
        draw(st.text(max_size=8)) if dump else None,
        draw(st.text(max_size=8)) if dump else None,
        None if dump else draw(st.integers(0, 2**32)),
        None if dump else draw(st.integers(0, 2**45)),
    )
    op = draw(st.sampled_from([Op.CREATE, Op.UPDATE, Op.DELETE, Op.READ]))
    return PlainEvent(
        op,
        draw(rows),
        None if op in (Op.CREATE, Op.READ) else draw(st.none() | rows),
        None if op is Op.DELETE else draw(rows),
        source,
        draw(st.integers(0, 2**40)),
    )


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(row_events(), max_size=4))
def test_encode_lines_is_the_standard_json_of_to_json(batch: list[Event]) -> None:
    """The fast encoder (msgspec for plain rows, the envelope spelled as bytes) against the
    standard library's encoding of the documented envelope, `Event.to_json()`."""
    assert encode_lines(batch) == [
        json.dumps(e.to_json(), separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
        + b"\n"
        for e in batch
    ]


def test_floats_and_odd_keys_take_the_standard_encoder() -> None:
    """msgspec spells some floats and keys otherwise (`1e16`, not `1e+16`): a row holding one
    is encoded by the standard library, at any depth."""
    base = sample_event()
    odd = [
        dataclasses.replace(base, after={"id": 1, "x": 1e16}),
        dataclasses.replace(base, after={"id": 1, "x": [1e-7]}),
        dataclasses.replace(base, key={"id": 5e-324}),
        dataclasses.replace(base, after={"id": 1, 1e16: "float key"}),  # type: ignore[dict-item]
        dataclasses.replace(base, after={"id": 1, True: "bool key"}),  # type: ignore[dict-item]
        dataclasses.replace(base, after={"id": Op.CREATE}),
    ]
    lines = encode_lines(odd)
    assert lines == [(encode(e) + "\n").encode() for e in odd]
    assert b'"x":1e+16' in lines[0] and b"[1e-07]" in lines[1] and b'"1e+16":' in lines[3]


def test_encode_lines_of_events_off_their_annotations_is_still_encode() -> None:
    """Fields of other types than annotated (a bool for an int, a plain string for an enum
    member, a str subclass) take `encode` itself, so they spell the same."""

    class Name(str):
        pass

    base = sample_event()
    odd = [
        dataclasses.replace(base, source=dataclasses.replace(base.source, txid=True)),
        dataclasses.replace(base, source=dataclasses.replace(base.source, ts_ms=1.5)),
        dataclasses.replace(base, source=dataclasses.replace(base.source, name=Name("n"))),
        dataclasses.replace(base, source=dataclasses.replace(base.source, dump_id=7)),
        dataclasses.replace(
            base, source=dataclasses.replace(base.source, position=Position(True, 0))
        ),
        dataclasses.replace(base, schema_version=False),
        dataclasses.replace(base, key={"id": 1.0, "b": [True, None]}),
    ]
    assert encode_lines(odd) == [(encode(e) + "\n").encode() for e in odd]


def test_encode_lines_raises_what_encode_raises_and_recovers() -> None:
    base = sample_event()
    nan = dataclasses.replace(base, after={"id": 1, "x": {"deep": [float("nan")]}})
    with pytest.raises(ValueError, match="Out of range float values"):
        encode(nan)
    with pytest.raises(ValueError, match="Out of range float values"):
        encode_lines([base, nan])
    not_json = dataclasses.replace(base, after={"id": 1, "x": object()})
    with pytest.raises(TypeError, match="is not JSON serializable"):
        encode_lines([not_json])
    surrogate = dataclasses.replace(base, after={"id": 1, "x": "\ud800"})
    with pytest.raises(UnicodeEncodeError):
        encode_lines([surrogate])


def test_encode_lines_after_a_refused_value_in_the_same_batch() -> None:
    """A value the encoder refuses mid-row must not spoil the events after it."""

    class Flaky(dict[str, object]):
        """A row the encoder refuses on its first pass only (encode then sees a fine row)."""

        passes = 0

        def items(self) -> Any:
            Flaky.passes += 1
            if Flaky.passes == 1:
                raise RuntimeError("refused once")
            return super().items()

    base = sample_event()
    flaky = dataclasses.replace(base, after=Flaky({"id": 2, "doc": {"a": [1]}}))
    batch = [flaky, flaky, base]
    assert encode_lines(batch) == [(encode(e) + "\n").encode() for e in batch]


def test_a_chunk_encodes_to_the_documented_envelope() -> None:
    """The `r` events of a chunk, through the reconciler and `encode_lines`, against lines
    built here with `json.dumps` from the envelope in docs/architecture.md (and one line
    spelled out)."""
    table = TableRef("app", "orders")
    window = Window("w-1", "dump-7", table)
    rows: list[dict[str, object]] = [
        {"tenant": "t1", "id": 1, "name": 'Zoë "q" \\ \n', "amount": "12.50", "ok": True},
        {"tenant": "t1", "id": 2, "name": None, "amount": 1.5e-7, "ok": False},
        {"tenant": "t2", "id": 2**63, "name": "\u2028😀", "amount": -0.0, "ok": None},
        {"tenant": "t2", "id": 3, "name": "x", "amount": {"v": [1, 2.5, {}]}, "ok": []},
    ]
    rec = Reconciler("pg-main", "shop")
    rec.low_watermark(window, Position(2**40, 3))
    changed = SourceInfo("pg-main", "shop", "app", "orders", Position(2**40 + 5, 0), Origin.LOG)
    rec.change(PlainEvent(Op.UPDATE, {"tenant": "t1", "id": 2}, None, rows[1], changed, 4))
    closed = rec.high_watermark(window, Position(2**40 + 9, 2))
    assert isinstance(closed, Closed)
    chunk_events = rec.chunk_events(closed, ChunkRows("w-1", ("tenant", "id"), rows, 4))
    assert isinstance(chunk_events, list)

    expected = []
    for seq, row in zip((3, 4, 5), (rows[0], rows[2], rows[3]), strict=True):
        envelope = {
            "op": "r",
            "key": {"tenant": row["tenant"], "id": row["id"]},
            "before": None,
            "after": row,
            "source": {
                "name": "pg-main",
                "db": "shop",
                "schema": "app",
                "table": "orders",
                "position": [2**40 + 9, seq],
                "origin": "dump",
                "dump_id": "dump-7",
                "window_id": "w-1",
                "txid": None,
                "ts_ms": None,
            },
            "schema_version": 4,
        }
        line = json.dumps(envelope, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        expected.append((line + "\n").encode())
    assert encode_lines(chunk_events) == expected
    assert expected[2] == (
        b'{"op":"r","key":{"tenant":"t2","id":3},"before":null,"after":{"tenant":"t2","id":3,'
        b'"name":"x","amount":{"v":[1,2.5,{}]},"ok":[]},"source":{"name":"pg-main","db":"shop",'
        b'"schema":"app","table":"orders","position":[1099511627785,5],"origin":"dump",'
        b'"dump_id":"dump-7","window_id":"w-1","txid":null,"ts_ms":null},"schema_version":4}\n'
    )


def test_encode_lines_without_the_c_encoder(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(json.encoder, "c_make_encoder", None)
    batch = [sample_event(), dataclasses.replace(sample_event(), before={"id": 0.5})]
    assert encode_lines(batch) == [(encode(e) + "\n").encode() for e in batch]


@pytest.mark.parametrize("txid", [None, 0, 7_000_000_123])
def test_a_log_line_filled_from_its_origin_is_encode_of_the_event(txid: int | None) -> None:
    """What a log reader does with `log_line_format`: a txid-less log (MySQL) spells null."""
    table_names = ("app", 'o"rders%')
    table = TableRef(*table_names)
    origin = LogOrigin("src", "dbü", table, txid, 1_700_000_000_123)
    key, after = {"id": 5}, {"id": 5, "note": "50% off\n"}
    position = Position(2**64 - 1, 3)
    spell = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
    line = log_line_format(Op.CREATE, "src", "dbü", table) % (
        spell(key).encode(),
        b"null",
        spell(after).encode(),
        position.commit,
        position.seq,
        origin.txid_json,
        origin.ts_ms,
        4,
    )
    event = EncodedLogEvent(line, Op.CREATE, key, None, after, position, origin, 4)
    plain = PlainEvent(
        Op.CREATE,
        key,
        None,
        after,
        SourceInfo(
            "src", "dbü", "app", 'o"rders%', position, Origin.LOG, txid=txid, ts_ms=origin.ts_ms
        ),
        4,
    )
    assert isinstance(event, Event) and event.txid == txid and event.table == table
    assert event == plain and plain == event and event.event() == plain
    assert line == (encode(plain) + "\n").encode() == encode_lines([event])[0]
    assert decode(line) == plain
