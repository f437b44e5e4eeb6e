"""`SparkDumpLauncher` and the verify's command without running Spark: the applications are
found by import, and the spark-submit command the Spark provider builds from the connections
carries ids, paths and numbers, while the passwords go into the environment spark-submit
inherits."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

import airflow_provider_dblog
from airflow_provider_dblog.hooks.dblog import DBLogHook
from airflow_provider_dblog.hooks.spark_launcher import (
    SparkDumpLauncher,
    dump_application,
    verify_application,
    verify_command,
)

REDIS_PASSWORD, SOURCE_PASSWORD = "redis-pw-5b1e", "source-pw-77c3"
REDIS_ENV, SOURCE_ENV = "LAUNCHER_UNIT_REDIS_PASSWORD", "LAUNCHER_UNIT_SOURCE_PASSWORD"


def test_the_dump_application_is_found_beside_the_package_by_import() -> None:
    application = Path(dump_application())
    assert application.is_file()
    assert (application.parent.name, application.name) == ("spark_jobs", "dump.py")
    # Installed from the wheel or run from the source tree: both packages sit side by side.
    assert application.parents[1] == Path(airflow_provider_dblog.__file__).parents[1]


@pytest.fixture
def launcher(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SparkDumpLauncher:
    toml = tmp_path / "dblog.toml"
    toml.write_text(
        f"""
[source]
name = "shop"
dsn = "host=127.0.0.1 port=1 dbname=x user=x"
password_env = "{SOURCE_ENV}"
tables = ["public.accounts"]

[redis]
url = "redis://127.0.0.1:6379/0"
password_env = "{REDIS_ENV}"

[output]
type = "ndjson"
directory = "unused"
"""
    )
    dblog = {
        "conn_type": "dblog",
        "host": "127.0.0.1",
        "port": 6379,
        "password": REDIS_PASSWORD,
        "extra": {
            "source_name": "shop",
            "config_path": str(toml),
            "source_password": SOURCE_PASSWORD,
        },
    }
    monkeypatch.setenv("AIRFLOW_CONN_DBLOG_UNIT", json.dumps(dblog))
    monkeypatch.setenv(
        "AIRFLOW_CONN_SPARK_UNIT", json.dumps({"conn_type": "spark", "host": "local[2]"})
    )
    for name in (REDIS_ENV, SOURCE_ENV, "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON"):
        monkeypatch.delenv(name, raising=False)  # and restored after the test
    return SparkDumpLauncher(
        DBLogHook("dblog_unit"),
        "spark_unit",
        "d.1",
        window_timeout_s=2.5,
        source_patience_s=40,
        tasks_per_chunk=4,
        spark_conf={"spark.ui.showConsoleProgress": "false"},
    )


def test_the_command_carries_no_secret_and_the_environment_carries_them(
    launcher: SparkDumpLauncher,
) -> None:
    command = launcher.command()
    assert command[0] == "spark-submit"
    assert command[command.index("--master") + 1] == "local[2]"
    assert command[command.index("--name") + 1] == "dblog-dump-d.1"
    assert "spark.ui.showConsoleProgress=false" in command
    assert command[command.index("--py-files") + 1].endswith(".zip")
    application = command.index(dump_application())
    assert command[application + 1 :] == [
        "--dump-id",
        "d.1",
        "--config",
        launcher.hook.settings.config_path,
        "--window-timeout",
        "2.5",
        "--source-patience",
        "40",
        "--tasks",
        "4",
    ]
    assert not any(REDIS_PASSWORD in arg or SOURCE_PASSWORD in arg for arg in command)
    assert (os.environ[REDIS_ENV], os.environ[SOURCE_ENV]) == (REDIS_PASSWORD, SOURCE_PASSWORD)
    # The driver runs this Python, and the driver picks its workers' (`use_driver_python`).
    assert os.environ["PYSPARK_DRIVER_PYTHON"] == sys.executable
    assert "PYSPARK_PYTHON" not in os.environ


def test_a_connection_holding_the_configuration_hands_it_over_as_json(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No TOML on the worker: the application gets the connection's sections in
    `--config-json` (no password in them) and the passwords under the default variables."""
    from airflow_provider_dblog.config import parse_config

    source = {"name": "shop", "dsn": "host=127.0.0.1 port=1 dbname=x user=x", "tables": ["t"]}
    extra = {
        "source": source,
        "output": {"type": "ndjson", "directory": "unused"},
        "source_password": SOURCE_PASSWORD,
    }
    dblog = {"conn_type": "dblog", "port": 6379, "password": REDIS_PASSWORD, "extra": extra}
    monkeypatch.setenv("AIRFLOW_CONN_DBLOG_ONLY", json.dumps(dblog))
    for name in ("DBLOG_SOURCE_PASSWORD", "DBLOG_REDIS_PASSWORD", "PYSPARK_DRIVER_PYTHON"):
        monkeypatch.delenv(name, raising=False)
    launcher = SparkDumpLauncher(DBLogHook("dblog_only"), "spark_unit", "d.2")
    monkeypatch.setenv(
        "AIRFLOW_CONN_SPARK_UNIT", json.dumps({"conn_type": "spark", "host": "local[2]"})
    )
    command = launcher.command()
    assert "--config" not in command
    passed = json.loads(command[command.index("--config-json") + 1])
    assert parse_config(passed, "--config-json") == launcher.hook.config
    assert not any(REDIS_PASSWORD in arg or SOURCE_PASSWORD in arg for arg in command)
    assert os.environ["DBLOG_SOURCE_PASSWORD"] == SOURCE_PASSWORD
    assert os.environ["DBLOG_REDIS_PASSWORD"] == REDIS_PASSWORD


def test_the_verify_command_runs_the_stored_run_with_no_secret(
    launcher: SparkDumpLauncher,
) -> None:
    command = verify_command(
        launcher.hook, "spark_unit", "v.1", window_timeout_s=7.5, tasks_per_chunk=3
    )
    assert command[0] == "spark-submit"
    assert command[command.index("--name") + 1] == "dblog-verify-v.1"
    assert command[command.index("--py-files") + 1].endswith(".zip")
    application = command.index(verify_application())
    assert Path(verify_application()).parent == Path(dump_application()).parent
    assert command[application + 1 :] == [
        "--verify-id",
        "v.1",
        "--config",
        launcher.hook.settings.config_path,
        "--window-timeout",
        "7.5",
        "--tasks",
        "3",
    ]
    assert not any(REDIS_PASSWORD in arg or SOURCE_PASSWORD in arg for arg in command)
    assert (os.environ[REDIS_ENV], os.environ[SOURCE_ENV]) == (REDIS_PASSWORD, SOURCE_PASSWORD)
