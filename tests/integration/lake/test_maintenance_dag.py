"""The `dblog_lake_maintenance` DAG run with `dag.test()` in a private Airflow, on a lake of small
files under the `dblog` connection's TOML: the run compacts them and the table reads the same
in DuckDB; a run with a retention below the floor fails at once, naming the floor, and changes
nothing. It needs no server: the maintenance reads the TOML and the lake alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from airflow_provider_dblog.lake.table import LakeTable
from tests.integration.airflow_support import airflow_env, dag_tests, migrate
from tests.unit.compaction.test_maintenance import (
    TABLE,
    lake_with_small_files,
    listed,
    read,
    write_config,
)

pytestmark = pytest.mark.integration


def test_the_dag_compacts_the_lake_and_refuses_a_retention_below_the_floor(
    tmp_path: Path,
) -> None:
    lake = tmp_path / "lake"
    lake_with_small_files(lake)
    before, files = read(lake), len(listed(lake))
    config = write_config(tmp_path)  # Redis at 127.0.0.1:6379/0, as the connection says
    connection = {
        "conn_type": "dblog",
        "host": "127.0.0.1",
        "port": 6379,
        "schema": "0",
        "extra": {"source_name": "shop", "config_path": str(config)},
    }
    env = airflow_env(tmp_path / "airflow", connection)
    migrate(env)
    refused, done = dag_tests(
        env,
        [
            ("dblog_lake_maintenance", {"retention_hours": 0}),
            ("dblog_lake_maintenance", {"tables": [str(TABLE)], "retention_hours": 1}),
        ],
    )
    assert (refused.state, refused.tasks) == ("failed", {"maintain": "failed"}), refused.output
    assert "a vacuum retention of 0 hours is below the floor of 1" in refused.output
    assert "up_for_retry" not in refused.output
    assert (done.state, done.tasks) == ("success", {"maintain": "success"}), done.output[-6000:]
    assert f"app.users: optimize rewrote {files} files into 1; " in done.output
    assert read(lake) == before and len(listed(lake)) == 1
    history = LakeTable.open(lake, TABLE).delta.history()
    optimized = [c for c in history if c.get("dblog.operation") == "maintenance"]
    assert [c["operation"] for c in optimized] == ["WRITE"]  # the key range rewritten sorted
    assert json.loads((lake / str(TABLE) / "_delta_log" / "_last_checkpoint").read_text())
