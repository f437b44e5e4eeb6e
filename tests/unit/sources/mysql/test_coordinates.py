"""Binlog coordinates as one integer in commit order."""

from __future__ import annotations

import pytest

from airflow_provider_dblog.sources.mysql.coordinates import binlog_file_number, mysql_commit

pytestmark = pytest.mark.unit


def test_mysql_commit_grows_with_file_then_offset() -> None:
    assert mysql_commit(2, 4) > mysql_commit(1, 2**32 - 1)
    assert binlog_file_number("mysql-bin.000042") == 42
    with pytest.raises(ValueError, match="not a binlog file name"):
        binlog_file_number("mysql-bin")
    with pytest.raises(ValueError, match="out of range"):
        mysql_commit(1, 2**32)
