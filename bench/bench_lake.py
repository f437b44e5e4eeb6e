"""Lake benchmark: does a fold's or a direct commit's cost follow the changes or the table?

For each table size (`--rows`, default 500k and 5M) it fills a lake table through the direct
path (chunks of 100k keys staged and committed as a direct dump does), then, for keys drawn
at random over the whole key range and for keys skewed to its recent end (what an
auto-increment table sees: the last 200k keys, whatever the table's size):

F   a fold of `--changes` (20k) updates and deletes on those keys: the NDJSON written as the
    tailer writes it, folded by the compaction in the driver (and on Spark local[2] with
    `--spark`), events/s and seconds;
D   a direct commit (staging and commit, the rows made before) of one chunk of 100k existing
    keys (a key range: at a random place, or the last keys), rows/s and seconds;

each with the files its commits removed and added, the rows they rewrote and the commits
(from the Delta log), and after every step the table read by DuckDB (the Parquet files the
log lists) and Polars (`read_delta`), in a child process, whose counts of current rows must
equal the bench's own. Then the
ratios of the largest size's seconds to the smallest's (the goal: <= 2).

S   sustained folding: a writer thread appends update events at `--rate` events/s for
    `--seconds` to the NDJSON files while the compaction follower (`dblog lake compact
    --follow`'s `Follower`, on a private Redis) folds them into the smallest size's table;
    freshness (from an event's write to the end of the run that folded it) p50/p99, the
    rate the writer held, and whether the follower kept up (freshness p99 within 30 s, and
    the last event folded within 30 s of the writer's end).

Each line ends with the load average (1, 5, 15 min; 2 cores here, shared).

    nice -n 10 .venv/bin/python bench/bench_lake.py [--quick] [--rows 500000,5000000]
        [--changes N] [--spark] [--rate R] [--seconds S] [--key bigint|text]
        [--deletion-vectors] [--full-rows]

`--key text` keys the table by text (`acct-` and 12 digits, in the integers' order).
`--deletion-vectors` creates the tables with deletion vectors (the lake's default, as
`dblog lake enable-deletion-vectors` sets it; the files' key indexes are written as they are
written): writes mark the rows they replace deleted instead of rewriting files (a file so
marked is counted apart), and
DuckDB reads the table through delta-rs's engine (Arrow), as a plain Parquet read would see
the deleted rows. `--full-rows` makes updates carry every column (MySQL/MariaDB's full row
images; a PostgreSQL row with no unchanged TOASTed value), where by default they leave the
note out, as PostgreSQL does an unchanged TOASTed value, which a write must then read.

No figure is checked against a threshold: this measures, it does not test.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import duckdb
import polars
import pyarrow as pa
from support import load_average, wait_until

from airflow_provider_dblog.compaction.follow import Follower, FollowSettings
from airflow_provider_dblog.compaction.run import CompactOptions, compact
from airflow_provider_dblog.core.direct import DirectRecord
from airflow_provider_dblog.core.event import (
    Event,
    Op,
    Origin,
    PlainEvent,
    SourceInfo,
    TableRef,
    table_event,
)
from airflow_provider_dblog.core.position import Position
from airflow_provider_dblog.core.schema import Column, TableSchema
from airflow_provider_dblog.devservices.redis import RedisServer
from airflow_provider_dblog.lake.direct import commit_staged, stage_table
from airflow_provider_dblog.lake.schema import LakeSchema, lake_schema
from airflow_provider_dblog.lake.table import (
    LakeTable,
    give_new_tables_deletion_vectors,
    table_uri,
)
from airflow_provider_dblog.outputs.ndjson import NdjsonOutput
from airflow_provider_dblog.state import CompactorStore

TABLE = TableRef("app", "accounts")
KEYS: dict[str, Callable[[int], int | str]] = {
    "bigint": int,
    "text": lambda n: f"acct-{n:012d}",  # in the integers' order: recent keys stay at the end
}
"""The key types of `--key`: how key number n is spelled."""


def described(key: str) -> TableSchema:
    return TableSchema(
        (
            Column("id", key, False, None),
            Column("owner", "text", True, None),
            Column("balance", "numeric(12,2)", True, None),
            Column("active", "boolean", True, None),
            Column("updated", "timestamp with time zone", True, None),
            Column("note", "text", True, None),
        ),
        ("id",),
    )


CHUNK = 100_000
RECENT = 200_000
"""How many keys at the recent end of the key range skewed keys fall in."""


def load() -> str:
    return f"load {load_average()}"


def values(schema: LakeSchema, keys: Sequence[int | str], rng: random.Random) -> pa.Table:
    """Rows of `keys` as a direct dump stages them (built as Arrow columns at once)."""
    count = len(keys)
    cents = [rng.randrange(10**8) for _ in range(count)]
    columns = {
        "id": pa.array(keys),
        "owner": pa.array([f"owner-{k}" for k in keys]),
        "balance": pa.array(cents, pa.int64()).cast(pa.decimal128(19, 0)),
        "active": pa.array([c % 2 == 0 for c in cents]),
        "updated": pa.array([1_700_000_000_000_000 + c for c in cents], pa.timestamp("us")),
        "note": pa.array(["x" * (20 + c % 180) for c in cents]),
    }
    arrays = [columns[f.name].cast(f.type) for f in schema.values_schema()]
    return pa.Table.from_arrays(arrays, schema=schema.values_schema())


class Lake:
    """One lake table of the bench, the positions it hands out and the rows it should hold."""

    def __init__(
        self, root: Path, rows: int, key: str, vectors: bool = False, full_rows: bool = False
    ) -> None:
        self.root, self.rows, self.vectors, self.full_rows = root, rows, vectors, full_rows
        self.described = described(key)
        self.key = KEYS[key]
        self.schema = lake_schema("postgres", TABLE, self.described)
        self.commit = 1_000
        self.deleted: set[int] = set()
        self.rng = random.Random(rows)

    def direct(self, keys: Sequence[int]) -> float:
        """Stage `keys`' rows in two parts and commit them as one direct chunk; the seconds
        that took (the rows are made before)."""
        batch = values(self.schema, [self.key(k) for k in keys], self.rng)
        start = time.perf_counter()
        half = batch.num_rows // 2
        handles = [
            stage_table(self.root, TABLE, batch.slice(0, half)),
            stage_table(self.root, TABLE, batch.slice(half)),
        ]
        self.commit += 10
        lw, hw = Position(self.commit - 1, 0), Position(self.commit, 0)
        record = DirectRecord("bench", lw, hw, frozenset())
        commit_staged(self.root, TABLE, handles, self.schema, record, ("id",))
        elapsed = time.perf_counter() - start
        self.deleted.difference_update(keys)
        return elapsed

    def fill(self) -> float:
        if self.vectors:
            give_new_tables_deletion_vectors(self.root)
        start = time.perf_counter()
        for first in range(0, self.rows, CHUNK):
            self.direct(range(first, min(first + CHUNK, self.rows)))
        return time.perf_counter() - start

    def changes(self, keys: Sequence[int], first: bool) -> list[Event]:
        """Updates (a partial row: the TOASTed note unchanged; with `full_rows`, every
        column) and deletes (one in ten) of `keys`, one transaction of four events per
        commit."""
        found: list[Event] = []
        if first:
            self.commit += 1
            at = Position(self.commit, 0)
            source = SourceInfo("src", "db", "app", "accounts", at, Origin.LOG)
            found.append(table_event(Op.SCHEMA, source, 1, self.described))
        now_ms = int(time.time() * 1000)
        for index, key in enumerate(keys):
            if index % 4 == 0:
                self.commit += 1
            position = Position(self.commit, 2 * (index % 4) + 1)
            source = SourceInfo("src", "db", "app", "accounts", position, Origin.LOG, ts_ms=now_ms)
            spelled = self.key(key)
            if self.rng.random() < 0.1:
                found.append(PlainEvent(Op.DELETE, {"id": spelled}, None, None, source, 1))
                self.deleted.add(key)
            else:
                after = {"id": spelled, "owner": f"o-{key}", "balance": "1.50", "active": True}
                if self.full_rows:
                    after |= {"updated": "2026-01-01T00:00:00+00:00", "note": f"n-{key}"}
                found.append(PlainEvent(Op.UPDATE, {"id": spelled}, None, after, source, 1))
                self.deleted.discard(key)
        return found

    @property
    def current(self) -> int:
        return self.rows - len(self.deleted)


def layout(root: Path) -> tuple[int, int]:
    """The table's version and file count."""
    lake = LakeTable.open(root, TABLE)
    return lake.version, len(lake.delta.file_uris())


