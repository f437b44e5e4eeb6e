"""A deployment as a user runs it: the bench table on the private PostgreSQL, `dblog tail` in
its own process keeping a target (the SQL-apply output into a second database, or NDJSON that
`dblog lake compact --follow` folds into the lake), and `dblog dump` and `dblog verify` run as
commands, each timed from start to exit."""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg
from support import REDIS_PASSWORD_ENV, Env, dblog_command, wait_until

from airflow_provider_dblog.core.dump_plan import Chunk
from airflow_provider_dblog.core.event import TableRef, key_of
from airflow_provider_dblog.core.verify import Difference

TABLE = TableRef("public", "vrows")
TARGET_DB = "vtarget"
TARGET_DSN_ENV = "DBLOG_BENCH_TARGET_DSN"
DDL = (
    "CREATE TABLE public.vrows (id bigint PRIMARY KEY, name text NOT NULL, n integer NOT NULL,"
    " v numeric(14,4), at timestamptz NOT NULL)"
)
FILL = (
    "INSERT INTO public.vrows SELECT i, 'name-' || i || repeat('x', (i %% 40)::int),"
    " (i %% 1000)::int, i / 7.0, timestamptz '2026-01-01 00:00:00+00' + i * interval '1 second'"
    " FROM generate_series(1, %s) AS i"
)


def create_tables(env: Env, rows: int) -> str:
    """The source table with `rows` rows, and the SQL target's database with the table empty;
    the target's DSN (also in `TARGET_DSN_ENV`, which `dblog` subprocesses inherit)."""
    env.sql(DDL)
    env.sql(FILL, (rows,))
    env.sql("ANALYZE public.vrows")
    with psycopg.connect(env.pg.admin_dsn, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {TARGET_DB} OWNER {env.pg.user}")
    dsn = env.pg.dsn.rsplit("/", 1)[0] + "/" + TARGET_DB
    with psycopg.connect(dsn, autocommit=True) as target:
        target.execute(DDL)
    os.environ[TARGET_DSN_ENV] = dsn
    return dsn


@dataclass(frozen=True)
class VerifyRun:
    seconds: float
    exit_status: int
    counts: dict[str, int]
    """checked, in_flux, missing, extra, changed of the bench table."""
    found: set[tuple[Difference, int]]
    """Every differing key the run stored, with how it differs."""
    report: str


class Deployment:
    """One source (its own slot and name) and its tailer, started at once; `close` ends the
    processes it started."""

    def __init__(self, env: Env, name: str, *, lake: bool, py_spy: str | None = None) -> None:
        self.env = env
        self.py_spy = py_spy
        """py-spy's path: each verify runs under `py-spy record`, its stacks beside the logs."""
        self.name = name
        self.lake = lake
        self.store = env.store(name)
        self.logs = env.base / f"{name}-logs"
        self.logs.mkdir()
        self.config = self._write_config()
        self._processes: list[subprocess.Popen[bytes]] = []
        self._start("tail", "--owner", f"bench-{name}")
        if lake:
            self._start("lake", "compact", "--follow", "--interval", "0.2")
        wait_until(lambda: self.store.tailer.health() is not None, 60, f"{name}'s tailer leading")

    def _write_config(self) -> Path:
        section = self.env.source_section(self.name, [str(TABLE)])
        rds = self.env.rds
        if self.lake:
            output = {"type": "ndjson", "directory": str(self.env.base / f"{self.name}-events")}
        else:
            output = {"type": "sql_apply", "dsn_env": TARGET_DSN_ENV, "monotonic": True}
        lines = [
            "[source]",
            *(f"{key} = {json.dumps(value)}" for key, value in section.items()),
            "",
            "[redis]",
            f'url = "redis://{rds.host}:{rds.port}/{rds.db}"',
            f'password_env = "{REDIS_PASSWORD_ENV}"',
            "",
            "[output]",
            *(f"{key} = {json.dumps(value)}" for key, value in output.items()),
            "",
            "[tailer]",
            "heartbeat_s = 0.2",
            "window_ttl_s = 120",
        ]
        if self.lake:
            lines += ["", "[lake]", f'root = "{self.lake_root}"']
        path = self.env.base / f"{self.name}.toml"
        path.write_text("\n".join(lines) + "\n")
        return path

    @property
    def lake_root(self) -> Path:
        return self.env.base / f"{self.name}-lake"

    def _start(self, *args: str) -> None:
        log = (self.logs / f"{args[0]}.log").open("ab")
        command = [*dblog_command(), *args, "--config", str(self.config)]
        self._processes.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT))

    def _run(
        self, *args: str, profile: str | None = None
    ) -> tuple[float, subprocess.CompletedProcess[str]]:
        """A `dblog` command to its end (under py-spy, its stacks in `profile`); its seconds
        and its result."""
        spy = []
        if profile is not None and self.py_spy is not None:
            stacks = self.logs / f"{profile}.txt"
            spy = [self.py_spy, "record", "--idle", "--format", "raw", "-o", str(stacks), "--"]
        started = time.monotonic()
        done = subprocess.run(
            [*spy, *dblog_command(), *args, "--config", str(self.config)],
            capture_output=True,
            text=True,
            timeout=3600,
            check=False,
        )
        return time.monotonic() - started, done

    def dump(self, *, mode: str, chunk_size: int | None = None) -> float:
        """A full dump of the bench table; its seconds."""
        size = [] if chunk_size is None else ["--chunk-size", str(chunk_size)]
        seconds, done = self._run("dump", "--table", str(TABLE), "--mode", mode, *size)
        if done.returncode != 0:
            raise RuntimeError(f"bench: dblog dump failed:\n{done.stdout[-2000:]}{done.stderr}")
        return seconds

    def verify(
        self,
        verify_id: str,
        *,
        repair: bool = False,
        parallelism: int = 1,
        chunk_size: int | None = None,
    ) -> VerifyRun:
        """`dblog verify` of the bench table against this deployment's target (`chunk_size`
        None: verify's default)."""
        target = "lake" if self.lake else "output"
        size = [] if chunk_size is None else ["--chunk-size", str(chunk_size)]
        seconds, done = self._run(
            "verify", "--table", str(TABLE), "--target", target, "--verify-id", verify_id,
            "--show", "0", "--repair", "auto" if repair else "none",
            "--parallelism", str(parallelism), *size, profile=f"verify-{verify_id}",
        )  # fmt: skip
        if done.returncode not in (0, 1):
            raise RuntimeError(f"bench: dblog verify failed:\n{done.stdout[-2000:]}{done.stderr}")
        counts = self.store.verifies.counts(verify_id).get(TABLE, {})
        found = {(d.kind, int(d.key[0])) for d in self.store.verifies.differences(verify_id)}
        return VerifyRun(seconds, done.returncode, counts, found, done.stdout)

    def read_rate(self, chunk_size: int) -> float:
        """Rows/s of reading the whole table in this process as a dump reads it, chunk by
        chunk in key order (`ChunkSource.read_chunk`: the rows as the source's JSON), with no
        window and no target: the ceiling of one side of a verify's reads."""
        source = self.env.source(self.name, [str(TABLE)]).chunk_source()
        rows, seq, after, started = 0, 0, None, time.monotonic()
        try:
            while True:
                seq += 1
                read = source.read_chunk(Chunk(TABLE, seq, after=after, limit=chunk_size))
                if not read.rows:
                    break
                rows += len(read.rows)
                after = key_of(read.rows[-1], ("id",))
        finally:
            source.close()
        return rows / (time.monotonic() - started)

    def close(self) -> None:
        for process in reversed(self._processes):
            process.terminate()
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(30)
