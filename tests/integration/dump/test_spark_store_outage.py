"""A Spark dump's driver that starts while Redis (the state store) is down waits for it, as a
dump waits between chunks: spark_jobs/dump.py runs as its own application on local[2], Redis
stopped before it starts and started again once the driver says it waits; the dump then runs
to the end and the target equals the source."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_provider_dblog.core.dump_plan import DumpKind, DumpRequest
from airflow_provider_dblog.demo.postgres import TABLES, compare
from airflow_provider_dblog.devservices.postgres import PostgresInfo
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.state import DumpState
from tests.integration.e2e_support import REPO, cli_env, wait_caught_up, wait_until
from tests.integration.spark_support import running_pipeline

pytestmark = pytest.mark.integration
ROWS = 200


def test_a_spark_driver_started_while_redis_is_down_waits_for_it(
    pg15: PostgresInfo, redis_server: RedisInfo, tmp_path: Path
) -> None:
    with running_pipeline(pg15, redis_server, tmp_path, ROWS) as pipeline:
        dbs, store = pipeline.dbs, pipeline.store
        store.dumps.create(DumpRequest("outage", DumpKind.ALL, TABLES, chunk_size=100))
        env = cli_env(dbs, redis_server, PYSPARK_PYTHON=sys.executable)
        log = tmp_path / "spark-dump.log"
        command = [
            sys.executable, str(REPO / "spark_jobs" / "dump.py"), "--dump-id", "outage",
            "--config", str(pipeline.config_path), "--master", "local[2]",
            "--source-patience", "300",
        ]  # fmt: skip
        redis_server.stop()
        try:
            with log.open("ab") as out:
                driver = subprocess.Popen(
                    command, env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                    start_new_session=True,
                )  # fmt: skip

            def waiting() -> bool:
                assert driver.poll() is None, log.read_text()[-3000:]
                return "state store unavailable (" in log.read_text()

            try:
                wait_until(waiting, 180, "the Spark driver waiting for Redis")
                redis_server.start()
                assert driver.wait(300) == 0, log.read_text()[-3000:]
            finally:
                if driver.poll() is None:
                    os.killpg(driver.pid, signal.SIGKILL)
                    driver.wait(30)
        finally:
            redis_server.start()  # a no-op if it runs
        waited = [line for line in log.read_text().splitlines() if "unavailable (" in line]
        assert any("Redis state store" in line for line in waited), waited
        status = store.dumps.status("outage")
        assert status is not None and status.state is DumpState.DONE, status
        # 200 rows per table in chunks of 100: 2 chunks each.
        assert status.chunks == 6 and status.rows == ROWS * 3
        wait_caught_up(dbs)
        assert compare(dbs.source_dsn, dbs.target_dsn) == []
