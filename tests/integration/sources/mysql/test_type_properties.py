"""Generated rows of every supported type through both paths of the MariaDB source: the log
reader's lean decoder (`MysqlLogReader`, reading the binlog's bytes) and a chunk read
(`MysqlChunkSource`, PyMySQL's values through the converters) give the same JSON, byte for
byte. Hypothesis draws NULLs, extremes, 4-byte characters, unsigned values above 2^63,
decimals of many precisions and scales, temporal values of every fractional precision, JSON
documents, enum, set and bit values; each example inserts its rows, then updates each to
another drawn row, so before and after images are both decoded."""

from __future__ import annotations

import datetime
import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pymysql
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_provider_dblog.core.dump_plan import Chunk
from airflow_provider_dblog.core.event import Row, TableRef
from airflow_provider_dblog.core.log import Change, Idle, LogItem, single_changes
from airflow_provider_dblog.devservices.mariadb import MariaDBInfo
from airflow_provider_dblog.sources.mysql.binlog import MysqlLogReader
from airflow_provider_dblog.sources.mysql.chunks import MysqlChunkSource
from airflow_provider_dblog.sources.mysql.config import MysqlSourceConfig
from airflow_provider_dblog.sources.mysql.setup import ensure_setup

pytestmark = pytest.mark.integration

_DECIMALS = [(1, 0), (1, 1), (4, 2), (9, 0), (9, 9), (10, 5), (18, 9), (19, 0), (27, 13)]
_DECIMALS += [(36, 18), (40, 20), (65, 0), (65, 30)]
_INTEGERS = {
    "tinyint": 8,
    "smallint": 16,
    "mediumint": 24,
    "int": 32,
    "bigint": 64,
}


def _columns() -> dict[str, tuple[str, st.SearchStrategy[Any]]]:
    """Column name -> (its SQL type, the strategy of its values as PyMySQL parameters)."""
    columns: dict[str, tuple[str, st.SearchStrategy[Any]]] = {}
    for name, bits in _INTEGERS.items():
        half = 1 << (bits - 1)
        columns[f"{name}_s"] = (name, st.integers(-half, half - 1))
        columns[f"{name}_u"] = (f"{name} unsigned", st.integers(0, (1 << bits) - 1))
    for precision, scale in _DECIMALS:
        limit = 10**precision - 1
        columns[f"d_{precision}_{scale}"] = (
            f"decimal({precision},{scale})",
            (st.sampled_from([-limit, limit, 0]) | st.integers(-limit, limit)).map(
                lambda n, s=scale: _decimal_text(n, s)
            ),
        )
    columns["f"] = ("float", st.floats(width=32, allow_nan=False, allow_infinity=False))
    columns["db"] = ("double", st.floats(allow_nan=False, allow_infinity=False))
    text = st.text(st.characters(exclude_categories=("Cs",)), max_size=20)
    columns["c"] = ("char(5)", st.text(st.characters(exclude_categories=("Cs",)), max_size=5))
    columns["vc"] = ("varchar(20)", text)
    columns["tx"] = ("text", st.text(st.characters(exclude_categories=("Cs",)), max_size=300))
    latin = st.characters(codec="latin-1", exclude_categories=("Cc",))
    columns["lat"] = ("varchar(10) CHARACTER SET latin1", st.text(latin, max_size=10))
    columns["bn"] = ("binary(6)", st.binary(max_size=6))
    columns["vb"] = ("varbinary(10)", st.binary(max_size=10))
    columns["bl"] = ("blob", st.binary(max_size=300))
    columns["dt"] = ("date", st.dates(datetime.date(1000, 1, 1)).map(str))
    for fsp in range(7):
        columns[f"dtm{fsp}"] = (f"datetime({fsp})", _datetimes(fsp, datetime.datetime(1000, 1, 1)))
        columns[f"tm{fsp}"] = (f"time({fsp})", _times(fsp))
    for fsp in (0, 3, 6):
        columns[f"ts{fsp}"] = (
            f"timestamp({fsp}) NULL",
            _datetimes(fsp, datetime.datetime(1970, 1, 2), datetime.datetime(2038, 1, 18)),
        )
    columns["y"] = ("year", st.sampled_from([0, 1901, 2155]) | st.integers(1901, 2155))
    columns["j"] = ("json", _json().map(lambda v: json.dumps(v, ensure_ascii=False)))
    columns["e"] = ("enum('x','y','it''s')", st.sampled_from(["x", "y", "it's"]))
    members = st.sets(st.sampled_from("abc")).map(lambda s: ",".join(sorted(s)))
    columns["s"] = ("set('a','b','c')", members)
    columns["bt"] = ("bit(10)", st.integers(0, (1 << 10) - 1))
    columns["bt64"] = ("bit(64)", st.integers(0, (1 << 64) - 1))
    return columns


def _decimal_text(digits: int, scale: int) -> str:
    """`digits` with `scale` of them after the point, as text: exact at any precision (a
    Decimal context would round past 28 digits)."""
    text = str(abs(digits)).rjust(scale + 1, "0")
    sign = "-" if digits < 0 else ""
    return sign + (text[:-scale] + "." + text[-scale:] if scale else text)


def _datetimes(
    fsp: int, low: datetime.datetime, high: datetime.datetime = datetime.datetime(9999, 12, 31)
) -> st.SearchStrategy[str]:
    """Values with exactly `fsp` fraction digits (the server would round more)."""
    return st.datetimes(low, high).map(
        lambda v: (
            v.strftime("%Y-%m-%d %H:%M:%S") + (f".{v.microsecond:06d}"[: fsp + 1] if fsp else "")
        )
    )


