"""The Spark applications on a standalone cluster: a master and one worker started here on
loopback, and `spark-submit spark_jobs/dump.py` (with a tailer running) and `compact.py` in
client mode against them.

The executors' Python has the third-party dependencies but not this package, so the jobs work
only because each application ships the package to them. The worker gets the passwords in its
environment, as a real deployment does; none may appear in a log.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import sysconfig
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import pyspark
import pytest

from airflow_provider_dblog.core.dump_plan import DumpKind, DumpRequest
from airflow_provider_dblog.core.event import (
    Event,
    Op,
    Origin,
    PlainEvent,
    Row,
    SourceInfo,
    TableRef,
    table_event,
)
from airflow_provider_dblog.core.position import Position
from airflow_provider_dblog.core.schema import Column, TableSchema
from airflow_provider_dblog.demo.postgres import TABLES, compare
from airflow_provider_dblog.devservices.postgres import PostgresInfo
from airflow_provider_dblog.devservices.process import free_port
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.lake.table import LakeTable
from airflow_provider_dblog.outputs.ndjson import NdjsonOutput
from airflow_provider_dblog.state import DumpState
from tests.integration.e2e_support import (
    PASSWORD_ENV,
    REDIS_PASSWORD_ENV,
    REPO,
    wait_caught_up,
    wait_until,
)
from tests.integration.spark_support import Pipeline, running_pipeline

pytestmark = pytest.mark.integration
ROWS = 300
SPARK_CLASS = Path(pyspark.__file__).parent / "bin" / "spark-class"
SPARK_SUBMIT = Path(pyspark.__file__).parent / "bin" / "spark-submit"
PYTHON_VARS = ("PYTHONPATH", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")


@pytest.fixture
def pipeline(pg15: PostgresInfo, redis_server: RedisInfo, tmp_path: Path) -> Iterator[Pipeline]:
    with running_pipeline(pg15, redis_server, tmp_path, ROWS) as pipeline:
        yield pipeline


def worker_python(where: Path) -> Path:
    """A venv whose one .pth line adds this .venv's site-packages: psycopg and redis import,
    but this package's editable install does not (a .pth in an added directory is not read)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    python = where / "bin" / "python"
    own = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(own, "dblog-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


def base_env(work: Path) -> dict[str, str]:
    """No Python path or interpreter choice of this process, no passwords; Spark on loopback
    with its scratch space in `work`."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in (*PYTHON_VARS, PASSWORD_ENV, REDIS_PASSWORD_ENV)
    }
    env.update(
        SPARK_LOCAL_IP="127.0.0.1",
        SPARK_LOCAL_DIRS=str(work / "local"),
        SPARK_LOG_DIR=str(work / "logs"),
        SPARK_DAEMON_MEMORY="256m",
    )
    return env


def alive_workers(ui_port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=2) as response:
            state = json.load(response)
    except (OSError, ValueError):
        return 0  # the master is not serving yet (no answer, or a page that is not its JSON)
    return sum(1 for w in state.get("workers", []) if w.get("state") == "ALIVE")


@contextmanager
def standalone_cluster(work: Path, worker_env: dict[str, str]) -> Iterator[str]:
    """A master and one worker (2 cores, 1 GiB) as child processes in their own process
    groups; yields the master URL once the worker has registered; kills both groups (and so
    the executors) at the end."""
    port, ui_port = free_port(), free_port()
    master_url = f"spark://127.0.0.1:{port}"
    daemons = [
        (
            "master",
            [SPARK_CLASS, "org.apache.spark.deploy.master.Master"],
            ["--host", "127.0.0.1", "--port", str(port), "--webui-port", str(ui_port)],
            base_env(work),
        ),
        (
            "worker",
            [SPARK_CLASS, "org.apache.spark.deploy.worker.Worker"],
            [
                *("--host", "127.0.0.1", "--cores", "2", "--memory", "1g"),
                *("--work-dir", str(work / "worker"), "--webui-port", str(free_port())),
                master_url,
            ],
            worker_env,
        ),
    ]
    processes: list[subprocess.Popen[bytes]] = []
    try:
        for name, command, args, env in daemons:
            with (work / f"{name}.log").open("ab") as log:
                processes.append(
                    subprocess.Popen(
                        [*map(str, command), *args],
                        env=env,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )

        def registered() -> bool:
            for (name, *_), process in zip(daemons, processes, strict=True):
                log_tail = (work / f"{name}.log").read_text()[-2000:]
                assert process.poll() is None, f"the Spark {name} exited: {log_tail}"
            return alive_workers(ui_port) == 1

        wait_until(registered, 90, "the Spark worker registering with the master")
        yield master_url
    finally:
        for process in reversed(processes):
            with suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            with suppress(subprocess.TimeoutExpired):
                process.wait(20)
            with suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)  # executors and Python daemons left
            process.wait(10)


@dataclass
class Cluster:
    master_url: str
    work: Path
    python: Path
    """The workers' Python: the dependencies, not this package."""
    secrets: dict[str, str]

    def submit(self, job: str, *args: str, log: Path) -> int:
        """`spark-submit spark_jobs/<job>` in client mode, the driver on this .venv's Python,
        the passwords in its environment only."""
        command = [
            *(str(SPARK_SUBMIT), "--master", self.master_url, "--deploy-mode", "client"),
            *("--conf", "spark.driver.host=127.0.0.1", "--conf", "spark.ui.enabled=false"),
            *("--conf", "spark.executor.memory=512m", "--conf", "spark.cores.max=2"),
            *("--conf", f"spark.pyspark.python={self.python}"),
            *("--conf", f"spark.pyspark.driver.python={sys.executable}"),
            str(REPO / "spark_jobs" / job),
            *args,
        ]
        with log.open("ab") as out:
            driver = subprocess.Popen(
                command,
                env={**base_env(self.work), **self.secrets},
                cwd=self.work,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            return driver.wait(300)
        except subprocess.TimeoutExpired:
            os.killpg(driver.pid, signal.SIGKILL)  # spark-submit and its Python driver
            driver.wait()
            raise

    def apps_with_the_zip(self) -> set[str]:
        found = (self.work / "worker").glob("app-*/*/airflow_provider_dblog-*.zip")
        return {path.parent.parent.name for path in found}


@pytest.fixture(scope="module")
def cluster(
    pg15: PostgresInfo, redis_server: RedisInfo, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    """One master and worker for this module; the worker's environment holds the passwords
    (how executors get them) and names the workers' Python, which cannot import this package."""
    work = tmp_path_factory.mktemp("spark-cluster")
    python = worker_python(work / "worker-venv")
    probe = [python, "-c", "import airflow_provider_dblog"]
    found = subprocess.run(probe, cwd=work, env=base_env(work), capture_output=True)
    assert found.returncode != 0 and b"No module named 'airflow_provider_dblog'" in found.stderr
    deps = [python, "-c", "import psycopg, redis, pyspark"]
    subprocess.run(deps, cwd=work, env=base_env(work), check=True)

    secrets = {PASSWORD_ENV: pg15.password, REDIS_PASSWORD_ENV: redis_server.password}
    worker_env = {**base_env(work), **secrets, "PYSPARK_PYTHON": str(python)}
    with standalone_cluster(work, worker_env) as master_url:
        yield Cluster(master_url, work, python, secrets)


def test_full_dump_on_a_standalone_cluster_ships_the_package(
    cluster: Cluster, pipeline: Pipeline, tmp_path: Path
) -> None:
    store = pipeline.store
    store.dumps.create(DumpRequest("cluster", DumpKind.ALL, TABLES, chunk_size=100, parallelism=2))
    apps_before = cluster.apps_with_the_zip()
    args = ("--dump-id", "cluster", "--config", str(pipeline.config_path))
    exit_status = cluster.submit("dump.py", *args, log=tmp_path / "driver.log")
    driver_log = (tmp_path / "driver.log").read_text()
    assert exit_status == 0, driver_log[-4000:]
    assert "shipping airflow_provider_dblog-" in driver_log
    assert len(cluster.apps_with_the_zip() - apps_before) == 1, "no executor fetched the zip"

    wait_caught_up(pipeline.dbs)
    assert compare(pipeline.dbs.source_dsn, pipeline.dbs.target_dsn) == []
    status = store.dumps.status("cluster")
    assert status is not None and status.state is DumpState.DONE
    assert status.rows == ROWS * 3 and status.chunks == 9  # 300 rows a table in chunks of 100

    logs = [
        path
        for directory in (cluster.work, tmp_path)
        for path in directory.rglob("*")
        if path.is_file() and path.suffix not in (".zip", ".jar")
    ]
    assert any(p.parent.name.isdigit() and p.name == "stderr" for p in logs)  # executor logs
    for path in logs:
        data = path.read_bytes()
        for name, secret in cluster.secrets.items():
            assert secret.encode() not in data, f"{name}'s value is in {path}"


def test_compaction_on_a_standalone_cluster_ships_the_package(
    cluster: Cluster, tmp_path: Path
) -> None:
    def event(op: Op, key: int, after: Row | None, commit: int, seq: int) -> Event:
        source = SourceInfo("src", "db", "app", "users", Position(commit, seq), Origin.LOG)
        return PlainEvent(op, {"id": key}, None, after, source, 1)

    columns = (Column("id", "integer", False, None), Column("n", "text", True, None))
    opening = SourceInfo("src", "db", "app", "users", Position(99, 0), Origin.LOG)
    events_dir, output = tmp_path / "events", tmp_path / "lake"
    with NdjsonOutput(events_dir) as out:
        out.write(
            [
                table_event(Op.SCHEMA, opening, 1, TableSchema(columns, ("id",))),
                event(Op.CREATE, 1, {"id": 1, "n": "a"}, 100, 0),
                event(Op.CREATE, 2, {"id": 2, "n": "b"}, 100, 1),
                event(Op.UPDATE, 1, {"id": 1, "n": "a2"}, 200, 0),
                event(Op.DELETE, 2, None, 300, 0),
                event(Op.CREATE, 3, {"id": 3, "n": "c"}, 300, 1),
            ],
            1,
        )
    apps_before = cluster.apps_with_the_zip()
    args = ("--input", str(events_dir), "--output", str(output), "--local-below", "0")
    exit_status = cluster.submit("compact.py", *args, log=tmp_path / "driver.log")
    assert exit_status == 0, (tmp_path / "driver.log").read_text()[-4000:]
    assert len(cluster.apps_with_the_zip() - apps_before) == 1, "no executor fetched the zip"
    rows = LakeTable.open(output, TableRef("app", "users")).rows().to_pylist()
    assert {r["id"]: (r["n"], r["_dblog_commit"], r["_dblog_seq"]) for r in rows} == {
        1: ("a2", 200, 0),
        3: ("c", 300, 1),
    }
