"""The three DAGs run with `dag.test()` against real PostgreSQL, Redis and Spark (local[2]),
with a tailer applying the log and the dump rows into a SQL target: each run ends with the
target equal to the source (the repair: exactly the keys given, composite keys in the shape
the trigger form sends them, or exactly the rows matching a filter). Bad params (a bad
filter among them) fail the run at its first task, naming the problem, before anything
waits. The repair DAG also runs on a MariaDB source whose password comes from
an existing `mysql` connection (`source_conn_id`), its tailer writing NDJSON: the repair emits
exactly the keys given, as the source has them. The full dump runs with no TOML file at all:
its connection holds the whole configuration.

Deferrable tasks run their triggers inline in `dag.test()`; the dump task starts
`spark_jobs/dump.py` through spark-submit, detached, and follows it in Redis.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from airflow_provider_dblog.core.event import Origin
from airflow_provider_dblog.demo.postgres import compare, snapshot
from airflow_provider_dblog.devservices.mariadb import MariaDBInfo
from airflow_provider_dblog.devservices.postgres import PostgresInfo
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.outputs import read_events
from airflow_provider_dblog.state import DumpState
from tests.integration.airflow_support import (
    DagTestResult,
    airflow_env,
    dag_test,
    dag_tests,
    dblog_connection,
    holding_the_configuration,
    migrate,
)
from tests.integration.e2e_support import row_key, source_state, wait_caught_up
from tests.integration.spark_support import Pipeline, running_mysql_pipeline, running_pipeline

pytestmark = pytest.mark.integration
ROWS = 300


@pytest.fixture(scope="module")
def airflow_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("airflow")
    migrate(airflow_env(home, {"conn_type": "dblog"}))
    return home


@pytest.fixture
def pipeline(pg15: PostgresInfo, redis_server: RedisInfo, tmp_path: Path) -> Iterator[Pipeline]:
    with running_pipeline(pg15, redis_server, tmp_path, ROWS) as pipeline:
        yield pipeline


RunDag = Callable[[str, dict[str, object]], DagTestResult]
RunDags = Callable[[list[tuple[str, dict[str, object]]]], list[DagTestResult]]


@pytest.fixture
def run_dag(
    airflow_home: Path, pipeline: Pipeline, pg15: PostgresInfo, redis_server: RedisInfo
) -> RunDag:
    """`run_dag(dag_id, conf)`: a dag.test() run with the dblog connection of the pipeline."""
    connection = dblog_connection(
        redis_server, pg15, pipeline.dbs.config.name, pipeline.config_path
    )
    env = airflow_env(airflow_home, connection)
    return lambda dag_id, conf: dag_test(env, dag_id, conf)


@pytest.fixture
def run_dags(
    airflow_home: Path, pipeline: Pipeline, pg15: PostgresInfo, redis_server: RedisInfo
) -> RunDags:
    """`run_dags([(dag_id, conf), ...])`: dag.test() runs one after the other in one process."""
    connection = dblog_connection(
        redis_server, pg15, pipeline.dbs.config.name, pipeline.config_path
    )
    env = airflow_env(airflow_home, connection)
    return lambda runs: dag_tests(env, runs)


def assert_succeeded(result: DagTestResult) -> None:
    assert result.state == "success", result.output[-6000:]
    assert result.tasks == {
        "check_request": "success",
        "wait_for_tailer": "success",
        "dump": "success",
    }


def test_repair_and_dump_dags_re_send_exactly_the_rows_given(
    pipeline: Pipeline, run_dags: RunDags
) -> None:
    """Three runs in one Airflow process (starting Airflow is much of a run's time), each
    dump on Spark: composite keys in the shape the trigger form sends them (its keys box's
    JSON, parsed); a filter typed as text (its `%` and quotes reach the server as typed), read
    in chunks of 40 rows of the key, each cut into sub-ranges that keep the filter; and keys
    typed as text (`3,5,8`), parsed as `dblog dump --keys` parses them. The target then holds
    exactly those rows."""
    with psycopg.connect(pipeline.dbs.source_dsn) as conn:
        keys = [list(r) for r in conn.execute("SELECT region, n FROM orders ORDER BY n LIMIT 9")]
    where = "active AND owner LIKE '%7%'"
    results = run_dags(
        [
            ("dblog_repair", {"table": "public.orders", "keys": keys, "chunk_size": 4}),
            ("dblog_repair", {"table": "public.accounts", "where": where, "chunk_size": 40}),
            (
                "dblog_dump",
                {"tables": ["public.accounts"], "keys": "3,5,8", "chunk_size": 2, "parallelism": 1},
            ),
        ]
    )
    for result in results:
        assert_succeeded(result)
    wait_caught_up(pipeline.dbs)
    with psycopg.connect(pipeline.dbs.source_dsn) as conn:
        orders = [
            r[0]
            for r in conn.execute(
                "SELECT row_to_json(t)::text FROM orders t "
                "WHERE (region, n) IN (SELECT * FROM jsonb_to_recordset(%s::jsonb) "
                "AS k(region text, n int)) ORDER BY region, n",
                (json.dumps([{"region": r, "n": n} for r, n in keys]),),
            )
        ]
        matching = conn.execute(f"SELECT id FROM accounts WHERE {where}").fetchall()
        accounts = [
            r[0]
            for r in conn.execute(
                f"SELECT row_to_json(t)::text FROM accounts t WHERE ({where}) OR id IN (3, 5, 8) "
                "ORDER BY id"
            )
        ]
    assert 0 < len(matching) < ROWS // 4, "the filter must pick a few rows out of many"
    target = snapshot(pipeline.dbs.target_dsn)
    assert len(orders) == len(keys) and target["orders"] == orders
    assert target["accounts"] == accounts
    assert all(not rows for table, rows in target.items() if table not in ("orders", "accounts"))
    dumps = {}
    for dump_id in pipeline.store.dumps.ids():
        stored, status = pipeline.store.dumps.get(dump_id), pipeline.store.dumps.status(dump_id)
        assert stored is not None and status is not None and status.state is DumpState.DONE
        (table,) = stored.request.tables
        dumps[str(table), stored.request.where] = status
    assert sorted(dumps, key=str) == sorted(
        [("public.orders", None), ("public.accounts", where), ("public.accounts", None)], key=str
    )
    composite, filtered, typed = (
        dumps["public.orders", None],
        dumps["public.accounts", where],
        dumps["public.accounts", None],
    )
    assert composite.rows == len(keys) and composite.chunks == -(-len(keys) // 4)
    # Every chunk is a key range of 40 rows, whatever the filter matches in it.
    assert filtered.rows == len(matching) and filtered.chunks >= ROWS // 40
    assert typed.rows == 3 and typed.chunks == 2


def test_repair_dag_on_mariadb_takes_the_password_from_a_mysql_connection(
    airflow_home: Path, mariadb: MariaDBInfo, redis_server: RedisInfo, tmp_path: Path
) -> None:
    events_dir = tmp_path / "events"
    with running_mysql_pipeline(mariadb, redis_server, tmp_path, ROWS, events_dir) as pipeline:
        dbs = pipeline.dbs
        connection = dblog_connection(redis_server, None, dbs.config.name, pipeline.config_path)
        connection["extra"]["source_conn_id"] = "mysql_shop"
        mysql = {
            "conn_type": "mysql",
            "host": mariadb.host,
            "port": mariadb.port,
            "login": mariadb.user,
            "password": mariadb.password,
            "schema": dbs.source_db,
        }
        env = airflow_env(airflow_home, connection, AIRFLOW_CONN_MYSQL_SHOP=json.dumps(mysql))
        keys = [["eu", 3], ["us", 1], ["sa", 7], ["ap", 2], ["eu", 9]]
        table = dbs.table("orders")
        result = dag_test(env, "dblog_repair", {"table": str(table), "keys": keys})
        assert_succeeded(result)
        wait_caught_up(dbs, store=pipeline.store)
        rows = source_state(dbs.source, (table,))
    dumped = [e for e in read_events(events_dir) if e.source.origin is Origin.DUMP]
    given = {k: v for k, v in rows.items() if json.loads(k[1]) in keys}
    assert {row_key(e.source.table, e.key.values()): e.after for e in dumped} == given
    assert len(dumped) == len(keys)
    (dump_id,) = pipeline.store.dumps.ids()
    status = pipeline.store.dumps.status(dump_id)
    assert status is not None and status.state is DumpState.DONE and status.rows == len(keys)


def test_dump_dag_of_all_tables_converges_on_a_worker_without_the_toml(
    airflow_home: Path, pipeline: Pipeline, pg15: PostgresInfo, redis_server: RedisInfo
) -> None:
    """The connection holds the whole configuration, and the TOML is gone before the run:
    the params' choices, the checks and the Spark dump all read the connection."""
    connection = holding_the_configuration(
        dblog_connection(redis_server, pg15, pipeline.dbs.config.name, pipeline.config_path),
        pipeline.config_path,
    )
    pipeline.config_path.unlink()
    result = dag_test(
        airflow_env(airflow_home, connection),
        "dblog_dump",
        {"tables": [], "chunk_size": 120, "parallelism": 2},
    )
    assert_succeeded(result)
    wait_caught_up(pipeline.dbs)
    assert compare(pipeline.dbs.source_dsn, pipeline.dbs.target_dsn) == []


def test_backfill_dag_converges(pipeline: Pipeline, run_dag: RunDag) -> None:
    result = run_dag(
        "dblog_backfill",
        {"chunk_size": 250, "parallelism": 1},
    )
    assert_succeeded(result)
    wait_caught_up(pipeline.dbs)
    assert compare(pipeline.dbs.source_dsn, pipeline.dbs.target_dsn) == []


BAD_PARAMS = {
    "unknown-table": (
        "dblog_dump",
        {"tables": ["public.nope"]},
        "table public.nope is not captured by source",
    ),
    "malformed-keys": (
        "dblog_repair",
        {"table": "public.accounts", "keys": [[1, 2]]},
        "key #1 of public.accounts has 2 value(s), the primary key (id) has 1",
    ),
    "keys-of-two-tables": (
        "dblog_dump",
        {"tables": ["public.accounts", "public.orders"], "keys": [1]},
        "keys need exactly one table, got 2",
    ),
    "composite-key-not-in-a-list": (
        "dblog_repair",
        {"table": "public.orders", "keys": ["eu", 1]},
        "key #1 of public.orders has 1 value(s), the primary key (region, n) has 2",
    ),
    # A chunk size of 0 and keys unlike the first are refused at trigger (tests/unit/test_dags.py).
    "every-bad-key-at-once": (
        "dblog_repair",
        {"table": "public.orders", "keys": [["eu"], ["us"], ["eu"]]},
        "key #1 of public.orders has 1 value(s), the primary key (region, n) has 2; "
        "key #2 of public.orders has 1 value(s), the primary key (region, n) has 2; "
        "key #3 of public.orders has 1 value(s)",
    ),
    "every-bad-value-at-once": (
        "dblog_dump",
        {"tables": ["public.orders"], "keys": [["eu", 7], ["us", "x"], ["eu", "y"]]},
        "key #2: key value 'x' is not a valid integer for column n of public.orders: invalid "
        "input syntax for type integer",
    ),
    "filter-syntax-error": (
        "dblog_repair",
        {"table": "public.accounts", "where": "owner = = 'x'"},
        "the filter on public.accounts is not valid: syntax error",
    ),
    "filter-volatile": (
        "dblog_dump",
        {"tables": ["public.accounts"], "where": "id < random() * 10"},
        "the filter on public.accounts calls random(), which is volatile",
    ),
    "filter-and-keys": (
        "dblog_repair",
        {"table": "public.accounts", "keys": "1,2", "where": "id > 1"},
        "a filter (where) needs exactly one table and no keys",
    ),
    "filter-of-every-table": (
        "dblog_dump",
        {"where": "id > 1"},
        "a filter (where) needs exactly one table and no keys",
    ),
    "repair-of-nothing": (
        "dblog_repair",
        {"table": "public.accounts"},
        "give keys or a filter (where)",
    ),
}


def test_bad_params_fail_the_first_task_with_the_problem(
    pipeline: Pipeline, run_dags: RunDags
) -> None:
    """Each bad form fails its run's first task naming the problem, and stores no dump (the
    runs share one Airflow process: starting Airflow is most of a run's time)."""
    pipeline.tailer_stop.set()  # nothing may wait for it: the check fails first
    results = run_dags([(dag_id, conf) for dag_id, conf, _ in BAD_PARAMS.values()])
    for (case, (_, _, message)), result in zip(BAD_PARAMS.items(), results, strict=True):
        assert result.state == "failed", (case, result.output[-4000:])
        assert result.tasks["check_request"] == "failed", case
        assert result.tasks["dump"] != "success", case
        assert result.tasks["wait_for_tailer"] != "success", case
        assert message in result.output, (case, result.output[-4000:])
    assert pipeline.store.dumps.ids() == []
