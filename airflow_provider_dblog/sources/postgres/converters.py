"""PostgreSQL values to JSON: one converter per type OID, for the log and the dump alike.

Both paths hand over the text PostgreSQL's output functions print (pgoutput sends it; the dump
reads text results, loaded column by column with these functions by `loaders.py`), under the
same session settings (`config.SESSION_OPTIONS`), so one function from (type OID, text) to
JSON gives the same JSON whichever path a row came by. `to_text` goes back the other way, for
keys sent as query parameters.
"""

from __future__ import annotations

import base64
import functools
import json
import math
from collections.abc import Callable

from airflow_provider_dblog.core.event import JsonValue

BOOL = 16
BYTEA = 17
INT8 = 20
INT2 = 21
INT4 = 23
OID = 26
JSON = 114
FLOAT4 = 700
FLOAT8 = 701
NUMERIC = 1700
JSONB = 3802


def _float(text: str) -> JsonValue:
    value = float(text)
    # JSON has no NaN or infinities: keep PostgreSQL's spelling ('NaN', 'Infinity').
    return value if math.isfinite(value) else text


def _bool(text: str) -> JsonValue:
    return text == "t"


def _bytea(text: str) -> JsonValue:
    if not text.startswith("\\x"):
        raise ValueError(f"bytea not in hex format: {text[:20]!r}")
    return base64.b64encode(bytes.fromhex(text[2:])).decode("ascii")


def _json(text: str) -> JsonValue:
    return json.loads(text)


def _text(text: str) -> JsonValue:
    return text


_SCALARS: dict[int, Callable[[str], JsonValue]] = {
    BOOL: _bool,
    BYTEA: _bytea,
    INT8: int,
    INT2: int,
    INT4: int,
    OID: int,
    JSON: _json,
    FLOAT4: _float,
    FLOAT8: _float,
    JSONB: _json,
}
"""Types whose JSON is not their text. Every other type (numeric, text, varchar, char, name,
uuid, date, time, timestamp, timestamptz, interval, unknown and user types) stays its text."""

ARRAY_ELEMENTS: dict[int, int] = {
    1000: BOOL,
    1001: BYTEA,
    1002: 18,  # "char"
    1003: 19,  # name
    1005: INT2,
    1007: INT4,
    1009: 25,  # text
    1014: 1042,  # bpchar
    1015: 1043,  # varchar
    1016: INT8,
    1021: FLOAT4,
    1022: FLOAT8,
    1028: OID,
    1115: 1114,  # timestamp
    1182: 1082,  # date
    1183: 1083,  # time
    1185: 1184,  # timestamptz
    1187: 1186,  # interval
    1231: NUMERIC,
    1270: 1266,  # timetz
    2951: 2950,  # uuid
    199: JSON,
    3807: JSONB,
}
"""Array type OID -> element type OID, for the built-in arrays (all use ',' as delimiter)."""


def convert(oid: int, text: str | None) -> JsonValue:
    """The JSON value of a column of type `oid` that PostgreSQL printed as `text`."""
    if text is None:
        return None
    element = ARRAY_ELEMENTS.get(oid)
    if element is not None:
        return parse_array(text, lambda item: convert(element, item))
    scalar = _SCALARS.get(oid)
    return text if scalar is None else scalar(text)


def column_converter(oid: int) -> Callable[[str], JsonValue]:
    """`convert` of the non-NULL values of type `oid`, looked up once for a whole column."""
    if oid in ARRAY_ELEMENTS:
        return functools.partial(convert, oid)
    return _SCALARS.get(oid, _text)


def keeps_text(oid: int) -> bool:
    """Whether a value of type `oid` is its text in JSON (`convert` returns the text)."""
    return oid not in ARRAY_ELEMENTS and oid not in _SCALARS


def parse_array(text: str, element: Callable[[str | None], JsonValue]) -> list[JsonValue]:
    """A PostgreSQL array literal (`{1,NULL,"a b",{2,3}}`, optionally after `[0:1]=`) as nested
    lists, each element passed through `element` (None for an unquoted NULL)."""
    if text.startswith("["):
        text = text[text.index("=") + 1 :]
    parsed, end = _parse_level(text, 0, element)
    if end != len(text):
        raise ValueError(f"trailing text after array literal: {text[end:]!r}")
    return parsed


def _parse_level(
    text: str, pos: int, element: Callable[[str | None], JsonValue]
) -> tuple[list[JsonValue], int]:
    if pos >= len(text) or text[pos] != "{":
        raise ValueError(f"array literal expected '{{' at {pos}: {text!r}")
    pos += 1
    items: list[JsonValue] = []
    if pos < len(text) and text[pos] == "}":
        return items, pos + 1
    while True:
        if pos >= len(text):
            raise ValueError(f"unterminated array literal: {text!r}")
        char = text[pos]
        if char == "{":
            nested, pos = _parse_level(text, pos, element)
            items.append(nested)
        elif char == '"':
            chars: list[str] = []
            pos += 1
            while True:
                if pos >= len(text):
                    raise ValueError(f"unterminated quoted array element: {text!r}")
                char = text[pos]
                if char == "\\":
                    chars.append(text[pos + 1])
                    pos += 2
                elif char == '"':
                    pos += 1
                    break
                else:
                    chars.append(char)
                    pos += 1
            items.append(element("".join(chars)))
        else:
            start = pos
            while pos < len(text) and text[pos] not in ",}":
                pos += 1
            raw = text[start:pos].strip()
            items.append(element(None if raw.upper() == "NULL" else raw))
        if pos >= len(text):
            raise ValueError(f"unterminated array literal: {text!r}")
        if text[pos] == "}":
            return items, pos + 1
        if text[pos] != ",":
            raise ValueError(f"array literal expected ',' at {pos}: {text!r}")
        pos += 1


def to_text(oid: int, value: JsonValue) -> str:
    """The text PostgreSQL reads back as the value `convert(oid, ...)` returned: how a key
    travels into a query (as a parameter cast to the column's type)."""
    if value is None:
        raise ValueError("a key value is never NULL")
    if oid in ARRAY_ELEMENTS or isinstance(value, list | tuple | dict):
        raise ValueError(f"arrays, objects and composite values cannot be keys: {value!r}")
    if oid == BOOL:
        return "t" if value else "f"
    if oid == BYTEA:
        return "\\x" + base64.b64decode(value).hex()
    if oid in (JSON, JSONB):
        return json.dumps(value)
    return str(value)
