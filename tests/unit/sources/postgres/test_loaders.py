"""The chunk read's per-column psycopg loaders give what `convert` gives, for every type the
converters know and for types they do not (which stay text), without a server."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from airflow_provider_dblog.sources.postgres.converters import (
    ARRAY_ELEMENTS,
    BOOL,
    BYTEA,
    FLOAT4,
    FLOAT8,
    INT2,
    INT4,
    INT8,
    JSON,
    JSONB,
    NUMERIC,
    OID,
    convert,
)
from airflow_provider_dblog.sources.postgres.loaders import column_loaders

ENUM_OR_DOMAIN = 91_234
"""An OID no converter knows, as a user type's (an enum, a domain over int) would be."""

SAMPLES: list[tuple[int, str]] = [
    (BOOL, "t"),
    (BOOL, "f"),
    (BYTEA, "\\x00ff10"),
    (BYTEA, "\\x"),
    (INT2, "-32768"),
    (INT4, "2147483647"),
    (INT8, "-9223372036854775808"),
    (OID, "4294967295"),
    (JSON, '  {"a": 1, "a": 2.50, "b": [null, 1e400]} '),
    (JSONB, '{"a": 2.50, "big": 123456789012345678901234567890}'),
    (FLOAT4, "1.1"),
    (FLOAT4, "3"),
    (FLOAT8, "-0"),
    (FLOAT8, "1.5e-07"),
    (FLOAT8, "NaN"),
    (FLOAT8, "-Infinity"),
    (NUMERIC, "12345678901234567890.123456789"),
    (NUMERIC, "NaN"),
    (1184, "-infinity"),  # timestamptz
    (1082, "0044-03-15 BC"),  # date
    (25, 'héllo "world" 🎉\t\\'),
    (1042, "ab   "),  # bpchar keeps its padding
    (ENUM_OR_DOMAIN, "5"),
    (ENUM_OR_DOMAIN, "t"),
    (1007, "[0:2]={1,NULL,3}"),
    (1009, '{"a b",NULL,"q\\"t","","NULL"}'),
    (1022, "{NaN,-0,3,Infinity}"),
    (1001, '{"\\\\x00ff",NULL}'),
    (3807, '{"{\\"b\\": 1.50}","null"}'),
    (1000, "{{t,f},{NULL,t}}"),
    (ENUM_OR_DOMAIN + 1, "{sad,ok}"),  # an array of a user type stays text
]
SAMPLES += [(array, "{}") for array in ARRAY_ELEMENTS]


def test_each_type_loads_as_it_converts() -> None:
    oids = [oid for oid, _ in SAMPLES]
    loaded = column_loaders(oids).load_sequence([text.encode() for _, text in SAMPLES])
    for (oid, text), value in zip(SAMPLES, loaded, strict=True):
        assert json.dumps(value) == json.dumps(convert(oid, text)), (oid, text)


def test_null_stays_none_whatever_the_type() -> None:
    oids = [oid for oid, _ in SAMPLES]
    assert column_loaders(oids).load_sequence([None] * len(oids)) == (None,) * len(oids)


FLOAT_TEXTS = st.floats().map(lambda f: repr(f).replace("inf", "Infinity").replace("nan", "NaN"))


@given(
    integer=st.integers(-(2**63), 2**63 - 1),
    real=FLOAT_TEXTS,
    text=st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00")),
    raw=st.binary(max_size=32),
    flag=st.booleans(),
)
def test_generated_values_load_as_they_convert(
    integer: int, real: str, text: str, raw: bytes, flag: bool
) -> None:
    values = [
        (INT8, str(integer)),
        (FLOAT8, real),
        (25, text),
        (ENUM_OR_DOMAIN, text),
        (BYTEA, "\\x" + raw.hex()),
        (BOOL, "t" if flag else "f"),
    ]
    loaded = column_loaders([oid for oid, _ in values]).load_sequence(
        [t.encode() for _, t in values]
    )
    assert [json.dumps(v) for v in loaded] == [json.dumps(convert(o, t)) for o, t in values]
