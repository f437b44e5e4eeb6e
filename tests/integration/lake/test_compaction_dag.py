"""The `dblog_lake_compaction` DAG run with `dag.test()` in a private Airflow, on events the
tailer's output holds beyond what the lake has folded: the run folds them, and the lake reads
in DuckDB as the stream says. It needs no server: a run without `prune` reads the TOML, the
event files and the lake alone (the lake's tables exist, so no catalog is asked)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from airflow_provider_dblog.compaction.run import compact
from airflow_provider_dblog.outputs.ndjson import event_files
from tests.integration.airflow_support import airflow_env, dag_tests, migrate
from tests.integration.compaction.test_spark_compact import Stream, expected, found, write
from tests.unit.compaction.test_maintenance import write_config

pytestmark = pytest.mark.integration


def test_the_dag_folds_the_events_written_since_the_last_run(tmp_path: Path) -> None:
    events, lake = tmp_path / "events", tmp_path / "lake"
    stream = Stream(3)
    write(events, stream.batch(20), [])
    compact(None, events, lake)  # the tables, from the stream's schema events
    write(events, stream.batch(60), [])
    assert found(lake) != expected(stream)
    config = write_config(tmp_path)  # [output] directory tmp_path/events, [lake] root .../lake
    connection = {
        "conn_type": "dblog",
        "host": "127.0.0.1",
        "port": 6379,
        "schema": "0",
        "extra": {"source_name": "shop", "config_path": str(config)},
    }
    env = airflow_env(tmp_path / "airflow", connection)
    migrate(env)
    (done,) = dag_tests(env, [("dblog_lake_compaction", {})])
    assert (done.state, done.tasks) == ("success", {"compact": "success"}), done.output[-6000:]
    assert found(lake) == expected(stream)
    cursor = json.loads((lake / "_compact_state.json").read_text())
    assert cursor["position"] == stream_end(events)


def stream_end(events: Path) -> list[int]:
    """The position of the last event in the files."""
    last = event_files(events)[-1].read_text().splitlines()[-1]
    position: list[int] = json.loads(last)["source"]["position"]
    return position