def _times(fsp: int) -> st.SearchStrategy[str]:
    limit = (838 * 3600 + 59 * 60 + 59) * 10**6

    def spelled(micros: int) -> str:
        sign, micros = ("-" if micros < 0 else ""), abs(micros)
        seconds, micro = divmod(micros, 10**6)
        text = f"{sign}{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
        return text + (f".{micro:06d}"[: fsp + 1] if fsp else "")

    step = 10 ** (6 - fsp)
    return st.integers(-limit // step, limit // step).map(lambda n: spelled(n * step))


def _json() -> st.SearchStrategy[Any]:
    leaves = (
        st.none()
        | st.booleans()
        | st.integers(-(2**63), 2**64 - 1)
        | st.floats(allow_nan=False, allow_infinity=False)
        | st.text(st.characters(exclude_categories=("Cs",)), max_size=8)
    )
    return st.recursive(
        leaves,
        lambda inner: (
            st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
        ),
        max_leaves=8,
    )


COLUMNS = _columns()
NAMES = list(COLUMNS)


def _row() -> st.SearchStrategy[dict[str, Any]]:
    """A row: each column a drawn value, or NULL."""
    return st.fixed_dictionaries({n: st.none() | strategy for n, (_, strategy) in COLUMNS.items()})


class Capture:
    """A table of every column, its log reader at the log's end, and its chunk source."""

    def __init__(self, mariadb: MariaDBInfo, monkeypatch: pytest.MonkeyPatch) -> None:
        self.table = TableRef(mariadb.dbname, f"gen_{uuid.uuid4().hex[:8]}")
        monkeypatch.setenv("DBLOG_TEST_GEN_PASSWORD", mariadb.password)
        config = MysqlSourceConfig(
            name="generated",
            dsn=f"mysql://{mariadb.user}@{mariadb.host}:{mariadb.port}/{mariadb.dbname}",
            tables=(self.table,),
            password_env="DBLOG_TEST_GEN_PASSWORD",
            watermark_table=f"watermark_{uuid.uuid4().hex[:8]}",
        )
        self.conn = pymysql.connect(
            **mariadb.connect_kwargs(),
            charset="utf8mb4",
            init_command="SET time_zone = '+00:00', NAMES utf8mb4 COLLATE utf8mb4_bin",
            autocommit=True,
        )
        columns = ", ".join(f"`{n}` {sql}" for n, (sql, _) in COLUMNS.items())
        with self.conn.cursor() as cursor:
            cursor.execute(f"CREATE TABLE `{self.table.name}` (id int PRIMARY KEY, {columns})")
        ensure_setup(config)
        self.reader = MysqlLogReader(config, None, heartbeat_s=0.2)
        self.items: Iterator[LogItem] = single_changes(self.reader.items())
        assert isinstance(next(self.items), Idle)
        self.chunks = MysqlChunkSource(config)
        self.next_id = 0

    def close(self) -> None:
        self.chunks.close()
        self.reader.close()
        self.conn.close()


@pytest.fixture(scope="module")
def capture(mariadb: MariaDBInfo) -> Iterator[Capture]:
    with pytest.MonkeyPatch.context() as monkeypatch:
        found = Capture(mariadb, monkeypatch)
        try:
            yield found
        finally:
            found.close()


def _spelled(row: Row) -> bytes:
    return json.dumps(row, separators=(",", ":"), ensure_ascii=False).encode()


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(pairs=st.lists(st.tuples(_row(), _row()), min_size=1, max_size=4))
def test_the_lean_decoder_and_a_chunk_read_give_the_same_json(
    capture: Capture, pairs: list[tuple[dict[str, Any], dict[str, Any]]]
) -> None:
    table = f"`{capture.table.name}`"
    first = capture.next_id + 1
    capture.next_id += len(pairs)
    ids = range(first, first + len(pairs))
    marks = ", ".join(["%s"] * (len(NAMES) + 1))
    assigned = ", ".join(f"`{n}` = %s" for n in NAMES)
    updated_keys = set()
    with capture.conn.cursor() as cursor:
        cursor.execute("SET SESSION sql_mode = 'STRICT_ALL_TABLES'")
        for key, (inserted, updated) in zip(ids, pairs, strict=True):
            values = [inserted[n] for n in NAMES]
            cursor.execute(f"INSERT INTO {table} VALUES ({marks})", [key, *values])
            values = [updated[n] for n in NAMES]
            # An update that changes nothing is not logged: only a changed row is awaited.
            if cursor.execute(f"UPDATE {table} SET {assigned} WHERE id = %s", [*values, key]):
                updated_keys.add(key)
    inserts: dict[int, Row] = {}
    logged: dict[int, Row] = {}
    deadline = time.monotonic() + 120
    while any(k not in inserts for k in ids) or any(k not in logged for k in updated_keys):
        assert time.monotonic() < deadline, "the log reader did not give every change in 120 s"
        item = next(capture.items)
        if not isinstance(item, Change) or item.event.key["id"] not in ids:
            continue
        event = item.event
        key = event.key["id"]
        assert isinstance(key, int) and event.after is not None
        if event.before is None:
            inserts[key] = event.after
        else:
            assert event.before == inserts[key], "the update's before image is the insert's"
            logged[key] = event.after
    afters = {k: logged.get(k, inserts[k]) for k in ids}
    chunk = Chunk(capture.table, 0, keys=tuple((k,) for k in ids))
    dumped = {row["id"]: row for row in capture.chunks.read_chunk(chunk).rows}
    assert [_spelled(afters[k]) for k in ids] == [_spelled(dumped[k]) for k in ids]
