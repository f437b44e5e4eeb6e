"""The Parquet compaction on Spark local[2]: random change streams for two tables (one with a
composite key, both sometimes truncated) fold into the latest state, a second run reads only the
new bytes, a second compaction of one output directory is refused while the first holds it, and
the real change stream of a dump under writes folds into tables equal to the source."""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from airflow_provider_dblog.compaction import STATE_FILE, CompactState
from airflow_provider_dblog.core.dump_plan import Chunk, DumpKind, DumpRequest
from airflow_provider_dblog.core.event import (
    Event,
    Op,
    Origin,
    Row,
    SourceInfo,
    encode,
    table_event,
)
from airflow_provider_dblog.core.position import Position
from airflow_provider_dblog.core.schema import Column, TableSchema
from airflow_provider_dblog.demo import TABLES as DEMO_TABLES
from airflow_provider_dblog.demo import Workload
from airflow_provider_dblog.devservices.postgres import PostgresInfo
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.dump.runner import run_dump
from airflow_provider_dblog.outputs.ndjson import NdjsonOutput, event_files
from airflow_provider_dblog.state import DumpState
from spark_jobs.compact import EXIT_LOCKED, CompactionLocked, compact
from tests.integration.e2e_support import wait_caught_up
from tests.integration.spark_support import running_pipeline, stop_spark

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
TABLES = {"users": ("id",), "items": ("shop", "sku")}


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    session = (
        SparkSession.builder.master("local[2]")
        .appName("test-compact")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .getOrCreate()
    )
    yield session
    stop_spark(session)


