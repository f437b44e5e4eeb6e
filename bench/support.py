"""What the benches share: the private servers' environment, a tailer in a thread of the bench
process writing NDJSON that counts what it made durable, waiting, progress lines, the load
average and CPU metering from /proc (Linux).

The benches run as scripts (`python bench/bench_x.py`), so this module is imported by its name
from the script's directory.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psycopg
import pymysql

from airflow_provider_dblog.core.encoded_rows import PageLines
from airflow_provider_dblog.core.event import Event, Op
from airflow_provider_dblog.core.lines import Lines
from airflow_provider_dblog.devservices.mariadb import MariaDBInfo
from airflow_provider_dblog.devservices.postgres import PostgresInfo
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.outputs.ndjson import NdjsonOutput
from airflow_provider_dblog.sources.base import Source
from airflow_provider_dblog.sources.factory import parse_source_config, source_for
from airflow_provider_dblog.sources.postgres.lsn import parse_pg_lsn
from airflow_provider_dblog.state import StateStore
from airflow_provider_dblog.tailer import Tailer, TailerSettings

PG_PASSWORD_ENV = "DBLOG_BENCH_PG_PASSWORD"
MARIADB_PASSWORD_ENV = "DBLOG_BENCH_MARIADB_PASSWORD"
REDIS_PASSWORD_ENV = "DBLOG_BENCH_REDIS_PASSWORD"

_STARTED = time.monotonic()
_TICKS = os.sysconf("SC_CLK_TCK")


# -- progress, waiting, the machine -----------------------------------------------------------


def say(message: str) -> None:
    print(f"  .. {message}", flush=True)


def step(message: str) -> None:
    """A progress line with the seconds since the bench started."""
    say(f"[{time.monotonic() - _STARTED:5.1f}s] {message}")


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"bench: {what} did not happen within {timeout_s:.0f}s")
        time.sleep(0.005)


def load_average() -> str:
    """The 1, 5 and 15 minute load averages: other work on the machine skews every figure."""
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f}"


def reader_form() -> str:
    """Which form of the PostgreSQL log reader runs: compiled (`scripts/compile.py`) or plain
    Python (no compiled files, or `DBLOG_PLAIN_PYTHON=1`)."""
    from airflow_provider_dblog.sources.postgres.compiled import running_compiled

    return "compiled (mypyc)" if running_compiled() else "plain Python"


def dblog_command() -> list[str]:
    return [sys.executable, "-m", "airflow_provider_dblog.cli"]


def proc_status_kib(pid: int, field: str) -> int:
    """A field of /proc/PID/status in KiB (VmRSS, VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def thread_cpu_s(native_id: int) -> float:
    """User + system CPU seconds of one thread of this process; 0 once it has ended."""
    try:
        fields = Path(f"/proc/self/task/{native_id}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICKS


def _cpu_by_process() -> tuple[dict[int, int], dict[int, float]]:
    """Each live process's parent and CPU seconds: its own and its reaped children's
    (utime, stime, cutime, cstime from /proc/PID/stat)."""
    parents: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # it ended meanwhile
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # from field 3 (state) on
        parents[int(entry.name)] = int(fields[1])
        cpu[int(entry.name)] = sum(int(f) for f in fields[11:15]) / _TICKS
    return parents, cpu


def tree_cpu_s(root: int) -> float:
    """CPU seconds of process `root` and of every process under it, running or ended."""
    parents, cpu = _cpu_by_process()
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        total += cpu.get(pid, 0.0)
        todo += children.get(pid, [])
    return total


# -- the servers ------------------------------------------------------------------------------


class Env:
    """The private servers and how to reach them without a password on any command line: the
    passwords travel in this process's environment, which `dblog` subprocesses inherit."""

    def __init__(
        self, base: Path, pg: PostgresInfo, rds: RedisInfo, mariadb: MariaDBInfo | None = None
    ) -> None:
        self.base = base
        self.pg = pg
        self.rds = rds
        self.mariadb = mariadb
        os.environ[PG_PASSWORD_ENV] = pg.password
        os.environ[REDIS_PASSWORD_ENV] = rds.password
        if mariadb is not None:
            os.environ[MARIADB_PASSWORD_ENV] = mariadb.password
        self.libpq_dsn = f"host={pg.host} port={pg.port} dbname={pg.dbname} user={pg.user}"

    def source_section(self, name: str, tables: Sequence[str], kind: str = "postgres") -> dict:
        """The `[source]` section of a source on the private PostgreSQL (its own slot and
        publication) or MariaDB (watermarks in the app database)."""
        if kind == "postgres":
            return {
                "type": "postgres",
                "name": name,
                "dsn": self.libpq_dsn,
                "tables": list(tables),
                "password_env": PG_PASSWORD_ENV,
                "slot": name,
                "publication": name,
            }
        info = self.mariadb
        assert info is not None, "this bench started no MariaDB"
        return {
            "type": "mysql",
            "name": name,
            "dsn": f"mysql://{info.user}@{info.host}:{info.port}/{info.dbname}",
            "tables": list(tables),
            "password_env": MARIADB_PASSWORD_ENV,
            "watermark_database": info.dbname,
        }

    def source(self, name: str, tables: Sequence[str], kind: str = "postgres") -> Source:
        """The source `write_toml` configures."""
        return source_for(parse_source_config(self.source_section(name, tables, kind)))

    def write_toml(
        self, name: str, tables: Sequence[str], output_dir: Path, kind: str = "postgres"
    ) -> Path:
        """A `dblog` TOML file for `source`'s section, the private Redis and NDJSON output."""
        path = self.base / f"{name}.toml"
        section = self.source_section(name, tables, kind)
        path.write_text(
            "[source]\n"
            + "".join(f"{key} = {json.dumps(value)}\n" for key, value in section.items())
            + "\n[redis]\n"
            f'url = "redis://{self.rds.host}:{self.rds.port}/{self.rds.db}"\n'
            f'password_env = "{REDIS_PASSWORD_ENV}"\n\n'
            "[output]\n"
            'type = "ndjson"\n'
            f'directory = "{output_dir}"\n'
        )
        return path

    def sql(self, statement: str, params: Sequence[Any] | None = None) -> Any:
        """Run one statement on PostgreSQL; the first column of its first row, if any."""
        with psycopg.connect(self.pg.dsn, autocommit=True) as conn:
            cursor = conn.execute(statement, params)
            row = cursor.fetchone() if cursor.description else None
        return None if row is None else row[0]

    def mariadb_one(self, statement: str, *, admin: bool = False) -> tuple[Any, ...]:
        """Run one statement on MariaDB (as root over its socket with `admin`); its first row."""
        info = self.mariadb
        assert info is not None, "this bench started no MariaDB"
        kwargs = info.admin_connect_kwargs() if admin else info.connect_kwargs()
        with pymysql.connect(**kwargs, autocommit=True) as conn, conn.cursor() as cursor:
            cursor.execute(statement)
            row = cursor.fetchone()
        return () if row is None else tuple(row)

    def wal_lsn(self) -> int:
        return parse_pg_lsn(self.sql("SELECT pg_current_wal_lsn()::text"))

    def confirmed_flush(self, slot: str) -> int:
        value = self.sql(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
            (slot,),
        )
        return parse_pg_lsn(value) if value else 0

    def drop_slot(self, slot: str) -> None:
        self.sql("SELECT pg_drop_replication_slot(%s)", (slot,))

    def store(self, source: str) -> StateStore:
        return StateStore(self.rds.client(), source)


# -- the tailer -------------------------------------------------------------------------------


class TimedNdjson(NdjsonOutput):
    """NDJSON that counts the events it made durable and notes, for each insert into
    `timed_table`, how long after its `created` time (epoch seconds) it became durable."""

    def __init__(self, directory: Path, timed_table: str | None = None) -> None:
        super().__init__(directory)
        self.durable_events = 0
        self.timed_table = timed_table
        self.latency: dict[int, float] = {}

    def write_items(self, items: Sequence[Event | Lines], token: int) -> None:
        super().write_items(items, token)
        now = time.time()
        self.durable_events += sum(len(i) if isinstance(i, Lines) else 1 for i in items)
        if self.timed_table is not None:
            for item in items:
                if isinstance(item, PageLines):  # a dump's rows
                    continue
                for event in item.events() if isinstance(item, Lines) else (item,):
                    if event.op is Op.CREATE and event.source.table == self.timed_table:
                        assert event.after is not None
                        self.latency[int(event.key["id"])] = now - float(event.after["created"])


class RunningTailer:
    """A Tailer in a thread of this process, started and stopped around a block."""

    def __init__(self, env: Env, source: Source, output: NdjsonOutput) -> None:
        self.output = output
        self.tailer = Tailer(
            source,
            env.store(source.name),
            output,
            owner=f"bench-{source.name}",
            settings=TailerSettings(window_ttl_s=60),
        )
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self.tailer.run, args=(self._stop,), daemon=True)

    def __enter__(self) -> RunningTailer:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(30)
        self.output.close()

    def alive(self) -> bool:
        return self._thread.is_alive()

    def cpu_s(self) -> float:
        """CPU seconds the tailer's threads used so far: its session's thread and its output
        writer's (`dblog-writer`)."""
        return sum(self.thread_cpu_s())

    def thread_cpu_s(self) -> tuple[float, float]:
        """CPU seconds of the session's thread (the reader's decoding and the session's work)
        and of the writer's, so far."""
        writers = [t for t in threading.enumerate() if t.name == "dblog-writer"]
        cpu = [thread_cpu_s(t.native_id) if t.native_id else 0.0 for t in [self._thread, *writers]]
        return cpu[0], sum(cpu[1:])
