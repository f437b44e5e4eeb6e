"""The compaction into the Delta lake on Spark local[2]: random change streams for two tables
(one with a composite key, both sometimes truncated) fold into the latest state, a second run
reads only the new bytes, a column added at the source reaches the lake with its default (also
when a direct dump added it first or created the table for rows read without it, and when a
run dies between the steps of folding it), a run that fails between two tables' commits leaves
each table at a committed version and the next run (folding in the driver, without Spark)
converges, a second compaction of one lake is refused while the first holds it, the documented
command folds a backlog on Spark when the `python3` on PATH lacks the dependencies (its
workers run the driver's Python), and the real change stream of a dump under writes folds into
tables equal to the source, typed, as DuckDB reads them (from the Parquet files the Delta log
lists)."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from airflow_provider_dblog.compaction.run import (
    STALE_STAGED_S,
    CompactionLocked,
    CompactOptions,
    compact,
)
from airflow_provider_dblog.compaction.segments import CompactState
from airflow_provider_dblog.core.direct import DirectRecord
from airflow_provider_dblog.core.dump_plan import Chunk, DumpKind, DumpRequest
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
from airflow_provider_dblog.core.event_codec import encode
from airflow_provider_dblog.core.position import Position
from airflow_provider_dblog.core.schema import Column, TableSchema
from airflow_provider_dblog.demo.postgres import TABLES as DEMO_TABLES
from airflow_provider_dblog.demo.postgres import Workload
from airflow_provider_dblog.devservices.postgres import PostgresInfo
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.dump.runner import run_dump
from airflow_provider_dblog.lake import CURSOR_FILE
from airflow_provider_dblog.lake.catalog import source_lake_schema
from airflow_provider_dblog.lake.direct import STAGED, LakeDirectTarget
from airflow_provider_dblog.lake.schema import (
    COMMIT,
    DELETED,
    POSITION_COLUMNS,
    SEQ,
    LakeRow,
    lake_schema,
)
from airflow_provider_dblog.lake.table import LakeTable
from airflow_provider_dblog.outputs.ndjson import NdjsonOutput, event_files
from airflow_provider_dblog.state import DumpState
from spark_jobs.compact import EXIT_LOCKED, main
from tests.integration.e2e_support import wait_caught_up
from tests.integration.spark_support import running_pipeline, stop_spark

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
TABLES = {"users": ("id",), "items": ("shop", "sku")}
COLUMNS = {
    "users": (Column("id", "integer", False, None),),
    "items": (Column("shop", "text", False, None), Column("sku", "integer", False, None)),
}
VALUES = (
    Column("n", "double precision", True, None),
    Column("tags", "integer[]", True, None),
    Column("big", "text", True, None),
)


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


def described(table: str, extra: Sequence[Column] = ()) -> TableSchema:
    return TableSchema((*COLUMNS[table], *VALUES, *extra), TABLES[table])


class Stream:
    """Random events and, independently of the compaction's code, the state they lead to. The
    stream opens with each table's schema event, as a tailer's does."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.commit = 100
        self.state: dict[str, dict[tuple[Any, ...], Row]] = {"app.users": {}, "app.items": {}}
        self.opening = [self.schema_event(t, described(t)) for t in TABLES]

    def schema_event(self, table: str, schema: TableSchema) -> Event:
        self.commit += 1
        source = SourceInfo("src", "db", "app", table, Position(self.commit, 0), Origin.LOG)
        return table_event(Op.SCHEMA, source, 1, schema)

    def _key(self, table: str) -> Row:
        if table == "users":
            return {"id": self.rng.randrange(30)}
        return {"shop": self.rng.choice(["a", "b"]), "sku": self.rng.randrange(15)}

    def batch(self, transactions: int) -> list[Event]:
        events = list(self.opening)
        self.opening = []
        for _ in range(transactions):
            self.commit += self.rng.randrange(1, 1000)
            if self.rng.random() < 0.03:  # a truncate opens the transaction
                table = self.rng.choice(list(TABLES))
                source = SourceInfo("src", "db", "app", table, Position(self.commit, 0), Origin.LOG)
                events.append(table_event(Op.TRUNCATE, source, 1))
                self.state[f"app.{table}"] = {}
            for seq in range(1, self.rng.randrange(2, 6)):
                table = self.rng.choice(list(TABLES))
                key = self._key(table)
                rows = self.state[f"app.{table}"]
                name = tuple(key.values())
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
                events.append(PlainEvent(op, key, None, after, source, 1))
        return events