class Stream:
    """Random events and, independently of the compaction's code, the state they lead to."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.commit = 100
        self.state: dict[str, dict[str, Row]] = {"app.users": {}, "app.items": {}}

    def _key(self, table: str) -> Row:
        if table == "users":
            return {"id": self.rng.randrange(30)}
        return {"shop": self.rng.choice(["a", "b"]), "sku": self.rng.randrange(15)}

    def batch(self, transactions: int) -> list[Event]:
        events = []
        for _ in range(transactions):
            self.commit += self.rng.randrange(1, 1000)
            if self.rng.random() < 0.04:  # a table-level event opens the transaction
                table = self.rng.choice(list(TABLES))
                source = SourceInfo("src", "db", "app", table, Position(self.commit, 0), Origin.LOG)
                if self.rng.random() < 0.7:
                    events.append(table_event(Op.TRUNCATE, source, 1))
                    self.state[f"app.{table}"] = {}
                else:
                    columns = (Column("n", "float8", True, None),)
                    events.append(table_event(Op.SCHEMA, source, 1, TableSchema(columns, ())))
            for seq in range(1, self.rng.randrange(2, 6)):
                table = self.rng.choice(list(TABLES))
                key = self._key(table)
                rows = self.state[f"app.{table}"]
                name = json.dumps(key, separators=(",", ":"))
                value = {"n": self.rng.random(), "tags": [seq, None], "big": f"v{self.commit}"}
                if name in rows and self.rng.random() < 0.3:
                    op, after = Op.DELETE, None
                    del rows[name]
                elif name in rows and self.rng.random() < 0.5:
                    op, after = Op.UPDATE, {**key, "n": value["n"]}  # "big" unchanged: TOAST
                    rows[name] = {**rows[name], **after}
                else:
                    op, after = self.rng.choice([Op.CREATE, Op.READ]), {**key, **value}
                    rows[name] = after
                source = SourceInfo(
                    "src", "db", "app", table, Position(self.commit, seq), Origin.LOG
                )
                events.append(Event(op, key, None, after, source, 1))
        return events


def lake(spark: SparkSession, output: Path) -> dict[str, dict[str, Row]]:
    found = {}
    for table in ("app.users", "app.items"):
        rows = spark.read.parquet(str(output / table)).collect()
        found[table] = {r.key: json.loads(r.row) for r in rows}
    return found


def write(directory: Path, events: list[Event], replayed: list[Event]) -> None:
    with NdjsonOutput(directory, max_bytes=4000) as out:
        out.write(events, 1)
    with event_files(directory)[-1].open("ab") as f:  # at-least-once: the same events again
        f.write("".join(encode(e) + "\n" for e in replayed).encode())


def test_fold_then_fold_only_the_new_events(spark: SparkSession, tmp_path: Path) -> None:
    stream, events_dir, output = Stream(7), tmp_path / "events", tmp_path / "lake"
    first = stream.batch(150)
    write(events_dir, first, first[-5:])
    state = compact(spark, events_dir, output)
    assert lake(spark, output) == stream.state
    assert state.position == first[-1].position.to_json()
    assert state.files == {p.name: p.stat().st_size for p in event_files(events_dir)}

    second = stream.batch(100)
    write(events_dir, second, first[-3:] + second[-2:])
    # Bytes already folded are never read again: garbled, they would fail the run.
    for name, offset in state.files.items():
        with (events_dir / name).open("r+b") as f:
            f.write(b" " * (offset - 1) + b"\n")
    state = compact(spark, events_dir, output)
    assert lake(spark, output) == stream.state
    assert state.position == second[-1].position.to_json()
    assert sorted(os.listdir(output / ".versions" / "app.users")) == [state.tables["app.users"]]

    assert compact(spark, events_dir, output) == state  # nothing new: nothing done


def test_command_line(tmp_path: Path) -> None:
    stream, events_dir, output = Stream(3), tmp_path / "events", tmp_path / "lake"
    write(events_dir, stream.batch(20), [])
    command = [sys.executable, str(ROOT / "spark_jobs" / "compact.py")]
    args = ["--input", str(events_dir), "--output", str(output), "--master", "local[2]"]
    done = subprocess.run(command + args, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["tables"] == ["app.items", "app.users"]
    assert CompactState.load(output).position == report["position"]


def test_a_second_compaction_of_one_directory_is_refused(
    spark: SparkSession, tmp_path: Path
) -> None:
    stream, events_dir, output = Stream(5), tmp_path / "events", tmp_path / "lake"
    write(events_dir, stream.batch(20), [])
    # Another process holds the directory through the compaction's own lock.
    hold = (
        "import sys; from pathlib import Path; from spark_jobs.compact import output_lock\n"
        "with output_lock(Path(sys.argv[1])):\n"
        "    print('locked', flush=True)\n"
        "    sys.stdin.read()\n"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", hold, str(output)],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"locked\n"
        with pytest.raises(CompactionLocked, match=re.escape(str(output))):
            compact(spark, events_dir, output)
        command = [sys.executable, str(ROOT / "spark_jobs" / "compact.py")]
        args = ["--input", str(events_dir), "--output", str(output), "--master", "local[1]"]
        refused = subprocess.run(command + args, capture_output=True, text=True, timeout=120)
        assert refused.returncode == EXIT_LOCKED, refused.stderr[-3000:]
        assert str(output) in refused.stderr and refused.stdout == ""
        assert not (output / STATE_FILE).exists()
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        assert holder.wait(30) == 0
    compact(spark, events_dir, output)  # the lock is free again
    assert lake(spark, output) == stream.state


def test_lake_equals_the_source_after_a_dump_under_writes(
    spark: SparkSession, pg15: PostgresInfo, redis_server: RedisInfo, tmp_path: Path
) -> None:
    """The real change stream (log events and dump rows, NDJSON from the tailer) of tables
    whose rows predate capture, dumped while another connection writes: the Parquet tables
    hold exactly the source's rows, as the source's converters print them."""
    events_dir, output = tmp_path / "events", tmp_path / "lake"
    with running_pipeline(pg15, redis_server, tmp_path, 200, events_dir=events_dir) as pipeline:
        dbs, store = pipeline.dbs, pipeline.store
        workload = Workload(dbs.source_dsn, seed=5)
        workload.start()
        try:
            store.dumps.create(
                DumpRequest("lake", DumpKind.ALL, DEMO_TABLES, chunk_size=70, parallelism=2)
            )
            state = run_dump(store, dbs.source.chunk_source, "lake")
            assert state is DumpState.DONE
        finally:
            workload.join()
        assert workload.writes > 0
        wait_caught_up(dbs)
        source = dbs.source.chunk_source()
        try:
            expected = {
                str(t): canonical(source.read_chunk(Chunk(t, 0, limit=10**6)).rows)
                for t in DEMO_TABLES
            }
        finally:
            source.close()
    compact(spark, events_dir, output)
    found = {
        str(t): canonical(
            json.loads(r.row) for r in spark.read.parquet(str(output / str(t))).collect()
        )
        for t in DEMO_TABLES
    }
    assert found == expected
    assert all(expected.values())


def canonical(rows: Iterable[Row]) -> list[str]:
    return sorted(json.dumps(row, sort_keys=True) for row in rows)
