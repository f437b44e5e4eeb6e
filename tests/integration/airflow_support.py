"""Airflow for the tests: a private AIRFLOW_HOME (sqlite), connections from the environment,
and `dag.test()` runs in a subprocess, so the pytest process never imports a configured
Airflow and each run starts from a clean interpreter.

The passwords reach Airflow only as connections (`AIRFLOW_CONN_*` in the subprocess's
environment); the password variables of the dblog TOML are removed from that environment, so a
dump that works proves the operator handed the connection's secrets to Spark itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from airflow_provider_dblog.devservices.postgres import PostgresInfo
from airflow_provider_dblog.devservices.redis import RedisInfo
from tests.integration.dag_test_runner import RESULT_MARK, START_MARK
from tests.integration.e2e_support import (
    MYSQL_PASSWORD_ENV,
    PASSWORD_ENV,
    REDIS_PASSWORD_ENV,
    REPO,
)

BIN = Path(sys.executable).parent


def dblog_connection(
    redis_server: RedisInfo, pg: PostgresInfo | None, source_name: str, config_path: Path
) -> dict[str, Any]:
    """The `dblog` connection; the source's password as `source_password` if `pg` is given
    (else the caller adds a `source_conn_id`)."""
    extra = {"source_name": source_name, "config_path": str(config_path)}
    if pg is not None:
        extra["source_password"] = pg.password
    return {
        "conn_type": "dblog",
        "host": redis_server.host,
        "port": redis_server.port,
        "schema": str(redis_server.db),
        "password": redis_server.password,
        "extra": extra,
    }


def holding_the_configuration(connection: dict[str, Any], config_path: Path) -> dict[str, Any]:
    """The same connection with the TOML's sections in its extra (all but `[redis]`, which is
    the connection's own host, port and password) instead of `config_path`: a worker then
    needs no file."""
    sections = tomllib.loads(config_path.read_text())
    extra = {
        k: v for k, v in connection["extra"].items() if k not in ("config_path", "source_name")
    }
    extra.update({name: section for name, section in sections.items() if name != "redis"})
    return {**connection, "extra": extra}


def airflow_env(home: Path, dblog_conn: dict[str, Any], **extra: str) -> dict[str, str]:
    """The environment of an Airflow process of the tests, in `home`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    for secret in (PASSWORD_ENV, MYSQL_PASSWORD_ENV, REDIS_PASSWORD_ENV):
        env.pop(secret, None)
    env.update(
        AIRFLOW_HOME=str(home),
        AIRFLOW__CORE__DAGS_FOLDER=str(REPO / "dags"),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__CORE__PARALLELISM="2",
        AIRFLOW_CONN_DBLOG_DEFAULT=json.dumps(dblog_conn),
        AIRFLOW_CONN_SPARK_DEFAULT=json.dumps(
            {"conn_type": "spark", "host": "local[2]", "extra": {"deploy-mode": "client"}}
        ),
        PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
        PYSPARK_PYTHON=sys.executable,
        DBLOG_POLL_S="0.5",
    )
    env.update(extra)
    return env


def migrate(env: dict[str, str]) -> None:
    done = subprocess.run(
        [str(BIN / "airflow"), "db", "migrate"], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


@dataclass
class DagTestResult:
    state: str
    tasks: dict[str, str]
    output: str


def dag_test(env: dict[str, str], dag_id: str, conf: dict[str, Any]) -> DagTestResult:
    """`dag.test(run_conf=conf)` in a subprocess; the run's state, its tasks' states and all
    it printed (task logs included)."""
    return dag_tests(env, [(dag_id, conf)])[0]


def dag_tests(env: dict[str, str], runs: list[tuple[str, dict[str, Any]]]) -> list[DagTestResult]:
    """Several `dag.test()` runs, one after the other in one subprocess (Airflow starts once),
    each with what it printed; a run the process did not finish has the state "error"."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.integration.dag_test_runner", json.dumps(runs)],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600 * len(runs),
    )
    stdout = _runs(done.stdout, len(runs))
    stderr = _runs(done.stderr, len(runs))
    return [_result(out, out + err, done.stderr) for out, err in zip(stdout, stderr, strict=True)]


def _runs(printed: str, count: int) -> list[str]:
    """What each run printed, cut at the start lines (a run never started printed nothing)."""
    parts = printed.split(START_MARK + "\n")[1:]
    return parts + [""] * (count - len(parts))


def _result(stdout: str, output: str, stderr: str) -> DagTestResult:
    for line in stdout.splitlines():
        if line.startswith(RESULT_MARK):
            result = json.loads(line[len(RESULT_MARK) :])
            return DagTestResult(result["state"], result["tasks"], output)
    return DagTestResult("error", {}, output + stderr[-6000:])