def read_lake(output: Path, table: str) -> pa.Table:
    """A lake table's current rows as DuckDB reads them: the Parquet files of the table's
    latest Delta version (its log lists them), tombstones left out; a column a file lacks (added
    after the file was written) is null there, as Delta reads it."""
    lake = LakeTable.open(output, TableRef.parse(table))
    files = lake.delta.file_uris()
    if not files:
        return pa.table({})
    query = "SELECT * FROM read_parquet($files, union_by_name = true) WHERE NOT _dblog_deleted"
    return pa.table(duckdb.sql(query, params={"files": files}).arrow())


def lake_state(output: Path, table: str) -> dict[tuple[Any, ...], Row]:
    key = TABLES[table.split(".")[1]]
    rows = read_lake(output, table).to_pylist()
    return {
        tuple(r[k] for k in key): {c: v for c, v in r.items() if c not in POSITION_COLUMNS}
        for r in rows
    }


def expected(stream: Stream) -> dict[str, dict[tuple[Any, ...], Row]]:
    columns = ("n", "tags", "big")
    return {
        table: {k: {**{c: None for c in columns}, **row} for k, row in rows.items()}
        for table, rows in stream.state.items()
    }


def write(directory: Path, events: list[Event], replayed: list[Event]) -> None:
    with NdjsonOutput(directory, max_bytes=4000) as out:
        out.write(events, 1)
    with event_files(directory)[-1].open("ab") as f:  # at-least-once: the same events again
        f.write("".join(encode(e) + "\n" for e in replayed).encode())


def found(output: Path) -> dict[str, dict[tuple[Any, ...], Row]]:
    return {t: lake_state(output, t) for t in ("app.users", "app.items")}


def test_fold_then_fold_only_the_new_events(spark: SparkSession, tmp_path: Path) -> None:
    stream, events_dir, output = Stream(7), tmp_path / "events", tmp_path / "lake"
    first = stream.batch(150)
    write(events_dir, first, first[-5:])
    report = compact(spark, events_dir, output, CompactOptions(local_below=0))
    assert found(output) == expected(stream)
    assert report.state.position == first[-1].position.to_json()
    assert report.state.files == {p.name: p.stat().st_size for p in event_files(events_dir)}
    users = LakeTable.open(output, TableRef("app", "users"))
    assert users.arrow_schema.field("tags").type == pa.list_(pa.int32())

    second = stream.batch(100)
    write(events_dir, second, first[-3:] + second[-2:])
    # Bytes already folded are never read again: garbled, they would fail the run.
    for name, offset in report.state.files.items():
        with (events_dir / name).open("r+b") as f:
            f.write(b" " * (offset - 1) + b"\n")
    report = compact(spark, events_dir, output, CompactOptions(local_below=0))
    assert found(output) == expected(stream)
    assert report.state.position == second[-1].position.to_json()
    versions = {t: r.version for t, r in report.tables.items()}

    # Nothing new: nothing done.
    again = compact(spark, events_dir, output, CompactOptions(local_below=0))
    assert again.tables == {} and again.state == report.state
    for table, version in versions.items():
        assert LakeTable.open(output, TableRef.parse(table)).version == version


def test_an_added_column_reaches_the_lake_with_its_default(tmp_path: Path) -> None:
    stream, events_dir, output = Stream(11), tmp_path / "events", tmp_path / "lake"
    first = stream.batch(30)
    score = Column("score", "numeric(6,1)", True, "'2.5'::numeric")
    added = stream.schema_event("users", described("users", [score]))
    later = {"id": 99, "n": 1.0, "tags": [], "big": "x", "score": "7.0"}
    source = SourceInfo("src", "db", "app", "users", Position(stream.commit + 1, 1), Origin.LOG)
    write(
        events_dir, [*first, added, PlainEvent(Op.CREATE, {"id": 99}, None, later, source, 2)], []
    )
    compact(None, events_dir, output)  # a small run folds in the driver: no Spark job
    users = lake_state(output, "app.users")
    assert str(users.pop((99,))["score"]) == "7.0"
    assert users and {str(r["score"]) for r in users.values()} == {"2.5"}


