"""A dump rides through Redis going away between two tables: the moment the first table's
last chunk is counted, Redis stops, and starts again only once the dump has said it waits for
it; the calls that begin the next table (its progress saved) wait instead of failing the dump.
The e2e kill test meets this point only when its random restart lands there; here it always does.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest

from airflow_provider_dblog.core.dump_plan import DumpKind, DumpRequest, TableProgress
from airflow_provider_dblog.core.event import TableRef
from airflow_provider_dblog.demo.postgres import compare
from airflow_provider_dblog.devservices.postgres import PostgresInfo
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.dump.runner import run_dump
from airflow_provider_dblog.state import DumpState
from tests.integration.e2e_support import wait_caught_up
from tests.integration.spark_support import running_pipeline

pytestmark = pytest.mark.integration
ROWS = 200


def test_a_dump_rides_through_a_redis_restart_between_two_tables(
    pg15: PostgresInfo, redis_server: RedisInfo, tmp_path: Path
) -> None:
    with running_pipeline(pg15, redis_server, tmp_path, ROWS) as pipeline:
        dbs, store = pipeline.dbs, pipeline.store
        first, second = dbs.tables[0], dbs.tables[1]
        stopped: list[TableRef] = []
        waiting = _Waiting()
        starter = threading.Thread(target=lambda: start_once_the_dump_waits(), daemon=True)

        def start_once_the_dump_waits() -> None:
            waiting.seen.wait(60)
            redis_server.start()

        def stop_after_the_first_table(dump_id: str, progress: TableProgress) -> None:
            if progress.table == first and progress.done and not stopped:
                redis_server.stop()
                stopped.append(progress.table)
                starter.start()

        store.dumps.create(DumpRequest("between", DumpKind.ALL, (first, second), chunk_size=50))
        runner_log = logging.getLogger("airflow_provider_dblog.dump")
        runner_log.addHandler(waiting)
        try:
            state = run_dump(
                store,
                dbs.source.chunk_source,
                "between",
                window_timeout_s=30,
                on_progress=stop_after_the_first_table,
            )
        finally:
            runner_log.removeHandler(waiting)
            waiting.seen.set()
            if stopped:
                starter.join(60)
            redis_server.start()  # a no-op if it runs

        assert stopped == [first]

        assert state is DumpState.DONE
        status = store.dumps.status("between")
        assert status is not None and status.state is DumpState.DONE, status
        assert status.rows == 2 * ROWS
        wait_caught_up(dbs)
        differences = compare(dbs.source_dsn, dbs.target_dsn)
        assert [d for d in differences if first.name in str(d) or second.name in str(d)] == []


class _Waiting(logging.Handler):
    """Sets `seen` once the runner logs that it waits for Redis to come back."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.seen = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if "state store unavailable (" in record.getMessage():
            self.seen.set()
