"""The Spark dump on a standalone cluster: a master and one worker started here on loopback, and
`spark-submit spark_jobs/dump.py` in client mode against them, with a tailer running.

The executors' Python has the third-party dependencies but not this package, so the dump works
only because the application ships the package to them. The worker gets the passwords in its
environment, as a real deployment does; none may appear in a log.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import sysconfig
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import pyspark
import pytest

from airflow_provider_dblog.core.dump_plan import DumpKind, DumpRequest
from airflow_provider_dblog.demo import TABLES, compare
from airflow_provider_dblog.devservices.postgres import PostgresInfo
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.state_store import DumpState
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


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


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
    except OSError:
        return 0  # the master is not serving yet
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


def test_full_dump_on_a_standalone_cluster_ships_the_package(
    pipeline: Pipeline, pg15: PostgresInfo, redis_server: RedisInfo, tmp_path: Path
) -> None:
    python = worker_python(tmp_path / "worker-venv")
    probe = [python, "-c", "import airflow_provider_dblog"]
    found = subprocess.run(probe, cwd=tmp_path, env=base_env(tmp_path), capture_output=True)
    assert found.returncode != 0 and b"No module named 'airflow_provider_dblog'" in found.stderr
    deps = [python, "-c", "import psycopg, redis, pyspark"]
    subprocess.run(deps, cwd=tmp_path, env=base_env(tmp_path), check=True)

    secrets = {PASSWORD_ENV: pg15.password, REDIS_PASSWORD_ENV: redis_server.password}
    worker_env = {**base_env(tmp_path), **secrets, "PYSPARK_PYTHON": str(python)}
    store = pipeline.store
    store.create_dump(DumpRequest("cluster", DumpKind.ALL, TABLES, chunk_size=100, parallelism=2))
    with standalone_cluster(tmp_path, worker_env) as master_url:
        submit = [
            *(str(SPARK_SUBMIT), "--master", master_url, "--deploy-mode", "client"),
            *("--conf", "spark.driver.host=127.0.0.1", "--conf", "spark.ui.enabled=false"),
            *("--conf", "spark.executor.memory=512m", "--conf", "spark.cores.max=2"),
            *("--conf", f"spark.pyspark.python={python}"),
            *("--conf", f"spark.pyspark.driver.python={sys.executable}"),
            str(REPO / "spark_jobs" / "dump.py"),
            *("--dump-id", "cluster", "--config", str(pipeline.config_path)),
        ]
        with (tmp_path / "driver.log").open("ab") as log:
            driver = subprocess.run(
                submit,
                env={**base_env(tmp_path), **secrets},
                cwd=tmp_path,
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=300,
                start_new_session=True,
            )
    driver_log = (tmp_path / "driver.log").read_text()
    assert driver.returncode == 0, driver_log[-4000:]
    assert "shipping airflow_provider_dblog-" in driver_log
    shipped = list((tmp_path / "worker").glob("app-*/*/airflow_provider_dblog-*.zip"))
    assert shipped, "no executor fetched the package zip"

    wait_caught_up(pipeline.dbs)
    assert compare(pipeline.dbs.source_dsn, pipeline.dbs.target_dsn) == []
    status = store.dump_status("cluster")
    assert status is not None and status.state is DumpState.DONE
    assert status.rows == ROWS * 3 and status.chunks == 9  # 300 rows a table in chunks of 100

    logs = [p for p in tmp_path.rglob("*") if p.is_file() and p.suffix not in (".zip", ".jar")]
    assert any(p.parent.name.isdigit() and p.name == "stderr" for p in logs)  # executor logs
    for path in logs:
        data = path.read_bytes()
        for name, secret in secrets.items():
            assert secret.encode() not in data, f"{name}'s value is in {path}"