def test_a_column_a_direct_dump_added_first_still_gets_its_default(tmp_path: Path) -> None:
    """A direct chunk read after an ADD COLUMN commits before the compaction folds the ALTER:
    the commit adds the column (marked unfolded), and the fold still writes the default into
    the rows before the ALTER, not into the chunk's; a chunk read before the ALTER and
    committed after the fold gets the default too; a later schema event refills nothing."""
    stream, events_dir, output = Stream(13), tmp_path / "events", tmp_path / "lake"
    users = TableRef("app", "users")
    write(events_dir, stream.batch(30), [])
    compact(None, events_dir, output)
    score = Column("score", "numeric(6,1)", True, "'2.5'::numeric")
    added = stream.schema_event("users", described("users", [score]))
    schema = lake_schema("postgres", users, described("users", [score]))
    target = LakeDirectTarget(output, {users: schema}.__getitem__)
    row = {"id": 99, "n": 1.0, "tags": [], "big": "x", "score": "7.0"}
    hw = Position(stream.commit + 5, 0)
    handles = [target.stage(users, [row])]
    record = DirectRecord("w", Position(hw.commit - 1, 0), hw, frozenset())
    assert target.commit(users, handles, record, ("id",)) == 1
    assert LakeTable.open(output, users).unfolded == {"score"}

    write(events_dir, [added], [])
    compact(None, events_dir, output)
    assert LakeTable.open(output, users).unfolded == frozenset()
    scores = {k: str(r["score"]) for k, r in lake_state(output, "app.users").items()}
    assert scores.pop((99,)) == "7.0" and set(scores.values()) == {"2.5"}

    # A chunk read before the ALTER (hw before it) whose commit comes after the fold: its
    # rows hold the default the fold wrote into the others.
    late = Position(added.position.commit - 1, 5)
    old = {"id": 98, "n": 2.0, "tags": [], "big": "y"}
    handles = [target.stage(users, [old])]
    record = DirectRecord("w2", Position(late.commit - 1, 0), late, frozenset())
    assert target.commit(users, handles, record, ("id",)) == 1
    assert str(lake_state(output, "app.users")[(98,)]["score"]) == "2.5"

    stream.commit += 10  # after the chunk's rows
    note = Column("note", "text", True, "'n'::text")
    write(events_dir, [stream.schema_event("users", described("users", [score, note]))], [])
    compact(None, events_dir, output)
    again = {k: str(r["score"]) for k, r in lake_state(output, "app.users").items()}
    assert again.pop((99,)) == "7.0" and set(again.values()) == {"2.5"}


def test_a_table_a_direct_dump_created_for_rows_read_without_a_column_gets_its_default(
    tmp_path: Path,
) -> None:
    """A chunk read before ALTER ADD COLUMN score and committed after it creates the table
    from the catalog, with `score`, before the log described the table at all: the column is
    created unfolded (the rows lack it), so the log's first schema event of the table, which
    lists it, still writes the default into the chunk's rows."""
    stream, events_dir, output = Stream(17), tmp_path / "events", tmp_path / "lake"
    users = TableRef("app", "users")
    score = Column("score", "numeric(6,1)", True, "'2.5'::numeric")
    schema = lake_schema("postgres", users, described("users", [score]))
    target = LakeDirectTarget(output, {users: schema}.__getitem__)
    handles = [target.stage(users, [{"id": 98, "n": 2.0, "tags": [], "big": "y"}])]
    record = DirectRecord("w", Position(49, 0), Position(50, 0), frozenset())
    assert target.commit(users, handles, record, ("id",)) == 1
    assert LakeTable.open(output, users).unfolded == {"score"}

    stream.opening = [
        stream.schema_event("users", described("users", [score])),
        stream.schema_event("items", described("items")),
    ]
    write(events_dir, stream.batch(10), [])
    compact(None, events_dir, output)
    assert LakeTable.open(output, users).unfolded == frozenset()
    assert str(lake_state(output, "app.users")[(98,)]["score"]) == "2.5"


