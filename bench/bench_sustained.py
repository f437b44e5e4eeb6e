"""Sustained-load benchmark: sysbench's oltp_write_only against a private MariaDB, then
PostgreSQL, while the tailer follows its tables into NDJSON.

For each database sysbench (Debian's package: a load generator no one here wrote) prepares
its tables, the tailer follows them (in a thread of this process, as `dblog tail` runs it),
and the bench finds the highest rate the machine sustains with the tailer running: sysbench
unthrottled at 1, 2 and 4 threads for a few seconds each, the most transactions/s kept (or
the given `--threads` and `--rate`). Then two runs of `--seconds` each, the tailer caught up
before each:

  no dump    sysbench alone;
  with dump  sysbench while `dblog dump` (its own process, chunk 5000, sequenced) dumps every
             captured table, again and again until the run ends.

Each run prints transactions/s (sysbench's count); events/s written (rows the run changed in
the sysbench tables, counted by the server: MariaDB's TABLE_STATISTICS with userstat on,
PostgreSQL's pg_stat_user_tables); events/s read (log events of those tables the tailer made
durable in NDJSON during the run); the tailer's lag p50/p99/worst over one sample a second;
how long after the load it caught up; the tailer's CPU per event read (its reading and writer
threads), and with a dump per event or dump row (a sequenced dump's rows go through the tailer);
on PostgreSQL the live ceiling, `pg_recvlogical` following the same load on a slot of
its own (`LiveCeiling`), with its lag; and the load average.

The lag: every 100 ms a probe row is committed into a captured table of its own, beside
sysbench's transactions, its `created` the server's clock at insert. The log is read in commit
order, so a probe waits behind every change committed before it. The lag at second T is the
age at T of the oldest probe committed but not yet durable in NDJSON, or, when none is
pending, the commit-to-durable time of the last probe made durable before T: the delay from
a change's commit until its line is durable, to within the probe interval.

    .venv/bin/python bench/bench_sustained.py [--quick] [--seconds N] [--threads N]
        [--rate TPS] [--only mariadb|postgres]

No figure is checked against a threshold: this measures, it does not test.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import repeat
from pathlib import Path
from typing import Any

import psycopg
import pymysql
from support import (
    Env,
    RunningTailer,
    dblog_command,
    load_average,
    reader_form,
    say,
    step,
    wait_until,
)

from airflow_provider_dblog.core.encoded_rows import PageLines
from airflow_provider_dblog.core.event import Event, Op
from airflow_provider_dblog.core.lines import Lines, LogLines, LogRuns
from airflow_provider_dblog.devservices.mariadb import MariaDBServer
from airflow_provider_dblog.devservices.postgres import SYSTEM_BIN_DIR, PostgresServer
from airflow_provider_dblog.devservices.redis import RedisServer
from airflow_provider_dblog.outputs.ndjson import NdjsonOutput
from airflow_provider_dblog.sources.postgres.lsn import parse_pg_lsn
from airflow_provider_dblog.state import StateStore
from airflow_provider_dblog.tailer import tune_gc

PROBE_TABLE = "lag_probe"
PROBE_IN_LINE = b'"table":"%s"' % PROBE_TABLE.encode()
"""What a line of a probe's change holds (in its source), and no other line."""
PROBE_INTERVAL_S = 0.1
CEILING_SAMPLE_S = 0.1
DUMP_CHUNK = 5000
DATABASES = ("mariadb", "postgres")


@dataclass(frozen=True)
class Sizes:
    tables: int
    table_size: int
    seconds: float
    calibration_s: float
    thread_choices: tuple[int, ...]
    catch_up_s: float
    """How long the tailer may take to catch up after a run before the bench says it did not."""
    rate: int | None
    """sysbench's --rate in the measured runs (None: unthrottled)."""

    @classmethod
    def full(cls) -> Sizes:
        return cls(4, 100_000, 60.0, 5.0, (1, 2, 4), 600.0, None)

    @classmethod
    def quick(cls) -> Sizes:
        """A check that the bench works: the rate is still found, but the runs are throttled
        to 200 transactions/s so that the tailer's catch-up stays short."""
        return cls(2, 2_000, 3.0, 1.0, (1, 2), 120.0, 200)


# -- the two databases ------------------------------------------------------------------------


