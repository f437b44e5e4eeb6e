"""The value rules of `dblog` options and the live view's controls, how the command line
reports a broken one, and the one-line reasons of `dblog status`, without a server."""

from __future__ import annotations

import argparse
import re

import pytest

from airflow_provider_dblog.cli import build_parser
from airflow_provider_dblog.cli.common import first_line, one_line, option
from airflow_provider_dblog.cli.status import detail_text
from airflow_provider_dblog.core.errors import InvalidRequest
from airflow_provider_dblog.core.values import dump_id, finite_number, whole_number

REASON = """UndefinedColumn: column "name" does not exist
LINE 1: SELECT "id", "name" FROM "public"."items" WHERE ...
                     ^
HINT:  Perhaps you meant to reference the column "items.names"."""


def test_a_reason_in_a_table_cell_is_its_first_line_cut_to_width() -> None:
    assert first_line(REASON) == 'UndefinedColumn: column "name" does not exist'
    assert first_line("\n  x" + "y" * 200, 10) == "xyyyyyyyy…"
    assert first_line("") == ""
    assert one_line(REASON).count(" | ") == 3 and "\n" not in one_line(REASON)


@pytest.mark.parametrize(
    ("parse", "good", "bad"),
    [
        (whole_number(1), {"1": 1, " 42 ": 42, "+3": 3}, ["0", "-1", "1_000", "١٢", "1.0", ""]),
        (whole_number(0), {"0": 0}, ["-1"]),
        (finite_number(0), {"0": 0.0, "2.5": 2.5, "1e3": 1000.0}, ["-1", "nan", "inf", "1_0"]),
        (finite_number(0, above=True), {"0.1": 0.1}, ["0", "-0.0"]),
        (dump_id, {"a.b:c-1_2": "a.b:c-1_2"}, ["", "a b", "x/y", "a" * 201, "é"]),
    ],
)
def test_option_values(parse: object, good: dict[str, object], bad: list[str]) -> None:
    assert callable(parse)
    for text, value in good.items():
        assert parse(text) == value
        assert option(parse)(text) == value
    for text in bad:
        with pytest.raises(InvalidRequest) as refused:
            parse(text)
        with pytest.raises(argparse.ArgumentTypeError, match=f"^{re.escape(str(refused.value))}$"):
            option(parse)(text)


def test_a_bad_option_value_names_the_flag_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["throttle", "d1", "--chunk-size", "0"])
    assert exited.value.code == 2
    assert "argument --chunk-size: must be at least 1, got 0" in capsys.readouterr().err


def test_one_dump_in_full_shows_its_whole_reason_on_lines_of_its_own() -> None:
    text = detail_text(
        {
            "dump_id": "d1",
            "state": "failed",
            "reason": REASON,
            "chunks": 2,
            "rows": 100,
            "windows_retried": 1,
            "request": {
                "kind": "keys",
                "tables": ["public.items"],
                "keys": [["a"], ["b"]],
                "chunk_size": 50,
                "parallelism": 1,
            },
            "progress": [
                {
                    "table": "public.items",
                    "chunks_done": 2,
                    "rows_done": 100,
                    "done": False,
                    "started": True,
                }
            ],
            "controls": {
                "paused": False,
                "cancelled": False,
                "chunk_size": 50,
                "delay_ms": 0,
                "max_rows_per_s": 40.0,
            },
            "driver": None,
        }
    )
    lines = text.splitlines()
    assert lines[0] == "dump d1: failed"
    assert "keys of public.items, 2 keys, chunk size 50, parallelism 1" in lines[1]
    assert "chunk size 50, delay 0 ms, 40 rows/s" in text
    assert "  table     public.items: 2 chunks, 100 rows, started" in lines
    assert lines[-5:] == ["  reason", *(f"    {line}" for line in REASON.splitlines())]
