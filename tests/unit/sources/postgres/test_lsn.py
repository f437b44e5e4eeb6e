"""PostgreSQL's LSN spelling, both ways."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_provider_dblog.sources.postgres.lsn import format_pg_lsn, parse_pg_lsn

pytestmark = pytest.mark.unit


@given(st.integers(0, 2**64 - 1))
def test_pg_lsn_round_trip(lsn: int) -> None:
    assert parse_pg_lsn(format_pg_lsn(lsn)) == lsn


def test_pg_lsn_spelling_and_errors() -> None:
    assert parse_pg_lsn("16/B374D848") == (0x16 << 32) | 0xB374D848
    assert format_pg_lsn(0x16_B374D848) == "16/B374D848"
    with pytest.raises(ValueError, match="not a PostgreSQL LSN"):
        parse_pg_lsn("16B374D848")
    with pytest.raises(ValueError, match="out of range"):
        format_pg_lsn(2**64)
