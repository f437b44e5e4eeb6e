"""The verify on Spark (local[2]) against real PostgreSQL and Redis: a tailer process applying into
a PostgreSQL SQL target that a dump filled, a writer writing. `dblog verify --master` finds an
equal target equal while writes go on, two chunks in flight; `spark_jobs/verify.py`, on a run
stored as Airflow's operator stores one, names exactly the keys corrupted behind the tailer's
back, with the counts of the in-process `dblog verify` of the same target.

One deployment serves the module (a dump and a tailer take long to start); the equal target's
test runs first, while the writer writes, the corrupted one stops the writer.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
from pyspark import SparkContext

from airflow_provider_dblog.config import load_config
from airflow_provider_dblog.devservices.postgres import PostgresInfo
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.sources.factory import source_for
from airflow_provider_dblog.state import VerifyState
from airflow_provider_dblog.verify.request import build_verify_request
from airflow_provider_dblog.verify.targets import target_reader_for
from spark_jobs.verify import main as spark_verify
from tests.integration.e2e_support import (
    DBLOG,
    Databases,
    drop_databases,
    make_databases,
    run_cli,
    wait_caught_up,
)
from tests.integration.verify.deployment import Deployment, running_deployment
from tests.integration.verify.test_verify_cli import CORRUPTED, corrupt_target

pytestmark = pytest.mark.integration
ROWS = 300
SPARK_RUN_S = 600
"""A generous bound on one Spark run here: a loaded machine starts a JVM slowly."""


@pytest.fixture(scope="module")
def dbs(pg15: PostgresInfo) -> Iterator[Databases]:
    databases = make_databases(pg15, ROWS, target=True, seed_value=43)
    yield databases
    drop_databases(databases)


@pytest.fixture(scope="module")
def deployment(
    dbs: Databases, redis_server: RedisInfo, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Deployment]:
    """The deployment, and its variables in this process's environment, where a Spark started
    here passes them on to its Python workers; this module's Spark stopped for good after."""
    work = tmp_path_factory.mktemp("verify-spark")
    with running_deployment(dbs, redis_server, work, dbs.target_dsn, seed_value=7) as deployed:
        saved = dict(os.environ)
        os.environ.update(deployed.env)
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        try:
            yield deployed
        finally:
            os.environ.clear()
            os.environ.update(saved)
            gateway = SparkContext._gateway
            if gateway is not None:
                gateway.shutdown()
                SparkContext._gateway = None
                SparkContext._jvm = None


def test_an_equal_target_passes_on_spark_while_writes_go_on(deployment: Deployment) -> None:
    config, env, store, writer = deployment
    written = len(writer.transactions())
    verify = ("verify", "-c", str(config), "--verify-id", "spark-equal", "--chunk-size", "120")
    spark = ("--parallelism", "2", "--master", "local[2]", "--tasks", "2")

    done = subprocess.run(
        [DBLOG, *verify, *spark], env=env, capture_output=True, text=True, timeout=SPARK_RUN_S
    )

    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert len(writer.transactions()) > written, "the writer wrote while verify ran"
    status = store.verifies.status("spark-equal")
    assert status is not None and status.state is VerifyState.DONE
    assert store.verifies.differences("spark-equal") == []
    counts = store.verifies.counts("spark-equal")
    assert sum(c["checked"] + c["in_flux"] for c in counts.values()) >= 3 * ROWS
    assert all(c["checked"] > 0 for c in counts.values()), counts
    assert "spark-equal: done" in done.stdout, done.stdout


def test_spark_names_exactly_the_corrupted_keys_with_the_in_process_counts(
    dbs: Databases, deployment: Deployment
) -> None:
    config_path, env, store, writer = deployment
    corrupt_target(dbs)
    writer.stop()
    wait_caught_up(dbs)
    config = load_config(config_path)
    source, reader = source_for(config.source).chunk_source(), target_reader_for(config, "output")
    try:
        request = build_verify_request(
            config,
            source,
            verify_id="spark-corrupt",
            table=None,
            keys=None,
            where=None,
            after=None,
            upto=None,
            chunk_size=120,
            target="output",
            reader=reader,
            parallelism=2,
        )
    finally:
        reader.close()
        source.close()
    store.verifies.create("spark-corrupt", request.to_json())
    application = ["--verify-id", "spark-corrupt", "--config", str(config_path)]

    assert spark_verify([*application, "--master", "local[2]", "--tasks", "3"]) == 0

    status = store.verifies.status("spark-corrupt")
    assert status is not None and status.state is VerifyState.DONE
    found = [(d.table, d.kind, d.key) for d in store.verifies.differences("spark-corrupt")]
    assert sorted(found, key=repr) == CORRUPTED
    in_process = run_cli(
        *("verify", "-c", str(config_path), "--verify-id", "local", "--chunk-size", "120"), env=env
    )
    assert in_process.returncode == 1, in_process.stdout + in_process.stderr[-3000:]
    assert store.verifies.counts("spark-corrupt") == store.verifies.counts("local")
    assert store.verifies.differences("spark-corrupt") == store.verifies.differences("local")