def table_names(tables: int) -> list[str]:
    """sysbench's tables and the probe table: what the tailer captures."""
    return [*(f"sbtest{n}" for n in range(1, tables + 1)), PROBE_TABLE]


class Database:
    """What differs between the databases under sysbench: its driver options, the names of
    its tables, the probe and the server's count of changed rows."""

    kind: str
    label: str
    source_kind: str

    def __init__(self, env: Env) -> None:
        self.env = env

    def sysbench_options(self) -> list[str]:
        raise NotImplementedError

    def captured(self, tables: int) -> list[str]:
        raise NotImplementedError

    def prepare(self) -> None:
        """Create the probe table and set the server up (before sysbench's prepare)."""
        raise NotImplementedError

    def rows_changed(self) -> int:
        """Rows changed in the sysbench tables so far, by the server's count."""
        raise NotImplementedError

    def probe_connection(self) -> Any:
        raise NotImplementedError

    def insert_probe(self, conn: Any) -> tuple[int, float]:
        """Commit one probe row; its id and `created` (the server's epoch seconds at insert)."""
        raise NotImplementedError


class MariaDB(Database):
    kind, label, source_kind = "mariadb", "MariaDB", "mysql"

    def sysbench_options(self) -> list[str]:
        info = self.env.mariadb
        assert info is not None
        return [
            "db-driver=mysql",
            f"mysql-host={info.host}",
            f"mysql-port={info.port}",
            f"mysql-user={info.user}",
            f"mysql-password={info.password}",
            f"mysql-db={info.dbname}",
        ]

    def captured(self, tables: int) -> list[str]:
        return table_names(tables)

    def prepare(self) -> None:
        """Count changed rows per table, and commit without flushing InnoDB's log to disk:
        the throwaway PostgreSQL runs without fsync, and both should be held back by the CPU
        the tailer shares, not by this machine's disk (with a flush a commit, one thread
        committed about 150 transactions/s here against PostgreSQL's 2,000)."""
        self.env.mariadb_one("SET GLOBAL userstat = 1", admin=True)
        self.env.mariadb_one("SET GLOBAL innodb_flush_log_at_trx_commit = 2", admin=True)
        self.env.mariadb_one(
            f"CREATE TABLE {PROBE_TABLE} (id bigint AUTO_INCREMENT PRIMARY KEY, created double)"
        )

    def rows_changed(self) -> int:
        info = self.env.mariadb
        assert info is not None
        (changed,) = self.env.mariadb_one(
            "SELECT COALESCE(SUM(ROWS_CHANGED), 0) FROM information_schema.TABLE_STATISTICS"
            f" WHERE TABLE_SCHEMA = '{info.dbname}' AND TABLE_NAME LIKE 'sbtest%'"
        )
        return int(changed)

    def probe_connection(self) -> Any:
        assert self.env.mariadb is not None
        return pymysql.connect(**self.env.mariadb.connect_kwargs(), autocommit=True)

    def insert_probe(self, conn: Any) -> tuple[int, float]:
        with conn.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {PROBE_TABLE} (created) VALUES (UNIX_TIMESTAMP(NOW(6)))"
                " RETURNING id, created"
            )
            row = cursor.fetchone()
        return int(row[0]), float(row[1])


class Postgres(Database):
    kind, label, source_kind = "postgres", "PostgreSQL", "postgres"

    def sysbench_options(self) -> list[str]:
        pg = self.env.pg
        return [
            "db-driver=pgsql",
            f"pgsql-host={pg.host}",
            f"pgsql-port={pg.port}",
            f"pgsql-user={pg.user}",
            f"pgsql-password={pg.password}",
            f"pgsql-db={pg.dbname}",
        ]

    def captured(self, tables: int) -> list[str]:
        return [f"public.{name}" for name in table_names(tables)]

    def prepare(self) -> None:
        self.env.sql(
            f"CREATE TABLE public.{PROBE_TABLE}"
            " (id bigserial PRIMARY KEY, created double precision)"
        )

    def rows_changed(self) -> int:
        """Each backend reports its counts when idle for a second or at its exit, which comes
        just after sysbench disconnects: read after the tailer caught up, they are complete."""
        return int(
            self.env.sql(
                "SELECT COALESCE(sum(n_tup_ins + n_tup_upd + n_tup_del), 0)"
                " FROM pg_stat_user_tables WHERE relname LIKE 'sbtest%%'"
            )
        )

    def probe_connection(self) -> Any:
        return psycopg.connect(self.env.pg.dsn, autocommit=True)

    def insert_probe(self, conn: Any) -> tuple[int, float]:
        row = conn.execute(
            f"INSERT INTO {PROBE_TABLE} (created) VALUES (extract(epoch FROM clock_timestamp()))"
            " RETURNING id, created"
        ).fetchone()
        return int(row[0]), float(row[1])


