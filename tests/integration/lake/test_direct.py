"""A direct dump into the lake end to end: `dblog dump --mode direct` on a deployment with a
`[lake] root` writes the seeded rows into the lake's Delta tables itself, under a write
workload and with the tailer SIGKILLed and started again mid-dump, while the tailer writes only
log events to NDJSON; the compaction then folds those into the same tables, and the lake equals
the source, typed, as DuckDB reads it."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_provider_dblog.compaction.run import CompactOptions, compact
from airflow_provider_dblog.core.dump_plan import Chunk
from airflow_provider_dblog.demo.postgres import TABLES
from airflow_provider_dblog.devservices.postgres import PostgresInfo
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.lake.catalog import source_lake_schema
from airflow_provider_dblog.lake.schema import POSITION_COLUMNS, LakeRow
from airflow_provider_dblog.lake.table import LakeTable
from airflow_provider_dblog.outputs.ndjson import event_files
from airflow_provider_dblog.state import StateStore
from tests.integration.compaction.test_spark_compact import by_key, read_lake
from tests.integration.e2e_support import (
    DBLOG,
    Databases,
    TailProcess,
    Writer,
    cli_env,
    drop_databases,
    make_databases,
    wait_caught_up,
    wait_until,
    write_config,
)

pytestmark = pytest.mark.integration
ROWS = 1200


@pytest.fixture
def dbs(pg15: PostgresInfo) -> Iterator[Databases]:
    databases = make_databases(pg15, ROWS, target=False, seed_value=21)
    yield databases
    drop_databases(databases)


def test_a_direct_dump_and_the_compaction_make_the_lake_equal_the_source(
    dbs: Databases, redis_server: RedisInfo, tmp_path: Path
) -> None:
    events, lake = tmp_path / "events", tmp_path / "lake"
    output = {"type": "ndjson", "directory": str(events)}
    config = write_config(
        tmp_path / "dblog.toml", dbs, redis_server, output, {"heartbeat_s": 0.2, "window_ttl_s": 5}
    )
    config.write_text(config.read_text() + f'\n[lake]\nroot = "{lake}"\n')
    env = cli_env(dbs, redis_server)
    store = StateStore(redis_server.client(), dbs.config.name)
    tail = TailProcess(config, "lake-tailer", env, tmp_path / "tail.log")
    writer = Writer(dbs, tmp_path, seed_value=3)
    dump: subprocess.Popen[bytes] | None = None
    try:
        wait_until(lambda: store.tailer.health() is not None, 30, "the tailer beating")
        writer.wait_for(20)
        with (tmp_path / "dump.log").open("ab") as out:
            dump = subprocess.Popen(
                [
                    *(DBLOG, "dump", "-c", str(config), "--dump-id", "lake", "--mode", "direct"),
                    *("--chunk-size", "100", "--parallelism", "2", "--max-rows-per-s", "1500"),
                    *("--window-timeout", "10"),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
            )
        chunks = lambda: (s := store.dumps.status("lake")) is not None and s.chunks  # noqa: E731
        wait_until(lambda: chunks() >= 4, 60, "four chunks written")
        tail.kill()
        tail.start()
        store.dumps.throttle("lake", max_rows_per_s=0)
        assert dump.wait(180) == 0, (tmp_path / "dump.log").read_text()[-3000:]
        writer.stop()
        wait_caught_up(dbs)
        assert store.directs.pending() == {}
        schemas = {t: source_lake_schema(dbs.config, t) for t in TABLES}
        source = dbs.source.chunk_source()
        try:
            wanted = {
                t: schemas[t]
                .to_arrow([LakeRow(r, 1, 0, "r") for r in source.read_chunk(Chunk(t, 0)).rows])
                .drop_columns(list(POSITION_COLUMNS))
                for t in TABLES
            }
        finally:
            source.close()
        horizon = store.directs.horizon()
    finally:
        writer.kill()
        if dump is not None and dump.poll() is None:
            dump.kill()
        if tail.alive():
            tail.kill()
    lines = [json.loads(line) for f in event_files(events) for line in f.open()]
    assert lines and all(e["op"] != "r" for e in lines), "a dump row went through the tailer"
    report = compact(
        None, events, lake, CompactOptions(describe=schemas.__getitem__, prune_before=horizon)
    )
    assert report.events == len(lines)
    for table in TABLES:
        read = read_lake(lake, str(table)).drop_columns(list(POSITION_COLUMNS))
        key = schemas[table].key
        assert read.num_rows == wanted[table].num_rows > 0
        assert by_key(read, key) == by_key(wanted[table], key)
        assert LakeTable.open(lake, table).version > 1  # the dump's commits, then the fold's