@pytest.mark.parametrize("failing", ["fill", "folded", "fold_schema", "merge"])
def test_a_run_that_dies_while_folding_an_added_column_converges(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    """A run folding ALTER ADD COLUMN score DEFAULT 2.5 dies after the commit that added the
    column, at each later step: before its default is written into the older rows, before
    the ADD is recorded, before the schema event is, before the rows' commit. The next run
    (the table's progress has not moved, so it reads the same events) ends with every row
    before the ALTER holding the default, the rows of the run that died's too."""
    stream, events_dir, output = Stream(19), tmp_path / "events", tmp_path / "lake"
    write(events_dir, stream.batch(30), [])
    compact(None, events_dir, output)
    stored = set(lake_state(output, "app.users"))
    assert stored

    def at(commit: int, seq: int) -> SourceInfo:
        return SourceInfo("src", "db", "app", "users", Position(commit, seq), Origin.LOG)

    base = stream.commit + 1
    new = {"id": 97, "n": 1.0, "tags": [], "big": "x"}  # written whole before the ALTER
    changed = {"id": min(stored)[0], "n": 3.0}  # an update, no earlier image in the run
    stream.commit += 5
    score = Column("score", "numeric(6,1)", True, "'2.5'::numeric")
    added = stream.schema_event("users", described("users", [score]))
    later = {"id": 99, "n": 1.0, "tags": [], "big": "x", "score": "7.0"}
    events = [
        PlainEvent(Op.CREATE, {"id": 97}, None, new, at(base, 1), 1),
        PlainEvent(Op.UPDATE, {"id": changed["id"]}, None, changed, at(base + 1, 1), 1),
        added,
        PlainEvent(Op.CREATE, {"id": 99}, None, later, at(stream.commit + 1, 1), 2),
    ]
    write(events_dir, events, [])
    step = getattr(LakeTable, failing)

    def dying(self: LakeTable, *args: Any, **kwargs: Any) -> Any:
        if self.table.name == "users":
            raise OSError(f"the compaction died at {failing}")
        return step(self, *args, **kwargs)

    monkeypatch.setattr(LakeTable, failing, dying)
    with pytest.raises(OSError, match="the compaction died"):
        compact(None, events_dir, output)
    monkeypatch.setattr(LakeTable, failing, step)
    users = LakeTable.open(output, TableRef("app", "users"))
    assert "score" in users.arrow_schema.names and users.progress < added.position

    compact(None, events_dir, output)
    scores = {k: str(r["score"]) for k, r in lake_state(output, "app.users").items()}
    assert scores.pop((99,)) == "7.0"
    assert set(scores) == stored | {(97,)} and set(scores.values()) == {"2.5"}


def test_a_run_removes_the_direct_dumps_stale_staged_files(tmp_path: Path) -> None:
    stream, events_dir, output = Stream(12), tmp_path / "events", tmp_path / "lake"
    write(events_dir, stream.batch(10), [])
    staged = output / STAGED / "app.users"
    staged.mkdir(parents=True)
    fresh, stale = staged / "fresh.parquet", staged / "stale.parquet"
    for path in (fresh, stale):
        path.write_bytes(b"")
    old = time.time() - STALE_STAGED_S - 60
    os.utime(stale, (old, old))
    report = compact(None, events_dir, output)
    assert (report.stale_staged, fresh.exists(), stale.exists()) == (1, True, False)
    assert report.to_json()["removed_stale_staged"] == 1


def test_a_run_that_fails_between_tables_leaves_committed_versions_and_converges(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failed commit of the second table: the first table keeps its new version with its
    progress, the second its previous one, the read cursor does not move, and the next run
    folds what is missing without folding anything twice."""
    stream, events_dir, output = Stream(13), tmp_path / "events", tmp_path / "lake"
    write(events_dir, stream.batch(60), [])
    compact(spark, events_dir, output, CompactOptions(local_below=0))
    before = CompactState.load(output)
    write(events_dir, stream.batch(60), [])
    items, users = (LakeTable.open(output, TableRef("app", t)) for t in ("items", "users"))
    versions = {"app.items": items.version, "app.users": users.version}
    folded = items.progress

    merge = LakeTable.merge

    def failing(self: LakeTable, batch: pa.Table, **options: Any) -> Any:
        if self.table.name == "users":
            raise OSError("the commit failed")
        return merge(self, batch, **options)

    monkeypatch.setattr(LakeTable, "merge", failing)
    with pytest.raises(OSError, match="the commit failed"):
        compact(spark, events_dir, output, CompactOptions(local_below=0))
    monkeypatch.setattr(LakeTable, "merge", merge)
    assert CompactState.load(output) == before
    assert LakeTable.open(output, TableRef("app", "users")).version == versions["app.users"]
    items_after = LakeTable.open(output, TableRef("app", "items"))
    assert items_after.version > versions["app.items"]
    assert folded is not None and items_after.progress is not None
    assert items_after.progress > folded
    report = compact(spark, events_dir, output, CompactOptions(local_below=0))
    assert found(output) == expected(stream)
    assert set(report.tables) == {"app.users"}  # items' events were skipped: its progress has them


def test_a_compaction_killed_mid_run_leaves_committed_versions_and_converges(
    tmp_path: Path,
) -> None:
    """SIGKILL while the command commits one merge after another (a batch of one key each):
    wherever it dies, between a merge's data files and its commit or between commits, every
    table reads as one of its committed versions, and the next run converges."""
    stream, events_dir, output = Stream(17), tmp_path / "events", tmp_path / "lake"
    write(events_dir, stream.batch(300), [])
    command = [sys.executable, str(ROOT / "spark_jobs" / "compact.py")]
    args = ["--input", str(events_dir), "--output", str(output), "--batch-rows", "1"]
    run = subprocess.Popen(command + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    log = output / "app.items" / "_delta_log"
    deadline = time.monotonic() + 120
    while len(list(log.glob("*.json")) if log.exists() else []) < 5:  # a few merges in
        assert run.poll() is None, run.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "no commits within 2 minutes"
        time.sleep(0.005)
    run.kill()
    assert run.wait(30) == -signal.SIGKILL
    assert not (output / CURSOR_FILE).exists()  # the read cursor is written only at the end
    items = LakeTable.open(output, TableRef("app", "items"))
    assert len(lake_state(output, "app.items")) > 0 and items.progress is None
    compact(None, events_dir, output)
    assert found(output) == expected(stream)


def test_command_line(tmp_path: Path) -> None:
    stream, events_dir, output = Stream(3), tmp_path / "events", tmp_path / "lake"
    write(events_dir, stream.batch(20), [])
    command = [sys.executable, str(ROOT / "spark_jobs" / "compact.py")]
    args = ["--input", str(events_dir), "--output", str(output), "--master", "local[2]"]
    done = subprocess.run(command + args, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert sorted(report["tables"]) == ["app.items", "app.users"]
    assert report["tables"]["app.users"]["rows"] > 0
    assert CompactState.load(output).position == report["position"]
    assert found(output) == expected(stream)


LOCAL_BELOW = 64 * 1024
"""The documented command's `--local-below` in its test: 64 KiB, not 64 MiB, so a dump of a few
hundred rows is a backlog that folds on Spark."""


def test_the_readme_command_runs_the_workers_on_the_drivers_python(
    pg15: PostgresInfo, redis_server: RedisInfo, tmp_path: Path
) -> None:
    """`python spark_jobs/compact.py --input … --output … --config …` as the docs show it:
    no `--master` (PySpark's default master), no PYSPARK_PYTHON, and the `python3` on PATH a
    Python without this project's dependencies (as where `python` is a virtualenv's and the
    system's `python3` comes first). A backlog above `--local-below` folds on Spark, whose
    Python workers run the driver's interpreter, not that `python3`: it lacks msgspec."""
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    (bare / "bin" / "python").unlink()  # `python` stays this .venv's, `python3` is the bare one
    events_dir, output = tmp_path / "events", tmp_path / "lake"
    with running_pipeline(pg15, redis_server, tmp_path, 300, events_dir=events_dir) as pipeline:
        store = pipeline.store
        store.dumps.create(DumpRequest("backlog", DumpKind.ALL, DEMO_TABLES, chunk_size=500))
        assert run_dump(store, pipeline.dbs.source.chunk_source, "backlog") is DumpState.DONE
        wait_caught_up(pipeline.dbs)
        backlog = sum(path.stat().st_size for path in event_files(events_dir))
        assert backlog > LOCAL_BELOW, "a backlog that folds in the driver tests nothing here"
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK_")}
        path = [str(bare / "bin"), str(Path(sys.executable).parent), env["PATH"]]
        env["PATH"] = os.pathsep.join(path)
        trap = subprocess.run(["python3", "-c", "import msgspec"], env=env, capture_output=True)
        assert b"No module named 'msgspec'" in trap.stderr
        command = [
            *("python", "spark_jobs/compact.py"),
            *("--input", str(events_dir), "--output", str(output)),
            *("--config", str(pipeline.config_path), "--local-below", str(LOCAL_BELOW)),
        ]
        done = subprocess.run(
            command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False
        )
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert sorted(report["tables"]) == sorted(str(t) for t in DEMO_TABLES)
    for table in DEMO_TABLES:
        assert LakeTable.open(output, table).rows().num_rows == 300, table


def test_a_second_compaction_of_one_directory_is_refused(
    spark: SparkSession, tmp_path: Path
) -> None:
    stream, events_dir, output = Stream(5), tmp_path / "events", tmp_path / "lake"
    write(events_dir, stream.batch(20), [])
    # Another process holds the directory through the compaction's own lock.
    hold = (
        "import sys; from pathlib import Path\n"
        "from airflow_provider_dblog.compaction.run import output_lock\n"
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
        assert not (output / CURSOR_FILE).exists()
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        assert holder.wait(30) == 0
    compact(spark, events_dir, output)  # the lock is free again
    assert found(output) == expected(stream)


def test_lake_equals_the_source_after_a_dump_under_writes(
    spark: SparkSession,
    pg15: PostgresInfo,
    redis_server: RedisInfo,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The real change stream (log events and dump rows, NDJSON from the tailer) of tables
    whose rows predate capture, dumped while another connection writes: the lake tables,
    created from the source's catalog, hold exactly the source's rows in their real types;
    `--prune` removes exactly the tombstones before the state store's horizon."""
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
        schemas = {t: source_lake_schema(dbs.config, t) for t in DEMO_TABLES}
        source = dbs.source.chunk_source()
        try:
            wanted = {}
            for t in DEMO_TABLES:
                rows = source.read_chunk(Chunk(t, 0, limit=10**6)).rows
                typed = schemas[t].to_arrow([LakeRow(r, 1, 0, "r") for r in rows])
                wanted[t] = typed.drop_columns(list(POSITION_COLUMNS))
        finally:
            source.close()
        report = compact(
            spark, events_dir, output, CompactOptions(describe=schemas.__getitem__, local_below=0)
        )
        assert set(report.tables) == {str(t) for t in DEMO_TABLES}
        tombstones = tombstone_positions(output)
        # The command, pruning at the state store's horizon (the tailer's checkpoint here).
        prune = ["--input", str(events_dir), "--output", str(output), "--prune"]
        assert main([*prune, "--config", str(pipeline.config_path)]) == 0
        horizon = store.directs.horizon()
    assert horizon is not None and any(p < horizon for p in tombstones)
    pruned = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["pruned_tombstones"]
    assert pruned == sum(p < horizon for p in tombstones)
    assert all(p >= horizon for p in tombstone_positions(output))
    for table in DEMO_TABLES:
        lake = LakeTable.open(output, table)
        assert lake.arrow_schema.field("id" if table.name != "orders" else "n").nullable is False
        read = read_lake(output, str(table)).drop_columns(list(POSITION_COLUMNS))
        assert read.num_rows == wanted[table].num_rows > 0
        assert by_key(read, schemas[table].key) == by_key(wanted[table], schemas[table].key)
    accounts = lake_table_types(output, TableRef("public", "accounts"))
    assert accounts["balance"] == pa.decimal128(12, 2)
    assert accounts["updated"] == pa.timestamp("us", tz="UTC")


def tombstone_positions(output: Path) -> list[Position]:
    found = []
    for table in DEMO_TABLES:
        rows = LakeTable.open(output, table).rows(include_tombstones=True).to_pylist()
        found += [Position(r[COMMIT], r[SEQ]) for r in rows if r[DELETED]]
    return found


def by_key(table: pa.Table, key: Sequence[str]) -> dict[tuple[Any, ...], dict[str, Any]]:
    return {tuple(r[k] for k in key): r for r in table.to_pylist()}


def lake_table_types(output: Path, table: TableRef) -> dict[str, pa.DataType]:
    schema = LakeTable.open(output, table).arrow_schema
    return {f.name: f.type for f in schema}