def rewritten(root: Path, since: int, version: int) -> str:
    """What the commits after `since` up to `version` did, from their log entries: files
    removed (of those `since` listed) and added, the rows of those removed (rewritten; with
    deletion vectors, all replaced), files marked (removed and added again with a deletion
    vector), and commits."""
    gone: set[str] = set()
    added: set[str] = set()
    for at in range(since + 1, version + 1):
        log = Path(table_uri(root, TABLE)) / "_delta_log" / f"{at:020d}.json"
        actions = [json.loads(line) for line in log.read_text().splitlines()]
        gone |= {a["remove"]["path"] for a in actions if "remove" in a}
        added |= {a["add"]["path"] for a in actions if "add" in a}
    before = LakeTable.open(root, TABLE, since).delta.get_add_actions(flatten=True)
    records = dict(
        zip(
            before.column("path").to_pylist(), before.column("num_records").to_pylist(), strict=True
        )
    )
    marked = gone & added
    rows = sum(records.get(p, 0) for p in gone - marked)
    removed = len((gone - marked) & set(records))
    return (
        f"-{removed}/+{len(added - gone)} files, {rows} rows in removed files, {len(marked)} files "
        f"marked, {version - since} commits"
    )


def reader_counts(root: Path) -> tuple[int, int]:
    """The current rows as DuckDB (the Parquet files the log lists) and Polars count them."""
    lake = LakeTable.open(root, TABLE)
    if lake.deletion_vectors:
        scan = lake.delta.scan(columns=["_dblog_deleted"])  # noqa: F841 (DuckDB reads it)
        found = duckdb.execute("SELECT count(*) FROM scan WHERE NOT _dblog_deleted").fetchone()
    else:
        query = "SELECT count(*) FROM read_parquet($files) WHERE NOT _dblog_deleted"
        found = duckdb.execute(query, {"files": lake.delta.file_uris()}).fetchone()
    frame = polars.read_delta(table_uri(root, TABLE))
    return (-1 if found is None else found[0]), frame.filter(~polars.col("_dblog_deleted")).height