# -- sysbench ---------------------------------------------------------------------------------


class Sysbench:
    """sysbench oltp_write_only on one database; its options (the password among them) in a
    file only this user can read, never on its command line."""

    def __init__(self, db: Database, sizes: Sizes, base: Path) -> None:
        self.sizes = sizes
        self.options = base / f"sysbench-{db.kind}.cfg"
        self.options.touch(mode=0o600)
        self.options.write_text("\n".join(db.sysbench_options()) + "\n")
        self.binary = shutil.which("sysbench")
        if self.binary is None:
            raise FileNotFoundError("sysbench not found: run scripts/install-system-deps.sh")

    def command(self, action: str, *options: str) -> list[str]:
        assert self.binary is not None
        return [
            self.binary,
            f"--config-file={self.options}",
            "oltp_write_only",
            f"--tables={self.sizes.tables}",
            f"--table-size={self.sizes.table_size}",
            *options,
            action,
        ]

    def prepare(self) -> None:
        subprocess.run(self.command("prepare"), check=True, capture_output=True, timeout=1800)

    def run(self, threads: int, seconds: float, rate: int | None) -> float:
        """One run to its end; sysbench's transactions/s."""
        options = [f"--threads={threads}", f"--time={math.ceil(seconds)}"]
        if rate is not None:
            options.append(f"--rate={rate}")
        done = subprocess.run(
            self.command("run", *options), capture_output=True, text=True, timeout=seconds + 600
        )
        if done.returncode != 0:
            raise RuntimeError(f"bench: sysbench failed:\n{done.stdout[-2000:]}{done.stderr}")
        found = re.search(r"transactions:\s+\d+\s+\((\d+(?:\.\d+)?) per sec\.\)", done.stdout)
        if found is None:
            raise RuntimeError(f"bench: no transactions/s in sysbench's output:\n{done.stdout}")
        return float(found.group(1))


# -- the tailer's output and the probes -------------------------------------------------------


class ProbedNdjson(NdjsonOutput):
    """NDJSON that counts the log events of the sysbench tables it made durable and notes when
    each probe row became durable (a look at each event's table, in the writer thread)."""

    def __init__(self, directory: Path) -> None:
        super().__init__(directory)
        self.log_events = 0
        self.probes_durable: dict[int, float] = {}

    def write_items(self, items: Sequence[Event | Lines], token: int) -> None:
        super().write_items(items, token)
        now = time.time()
        for item in items:  # as cheap as can be: this is the tailer's writer thread
            if isinstance(item, PageLines):  # a dump's rows
                continue
            if isinstance(item, LogLines | LogRuns):  # changes read together
                if PROBE_IN_LINE not in item.data:  # nearly every run: one search of its bytes
                    self.log_events += len(item)
                    continue
                for run in item.runs if isinstance(item, LogRuns) else (item,):
                    count = len(run.keys)
                    ops = repeat(run.op, count) if run.ops is None else run.ops
                    tables = repeat(run.origin.table, count) if run.tables is None else run.tables
                    for table, op, key in zip(tables, ops, run.keys, strict=True):
                        if table.name != PROBE_TABLE:
                            self.log_events += 1
                        elif op is Op.CREATE:
                            self.probes_durable[int(key["id"])] = now
            elif item.table.name != PROBE_TABLE:
                self.log_events += 1
            elif item.op is Op.CREATE:
                self.probes_durable[int(item.key["id"])] = now


