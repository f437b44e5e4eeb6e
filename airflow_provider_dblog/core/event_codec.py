"""The event's stable JSON encoding: one line of JSON per event, the same bytes for the same
event whichever path it came by (`core.event` holds the model).

`encode` and `decode` are the reference; `encode_lines` spells a batch's lines byte for byte as
`encode` does at a fraction of the cost, and takes an event's line as it is when the event
carries one (`Event.line`: a log row its reader spelled with `log_line_format`, a dump row its
reader spelled with `core.encoded_rows.encode_rows`).
"""

from __future__ import annotations

import json
import json.encoder
from collections.abc import Callable, Iterable
from typing import Any

from airflow_provider_dblog.core.event import Event, JsonValue, Op, Origin, PlainEvent, TableRef
from airflow_provider_dblog.core.position import Position


def encode(event: Event) -> str:
    """One line of JSON. Field order is fixed and row columns keep table order, so the same
    event always encodes to the same bytes."""
    return json.dumps(event.to_json(), separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def encode_lines(events: Iterable[Event]) -> list[bytes]:
    """`(encode(event) + "\\n").encode()` for each event, byte for byte, at a fraction of the cost.

    An event that carries its line (`Event.line`) comes with it. Otherwise the envelope is
    spelled out directly, as bytes, and only `key`, `before` and `after` go through a JSON
    encoder, one for the whole batch: msgspec for a row of plain values, the standard
    library's for anything else. Anything unusual (a field of another type than its
    annotation, a value an encoder refuses) takes `encode` itself, which then gives the same
    bytes or raises the same error as before.
    """
    line = _LineEncoder().line
    return [line(event) for event in events]


_OP_JSON = {op: json.dumps(op.value).encode() for op in Op}
_ORIGIN_JSON = {origin: json.dumps(origin.value).encode() for origin in Origin}
_string: Callable[[str], str] = json.encoder.encode_basestring
"""The escaping `json.dumps(..., ensure_ascii=False)` applies to every string."""
_PLAIN_TYPES = frozenset({str, int, bool, type(None)})
"""Values msgspec spells exactly as `json.dumps` does: the exact types, not subclasses.
Floats are not among them (msgspec writes `1e16` where Python writes `1e+16`)."""
_STR_TYPE = frozenset({str})
_LINE = (
    b'{"op":%b,"key":%b,"before":%b,"after":%b,"source":%b%d,%d],"origin":%b'
    b',"dump_id":%b,"window_id":%b,"txid":%b,"ts_ms":%b},"schema_version":%d}\n'
)


def log_line_format(op: Op, name: str, db: str, table: TableRef) -> bytes:
    """The line `encode` gives a log row event `op` of `table` from source `name` and `db`, as
    a `%` format of its key, before and after JSON (bytes), commit, seq, txid JSON (bytes:
    `LogOrigin.txid_json`), ts_ms and schema version: what a reader fills to build an
    `EncodedLogEvent`'s line."""
    source = (
        f'"source":{{"name":{_string(name)},"db":{_string(db)},"schema":{_string(table.schema)}'
        f',"table":{_string(table.name)},"position":['
    ).encode()
    return (
        b'{"op":'
        + _OP_JSON[op]
        + b',"key":%b,"before":%b,"after":%b,'
        + source.replace(b"%", b"%%")
        + b'%d,%d],"origin":"log","dump_id":null,"window_id":null,"txid":%b,"ts_ms":%d}'
        b',"schema_version":%d}\n'
    )


def plain_row_encoder() -> Callable[[Any], bytes] | None:
    """msgspec's JSON encoder, which spells a dict of `str` keys and values of the exact types
    str, int, bool and None as `encode` does (what `row_json_encoder` checks before it calls it);
    None where it is not installed (this module is imported without site-packages too, from
    the package's zip on a Spark executor: `spark_package`)."""
    try:
        import msgspec.json
    except ImportError:
        return None
    return msgspec.json.Encoder().encode


def row_json_encoder() -> Callable[[JsonValue], bytes]:
    """A JSON value (an event's `key`, `before` or `after`) as `json.dumps` with `encode`'s
    options spells it inside an event, as bytes. Not thread-safe, and after it raised it
    may refuse what it would take: make a new one then (`_LineEncoder.line`)."""
    plain, keys = _PLAIN_TYPES.issuperset, _STR_TYPE.issuperset
    fast = plain_row_encoder()
    options = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    make = getattr(json.encoder, "c_make_encoder", None)
    try:
        # What `JSONEncoder.encode` does for a non-string, minus building it per call.
        encoder = make(  # type: ignore[misc]
            {},
            options.default,
            _string,
            None,
            options.key_separator,
            options.item_separator,
            options.sort_keys,
            options.skipkeys,
            options.allow_nan,
        )
    except TypeError:  # no C accelerator, or another signature: the public path

        def standard(obj: JsonValue) -> bytes:
            return options.encode(obj).encode()

    else:

        def standard(obj: JsonValue) -> bytes:
            return "".join(encoder(obj, 0)).encode()

    if fast is None:
        return standard

    def value(obj: JsonValue) -> bytes:
        if type(obj) is dict and keys(map(type, obj)) and plain(map(type, obj.values())):
            return fast(obj)
        return standard(obj)

    return value


class _LineEncoder:
    """Encodes events as `encode` does. Not thread-safe: one per batch (the JSON encoder's
    circular-reference markers are shared between its calls)."""

    def __init__(self) -> None:
        self._value = row_json_encoder()
        self._tables: dict[tuple[str, str, str, str], bytes] = {}
        """`{"name":..,"db":..,"schema":..,"table":..,"position":[` of each table met."""

    def line(self, event: Event) -> bytes:
        line = event.line
        if line is not None:
            return line
        try:
            line = self._envelope(event)
        except Exception:
            # A value the encoder refused may leave its markers behind: start afresh, and let
            # `encode` give the result (or raise its own error).
            self._value = row_json_encoder()
            line = None
        if line is None:
            line = (encode(event) + "\n").encode()
        return line

    def _envelope(self, event: Event) -> bytes | None:
        """The event's line, or None if a field is not of its usual type."""
        source = event.source
        position = source.position
        op, origin = event.op, source.origin
        name, db, schema, table = source.name, source.db, source.schema, source.table
        dump_id, window_id = source.dump_id, source.window_id
        txid, ts_ms = source.txid, source.ts_ms
        commit, seq, version = position.commit, position.seq, event.schema_version
        if event.table_schema is not None:
            return None  # a schema event: rare, and spelled by `encode`
        if not (
            type(op) is Op
            and type(origin) is Origin
            and type(name) is str
            and type(db) is str
            and type(schema) is str
            and type(table) is str
            and (dump_id is None or type(dump_id) is str)
            and (window_id is None or type(window_id) is str)
            and (txid is None or type(txid) is int)
            and (ts_ms is None or type(ts_ms) is int)
            and type(commit) is int
            and type(seq) is int
            and type(version) is int
            and type(position) is Position
        ):
            return None
        value = self._value
        before, after = event.before, event.after
        names = (name, db, schema, table)
        head = self._tables.get(names)
        if head is None:
            head = self._tables[names] = (
                f'{{"name":{_string(name)},"db":{_string(db)},"schema":{_string(schema)}'
                f',"table":{_string(table)},"position":['
            ).encode()
        return _LINE % (
            _OP_JSON[op],
            value(event.key),
            b"null" if before is None else value(before),
            b"null" if after is None else value(after),
            head,
            commit,
            seq,
            _ORIGIN_JSON[origin],
            b"null" if dump_id is None else _string(dump_id).encode(),
            b"null" if window_id is None else _string(window_id).encode(),
            b"null" if txid is None else b"%d" % txid,
            b"null" if ts_ms is None else b"%d" % ts_ms,
            version,
        )


def decode(line: str | bytes) -> PlainEvent:
    return PlainEvent.from_json(json.loads(line))