def check_readers(lake: Lake) -> None:
    """DuckDB and Polars read the current rows the bench expects. In a child process: a read
    of a 50M-row table leaves this one's allocators returning gigabytes for a while after,
    which slowed the next timed step by about half a second."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as child:
        counts = child.submit(reader_counts, lake.root).result()
    assert counts == (lake.current, lake.current), (counts, lake.current)


def fold(lake: Lake, events: Path, spark: object, keys: Sequence[int], first: bool) -> float:
    with NdjsonOutput(events) as out:
        out.write(lake.changes(keys, first), 1)
    start = time.perf_counter()
    report = compact(spark, events, lake.root, CompactOptions(local_below=0))  # type: ignore[arg-type]
    elapsed = time.perf_counter() - start
    assert report.events >= len(keys), report.events
    return elapsed


def pick(lake: Lake, count: int, recent: bool) -> list[int]:
    low = max(0, lake.rows - RECENT) if recent else 0
    return lake.rng.sample(range(low, lake.rows), count)


def series(
    work: Path, rows: int, changes: int, spark: object, key: str, vectors: bool, full: bool
) -> dict[str, float]:
    """One size's steps; their seconds by step name."""
    root, events = work / f"lake-{rows}", work / f"events-{rows}"
    lake = Lake(root, rows, key, vectors, full)
    filled = lake.fill()
    version, files = layout(root)
    check_readers(lake)
    print(
        f"{rows} rows: filled in {filled:.1f} s ({rows / filled:.0f} rows/s), "
        f"{files} files, {load()}",
        flush=True,
    )
    seconds: dict[str, float] = {}
    first = True
    for keys in ("random", "recent"):
        recent = keys == "recent"
        folders = [("driver", None)] + ([("spark", spark)] if spark is not None else [])
        for where, session in folders:
            since = version
            elapsed = fold(lake, events, session, pick(lake, changes, recent), first)
            first = False
            version, files = layout(root)
            check_readers(lake)
            seconds[f"fold {keys} {where}"] = elapsed
            print(
                f"  F {keys:6} fold ({where}) of {changes} changes: {changes / elapsed:.0f} "
                f"events/s ({elapsed:.2f} s), {rewritten(root, since, version)}, {files} files, "
                f"{load()}",
                flush=True,
            )
        start_key = max(0, rows - CHUNK) if recent else lake.rng.randrange(max(1, rows - CHUNK))
        keys_range = range(start_key, min(rows, start_key + CHUNK))
        since = version
        elapsed = lake.direct(keys_range)
        version, files = layout(root)
        check_readers(lake)
        seconds[f"direct {keys}"] = elapsed
        print(
            f"  D {keys:6} direct commit of {len(keys_range)} existing keys: "
            f"{len(keys_range) / elapsed:.0f} rows/s ({elapsed:.2f} s), "
            f"{rewritten(root, since, version)}, {files} files, {load()}",
            flush=True,
        )
    return seconds