class Probes:
    """Probe rows committed every `PROBE_INTERVAL_S` in a thread, while a block runs."""

    def __init__(self, db: Database, output: ProbedNdjson) -> None:
        self.db, self.output = db, output
        self.committed: list[tuple[int, float]] = []
        """(id, created) of each probe committed."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.error: BaseException | None = None

    def _run(self) -> None:
        try:
            with self.db.probe_connection() as conn:
                while not self._stop.wait(PROBE_INTERVAL_S):
                    self.committed.append(self.db.insert_probe(conn))
        except BaseException as exc:
            self.error = exc

    def __enter__(self) -> Probes:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(30)
        if self.error is not None:
            raise RuntimeError(f"bench: the probe writer failed: {self.error!r}")

    def lag_samples(self, start: float, end: float) -> list[float]:
        """The lag at each whole second after `start` until `end` (see the module's doc)."""
        durable = self.output.probes_durable
        samples = []
        at = start + 1.0
        while at <= end + 1e-6:
            pending = [c for i, c in self.committed if c <= at and durable.get(i, math.inf) > at]
            if pending:
                samples.append(at - min(pending))
            else:
                done = [(durable[i], durable[i] - c) for i, c in self.committed if i in durable]
                done = [d for d in done if d[0] <= at]
                if done:
                    samples.append(max(done)[1])
            at += 1.0
        return samples


def probe_now(db: Database) -> int:
    """Commit one probe row now; its id."""
    with db.probe_connection() as conn:
        return db.insert_probe(conn)[0]


def durable_by(output: ProbedNdjson, probe: int, timeout_s: float) -> float | None:
    """The time (epoch seconds) probe `probe` became durable, waiting for it up to
    `timeout_s`; None if it did not."""
    with contextlib.suppress(TimeoutError):
        wait_until(lambda: probe in output.probes_durable, timeout_s, "the tailer catching up")
        return output.probes_durable[probe]
    return None


def caught_up_s(db: Database, output: ProbedNdjson, timeout_s: float) -> float | None:
    """Commit one probe now and wait until it is durable: seconds it took, or None if it was
    not within `timeout_s`."""
    started = time.time()
    durable = durable_by(output, probe_now(db), timeout_s)
    return None if durable is None else durable - started


# -- the live ceiling: pg_recvlogical following the same load ----------------------------------


class LiveCeiling:
    """`pg_recvlogical` following the run's load on a slot of its own (pgoutput, the tailer's
    publication; status and fsync every second, as a consumer that confirms promptly), its lag
    taken from its slot: at each sample, the age of the oldest WAL position not yet confirmed,
    to within `CEILING_SAMPLE_S`. What the machine allows a client that does no work."""

    def __init__(self, env: Env, publication: str) -> None:
        self.env, self.publication = env, publication
        self.slot = f"{publication}_live_ceiling"
        self.history: list[tuple[float, int, int]] = []
        """(time, WAL written, the slot's confirmed position) every `CEILING_SAMPLE_S`."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> LiveCeiling:
        self.env.sql("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (self.slot,))
        command = [
            str(SYSTEM_BIN_DIR / "pg_recvlogical"),
            *("--dbname", self.env.libpq_dsn, "--slot", self.slot, "--start"),
            *("--option", "proto_version=1", "--option", f"publication_names={self.publication}"),
            *("--status-interval", "1", "--fsync-interval", "1", "--file", "/dev/null"),
        ]
        self._process = subprocess.Popen(
            command, env={**os.environ, "PGPASSWORD": self.env.pg.password}
        )
        self._thread.start()
        return self

    def _sample(self) -> None:
        with psycopg.connect(self.env.pg.dsn, autocommit=True) as conn:
            while not self._stop.wait(CEILING_SAMPLE_S):
                row = conn.execute(
                    "SELECT pg_current_wal_lsn()::text, confirmed_flush_lsn::text"
                    " FROM pg_replication_slots WHERE slot_name = %s",
                    (self.slot,),
                ).fetchone()
                if row is not None and row[1] is not None:
                    written, confirmed = parse_pg_lsn(row[0]), parse_pg_lsn(row[1])
                    self.history.append((time.time(), written, confirmed))

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(30)
        if self._process is not None:
            self._process.terminate()
            self._process.wait(30)
        self.env.drop_slot(self.slot)

    def lag_samples(self, start: float, end: float) -> list[float]:
        """The lag at each whole second after `start` until `end`: how long ago the WAL first
        reached the position the slot had confirmed by then (0 when it confirmed all)."""
        samples = []
        at = start + 1.0
        while at <= end + 1e-6:
            seen = [h for h in self.history if h[0] <= at]
            if seen:
                now, written, confirmed = seen[-1]
                behind = [t for t, w, _ in seen if w > confirmed]
                samples.append(0.0 if confirmed >= written or not behind else now - behind[0])
            at += 1.0
        return samples


# -- the dump running beside -------------------------------------------------------------------


class DumpLoop:
    """`dblog dump` of every captured table in its own process, one dump after another until
    the block ends (the last one cancelled)."""

    def __init__(self, env: Env, toml: Path, store: StateStore, kind: str) -> None:
        self.env, self.toml, self.store, self.kind = env, toml, store, kind
        self.dump_ids: list[str] = []
        self.finished = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.error: str | None = None

    def _run(self) -> None:
        while not self._stop.is_set():
            dump_id = f"sustained-{self.kind}-{len(self.dump_ids)}"
            self.dump_ids.append(dump_id)
            log = self.env.base / f"{dump_id}.log"
            command = [*dblog_command(), "dump", "--config", str(self.toml), "--dump-id", dump_id]
            with log.open("wb") as out:
                dump = subprocess.Popen(
                    [*command, "--chunk-size", str(DUMP_CHUNK)],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            while dump.poll() is None:
                if self._stop.wait(0.1):
                    self._cancel(dump_id, dump)
                    return
            if dump.returncode != 0:
                self.error = f"dump {dump_id} exited {dump.returncode}: {log.read_text()[-2000:]}"
                return
            self.finished += 1

    def _cancel(self, dump_id: str, dump: subprocess.Popen[bytes]) -> None:
        """Cancel the dump `dump` runs, once it has made its request."""
        wait_until(
            lambda: dump.poll() is not None or self.store.dumps.status(dump_id) is not None,
            120,
            f"dump {dump_id} starting",
        )
        if dump.poll() is None:
            self.store.dumps.cancel(dump_id)
        dump.wait(120)

    def rows(self) -> int:
        total = 0
        for dump_id in self.dump_ids:
            status = self.store.dumps.status(dump_id)
            total += 0 if status is None else int(status.rows)
        return total

    def __enter__(self) -> DumpLoop:
        self._thread.start()
        wait_until(lambda: self.rows() > 0 or self.error is not None, 120, "the first chunk")
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(180)


# -- one run ----------------------------------------------------------------------------------


@dataclass
class Run:
    database: str
    label: str
    threads: int
    rate: int | None
    seconds: float
    tps: float
    written: int
    read: int
    lag: list[float]
    caught_up_s: float | None
    load: str
    dump_rows: int | None = None
    dumps_finished: int = 0
    dump_note: str = ""
    cpu_s: tuple[float, float] = (0.0, 0.0)
    """The tailer's CPU seconds during the run: its reading thread's and its writer's."""
    ceiling_lag: list[float] | None = None
    """pg_recvlogical's lag on the same load (`LiveCeiling`), PostgreSQL only."""

    def quantile(self, q: float) -> float:
        ordered = sorted(self.lag)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else math.nan

    def line(self) -> str:
        rate = f", --rate {self.rate}" if self.rate is not None else ""
        caught = (
            f"caught up {self.caught_up_s:.1f} s after the load"
            if self.caught_up_s is not None
            else "not caught up"
        )
        text = (
            f"S {self.database} {self.label}: {self.threads} threads{rate}, {self.tps:.0f} "
            f"transactions/s, {self.written / self.seconds:.0f} events/s written, "
            f"{self.read / self.seconds:.0f} events/s read, lag p50 {self.quantile(0.5):.3f} s, "
            f"p99 {self.quantile(0.99):.3f} s, worst {max(self.lag, default=math.nan):.3f} s "
            f"({len(self.lag)} samples), {caught}"
        )
        if self.read:
            reader, writer = (cpu / self.read * 1e6 for cpu in self.cpu_s)
            text += f", tailer CPU {reader + writer:.1f} us/event (writer {writer:.1f})"
            if self.dump_rows:  # a sequenced dump's rows go through the tailer too
                both = sum(self.cpu_s) / (self.read + self.dump_rows) * 1e6
                text += f", {both:.1f} us an event or dump row"
        if self.ceiling_lag is not None:
            ordered = sorted(self.ceiling_lag) or [math.nan]
            text += (
                f", pg_recvlogical lag p50 {ordered[len(ordered) // 2]:.3f} s, worst "
                f"{ordered[-1]:.3f} s"
            )
        if self.dump_rows is not None:
            text += (
                f", dump {self.dump_rows:,} rows ({self.dump_rows / self.seconds:.0f} rows/s, "
                f"{self.dumps_finished} finished{self.dump_note})"
            )
        return text + f"; load average {self.load}"


def measure(
    db: Database,
    sysbench: Sysbench,
    tailer: RunningTailer,
    output: ProbedNdjson,
    label: str,
    threads: int,
    sizes: Sizes,
    during: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
    ceiling: LiveCeiling | None = None,
) -> Run:
    """One sysbench run of `sizes.seconds` with probes, inside `during()` and beside
    `ceiling`; then the catch-up."""
    before = caught_up_s(db, output, sizes.catch_up_s)
    if before is None:
        say(f"{db.label}: the tailer is still behind the run before; this one starts late")
    changed = db.rows_changed()
    following = ceiling if ceiling is not None else contextlib.nullcontext()
    with following, during() as beside, Probes(db, output) as probes:
        read = output.log_events
        cpu_before = tailer.thread_cpu_s()
        start = time.time()
        tps = sysbench.run(threads, sizes.seconds, sizes.rate)
        end = time.time()
        read = output.log_events - read
        cpu = tuple(b - a for a, b in zip(cpu_before, tailer.thread_cpu_s(), strict=True))
        last = probe_now(db)
        dump_rows = beside.rows() if isinstance(beside, DumpLoop) else None
    caught = durable_by(output, last, sizes.catch_up_s)
    run = Run(
        db.kind,
        label,
        threads,
        sizes.rate,
        end - start,
        tps,
        db.rows_changed() - changed,
        read,
        probes.lag_samples(start, end),
        None if caught is None else caught - end,
        load_average(),
        dump_rows,
    )
    run.cpu_s = (cpu[0], cpu[1])
    if ceiling is not None:
        run.ceiling_lag = ceiling.lag_samples(start, end)
    if isinstance(beside, DumpLoop):
        run.dumps_finished = beside.finished
        overlapped = beside.error is None and len(beside.dump_ids) > beside.finished
        run.dump_note = ", running throughout" if overlapped else f"; {beside.error}"
    return run


def calibrate(db: Database, sysbench: Sysbench, output: ProbedNdjson, sizes: Sizes) -> int:
    """The thread count at which sysbench commits the most transactions/s with the tailer
    running; the tailer catches up after each try."""
    best, best_tps = sizes.thread_choices[0], 0.0
    for threads in sizes.thread_choices:
        tps = sysbench.run(threads, sizes.calibration_s, None)
        say(f"{db.label}: {threads} threads unthrottled: {tps:.0f} transactions/s")
        if tps > best_tps:
            best, best_tps = threads, tps
        if caught_up_s(db, output, sizes.catch_up_s) is None:
            say(f"{db.label}: the tailer did not catch up within {sizes.catch_up_s:.0f}s")
    return best


def bench_database(env: Env, db: Database, sizes: Sizes, threads: int | None) -> list[Run]:
    sysbench = Sysbench(db, sizes, env.base)
    step(f"{db.label}: sysbench prepare, {sizes.tables} tables of {sizes.table_size} rows")
    db.prepare()
    sysbench.prepare()
    name = f"bench_sustained_{db.kind}"
    tables = db.captured(sizes.tables)
    source = env.source(name, tables, db.source_kind)
    source.ensure_setup()
    toml = env.write_toml(name, tables, env.base / f"{name}-unused", db.source_kind)
    store = env.store(name)
    output = ProbedNdjson(env.base / f"{name}-out")
    runs = []
    with RunningTailer(env, source, output) as tailer:
        # A reader without a resume point starts at the log's end, wherever that is when it
        # connects: probe until one probe comes through.
        following = lambda: durable_by(output, probe_now(db), 1.0) is not None  # noqa: E731
        wait_until(following, 120, f"the {db.label} tailer following")
        if threads is None:
            step(f"{db.label}: finding the rate the machine sustains")
            threads = calibrate(db, sysbench, output, sizes)
        for label, during in (
            ("no dump", contextlib.nullcontext),
            ("with dump", lambda: DumpLoop(env, toml, store, db.kind)),
        ):
            step(f"{db.label}: {threads} threads for {sizes.seconds:.0f}s, {label}")
            ceiling = LiveCeiling(env, name) if db.kind == "postgres" else None
            run = measure(db, sysbench, tailer, output, label, threads, sizes, during, ceiling)
            if not tailer.alive():
                raise RuntimeError(f"bench: the {db.label} tailer stopped")
            print(run.line(), flush=True)
            runs.append(run)
    if db.kind == "postgres":
        env.drop_slot(name)
    return runs


def report(runs: list[Run]) -> str:
    lines = [
        "",
        f"{'run':<30} {'tx/s':>7} {'written/s':>10} {'read/s':>8} {'lag p50':>8} "
        f"{'p99':>7} {'worst':>7} {'ceiling':>8} {'us/ev':>6} {'dump rows/s':>12}",
        "-" * 111,
    ]
    for run in runs:
        dump = "" if run.dump_rows is None else f"{run.dump_rows / run.seconds:,.0f}"
        ceiling = max(run.ceiling_lag, default=math.nan) if run.ceiling_lag is not None else None
        cpu = sum(run.cpu_s) / run.read * 1e6 if run.read else math.nan
        lines.append(
            f"{run.database + ' ' + run.label + f' ({run.threads} thr)':<30} {run.tps:>7,.0f} "
            f"{run.written / run.seconds:>10,.0f} {run.read / run.seconds:>8,.0f} "
            f"{run.quantile(0.5):>8.3f} {run.quantile(0.99):>7.3f} "
            f"{max(run.lag, default=math.nan):>7.3f} "
            f"{'' if ceiling is None else f'{ceiling:.3f}':>8} {cpu:>6.1f} {dump:>12}"
        )
    lines.append(
        "ceiling: pg_recvlogical's worst lag on the same load; us/ev: the tailer's CPU "
        "microseconds per event read (both threads)"
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="small tables, 3 s runs at 200 transactions/s"
    )
    parser.add_argument("--seconds", type=float, help="length of each run (default 60)")
    parser.add_argument("--threads", type=int, help="sysbench threads (default: the best found)")
    parser.add_argument(
        "--rate",
        type=int,
        help="sysbench --rate in transactions/s (default: none; 200 with --quick)",
    )
    parser.add_argument("--only", choices=DATABASES, help="one database (default: both)")
    args = parser.parse_args(argv)
    sizes = Sizes.quick() if args.quick else Sizes.full()
    if args.seconds:
        sizes = dataclasses.replace(sizes, seconds=args.seconds)
    if args.rate:
        sizes = dataclasses.replace(sizes, rate=args.rate)
    databases = (args.only,) if args.only else DATABASES
    tune_gc()  # the tailer runs in this process: collect as `dblog tail` does
    started = time.monotonic()
    load_before = load_average()
    print(
        "lag: the age of the oldest change committed but not yet durable in NDJSON (or, with "
        "none pending, the last one's commit-to-durable time), sampled every second, measured "
        f"by probe rows committed every {PROBE_INTERVAL_S * 1000:.0f} ms beside sysbench's",
        flush=True,
    )
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="dblog-bench-sustained-") as tmp:
        base = Path(tmp)
        with contextlib.ExitStack() as stack:
            step(f"starting {', '.join(databases)} and Redis in {base}")
            pg = stack.enter_context(PostgresServer(base / "pg"))
            mariadb = (
                stack.enter_context(MariaDBServer(base / "mariadb"))
                if "mariadb" in databases
                else None
            )
            rds = stack.enter_context(RedisServer(base / "redis"))
            env = Env(base, pg.info, rds.info, None if mariadb is None else mariadb.info)
            for kind in databases:
                db: Database = MariaDB(env) if kind == "mariadb" else Postgres(env)
                runs += bench_database(env, db, sizes, args.threads)
    print(report(runs))
    print(f"\ntotal {time.monotonic() - started:.0f}s")
    print(f"load average (1, 5, 15 min): {load_before} at the start, {load_average()} at the end")
    print(f"PostgreSQL log reader: {reader_form()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