def sustained(work: Path, rows: int, rate: int, seconds: float, key: str, vectors: bool) -> None:
    """The writer at `rate` events/s for `seconds`; the follower folds as it goes."""
    root, events = work / "lake-sustained", work / "events-sustained"
    lake = Lake(root, rows, key, vectors)
    lake.fill()
    with NdjsonOutput(events) as out:
        out.write(lake.changes([0], True), 1)
    compact(None, events, root, CompactOptions())
    written: list[tuple[int, int]] = []  # (commit, ts_ms) of each batch's last event
    sent = [0]

    def write() -> None:
        with NdjsonOutput(events) as out:
            begun = time.monotonic()
            while time.monotonic() - begun < seconds:
                due = int((time.monotonic() - begun) * rate) - sent[0]
                if due > 0:
                    batch = lake.changes([lake.rng.randrange(rows) for _ in range(due)], False)
                    out.write(batch, 1)
                    sent[0] += due
                    written.append((lake.commit, int(time.time() * 1000)))
                time.sleep(0.05)  # the writer's pace, not a synchronisation

    with (
        tempfile.TemporaryDirectory(prefix="bench-lake-redis-") as base,
        RedisServer(Path(base)) as rds,
    ):
        store = CompactorStore(rds.info.client(), "bench")
        follower = Follower(
            store,
            events,
            root,
            CompactOptions,
            None,
            settings=FollowSettings(interval_s=1.0),
        )
        folded: list[tuple[float, list[int] | None]] = []
        stop = threading.Event()

        def watch() -> None:
            runs = 0
            while not stop.is_set():
                if follower.stats.runs != runs:
                    runs = follower.stats.runs
                    folded.append((time.time(), follower.stats.position))
                time.sleep(0.01)

        threads = [
            threading.Thread(target=follower.run, args=(stop,), daemon=True),
            threading.Thread(target=watch, daemon=True),
        ]
        for thread in threads:
            thread.start()
        writer = threading.Thread(target=write)
        begun = time.monotonic()
        writer.start()
        writer.join()
        ended = time.monotonic()
        last = lake.commit
        try:
            wait_until(
                lambda: bool(folded) and (folded[-1][1] or [0])[0] >= last,
                120,
                "the follower folding the last event",
            )
            caught_up_s = time.monotonic() - ended
        except TimeoutError:
            caught_up_s = float("inf")
        stop.set()
        for thread in threads:
            thread.join()
    freshness = []
    for commit, ts_ms in written:
        done = next((at for at, pos in folded if pos is not None and pos[0] >= commit), None)
        if done is not None:
            freshness.append(done - ts_ms / 1000)
    p50 = statistics.median(freshness) if freshness else float("inf")
    p99 = sorted(freshness)[int(0.99 * (len(freshness) - 1))] if freshness else float("inf")
    kept_up = p99 <= 30 and caught_up_s <= 30  # the goal: freshness p99 within 30 s
    print(
        f"S sustained {rate} events/s for {ended - begun:.0f} s into {rows} rows (the "
        f"writer held {sent[0] / (ended - begun):.0f}/s): "
        f"{follower.stats.runs} runs, freshness p50 {p50:.1f} s p99 {p99:.1f} s, "
        f"last event folded {caught_up_s:.1f} s after the writer ended "
        f"({'keeps up' if kept_up else 'falls behind'}), {load()}",
        flush=True,
    )
    check_readers(lake)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (well under a minute)")
    parser.add_argument("--rows", help="table sizes, comma-separated (default 500000,5000000)")
    parser.add_argument("--changes", type=int, help="changes per fold (default 20000)")
    parser.add_argument("--spark", action="store_true", help="fold on Spark local[2] too")
    parser.add_argument("--rate", type=int, help="sustained events/s (default 20000)")
    parser.add_argument("--seconds", type=float, help="sustained writing time (default 60)")
    parser.add_argument(
        "--key", choices=sorted(KEYS), default="bigint", help="the key's type (default bigint)"
    )
    parser.add_argument(
        "--deletion-vectors", action="store_true", help="writes mark rows deleted in place"
    )
    parser.add_argument(
        "--full-rows", action="store_true", help="updates carry every column (no kept one)"
    )
    args = parser.parse_args(argv)
    sizes = [
        int(s)
        for s in (args.rows or ("50000,100000" if args.quick else "500000,5000000")).split(",")
    ]
    changes = args.changes or (2_000 if args.quick else 20_000)
    rate = args.rate or (2_000 if args.quick else 20_000)
    duration = args.seconds or (2.0 if args.quick else 60.0)
    spark = None
    if args.spark:
        from pyspark.sql import SparkSession

        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        spark = (
            SparkSession.builder.master("local[2]")
            .appName("bench-lake")
            .config("spark.ui.enabled", "false")
            .config("spark.driver.memory", "2g")
            .config("spark.ui.showConsoleProgress", "false")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
    try:
        with tempfile.TemporaryDirectory(prefix="bench-lake-") as work:
            print(
                f"sizes {sizes}, {changes} changes per fold, {args.key} keys, deletion vectors "
                f"{'on' if args.deletion_vectors else 'off'}, "
                f"{'full' if args.full_rows else 'partial'} updates, {load()}",
                flush=True,
            )
            results = {
                rows: series(
                    Path(work),
                    rows,
                    changes,
                    spark,
                    args.key,
                    args.deletion_vectors,
                    args.full_rows,
                )
                for rows in sizes
            }
            if len(sizes) > 1:
                small, large = results[min(sizes)], results[max(sizes)]
                ratios = ", ".join(f"{k} {large[k] / small[k]:.2f}" for k in small)
                print(f"ratios {max(sizes)} / {min(sizes)} rows: {ratios}, {load()}")
            sustained(Path(work), min(sizes), rate, duration, args.key, args.deletion_vectors)
    finally:
        if spark is not None:
            spark.stop()  # type: ignore[attr-defined]
    return 0


if __name__ == "__main__":
    sys.exit(main())
