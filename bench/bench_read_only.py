"""Read-only dumps against dumps that write watermarks: the same table dumped by `dblog dump`'s
runner (in this process, sequenced) through a tailer in a thread, on PostgreSQL and MariaDB.

A read-only window waits for the tailer twice (arming, then passing hw) where a written one
waits for the tailer to meet two watermark rows; the bench prints rows/s of each, the best of
`--runs` alternating runs, and their ratio (the goal: read-only / written >= 0.9).
It also reads the chunks from a replica (`read_replica`, read-only: a hot standby, a GTID
replica of MariaDB) and prints the primary's CPU seconds per million rows dumped, beside the
same with the reads on the primary (the goal: near zero). The primary spends CPU
without any dump too (the tailer's idle keepalives, streaming to the replica, background
workers): the same span of time with the tailer idle is measured after each dump and the
dump's share printed as the difference.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from support import Env, RunningTailer, TimedNdjson, load_average, say, tree_cpu_s, wait_until

from airflow_provider_dblog.core.dump_plan import DumpKind, DumpRequest
from airflow_provider_dblog.devservices.mariadb import MariaDBServer
from airflow_provider_dblog.devservices.mariadb_replica import MariaDBReplica
from airflow_provider_dblog.devservices.pg_replica import PostgresReplica
from airflow_provider_dblog.devservices.postgres import PostgresServer
from airflow_provider_dblog.devservices.redis import RedisServer
from airflow_provider_dblog.dump.runner import run_dump
from airflow_provider_dblog.sources.factory import parse_source_config, source_for
from airflow_provider_dblog.tailer import tune_gc

CHUNK_SIZE = 10_000
PARALLELISM = 2


def prepare(env: Env, kind: str, rows: int) -> str:
    """The bench table with `rows` rows; its name as a source lists it."""
    if kind == "postgres":
        env.sql("CREATE TABLE public.ro_rows (id bigint PRIMARY KEY, name text, n int, v numeric)")
        env.sql(
            "INSERT INTO ro_rows SELECT i, 'name-' || i, i %% 1000, i / 7.0"
            " FROM generate_series(1, %s) AS i",
            (rows,),
        )
        env.sql("CREATE PUBLICATION ro_read_only FOR TABLE ro_rows")  # as the owner would
        return "public.ro_rows"
    env.mariadb_one(
        "CREATE TABLE ro_rows (id bigint PRIMARY KEY, name varchar(64), n int, v decimal(20,6))"
    )
    env.mariadb_one(
        f"INSERT INTO ro_rows SELECT seq, concat('name-', seq), seq % 1000, seq / 7"
        f" FROM seq_1_to_{rows}"
    )
    return "ro_rows"


def dump_rate(
    env: Env,
    kind: str,
    table: str,
    read_only: bool,
    run: int,
    primary: int,
    replica: str | None = None,
) -> tuple[float, float, float]:
    """Rows/s of one full dump of the table, a tailer of the source's own running; the CPU
    seconds a million rows of the server process `primary` and its children, and theirs over
    as long a time right after, the tailer idle and no dump running."""
    mode = "replica" if replica else "read_only" if read_only else "written"
    name = f"ro_{kind}_{mode}"
    section = {**env.source_section(name, [table], kind), "read_only": read_only}
    if kind == "postgres":
        section["publication"] = "ro_read_only" if read_only else name
    if replica is not None:
        section["read_replica"] = replica
    source = source_for(parse_source_config(section))
    source.ensure_setup()
    store = env.store(name)
    output = TimedNdjson(env.base / f"{name}-{run}")
    with RunningTailer(env, source, output) as tailer:
        wait_until(lambda: store.tailer.health() is not None, 60, "the tailer leading")
        dump_id = f"d{run}"
        store.dumps.create(
            DumpRequest(
                dump_id,
                DumpKind.TABLE,
                source.tables,
                chunk_size=CHUNK_SIZE,
                parallelism=PARALLELISM,
            )
        )
        cpu_before = tree_cpu_s(primary)
        started = time.monotonic()
        state = run_dump(store, source.chunk_source, dump_id)
        seconds = time.monotonic() - started
        cpu = tree_cpu_s(primary) - cpu_before
        assert state == "done", f"the dump ended {state}"
        idle_before = tree_cpu_s(primary)
        time.sleep(seconds)  # a measurement span, not a wait for anything
        idle_cpu = tree_cpu_s(primary) - idle_before
        assert tailer.alive()
    status = store.dumps.status(dump_id)
    assert status is not None
    return status.rows / seconds, cpu / status.rows * 1e6, idle_cpu / status.rows * 1e6


def start_replica(
    stack: contextlib.ExitStack,
    kind: str,
    pg: PostgresServer,
    mariadb: MariaDBServer,
    base: Path,
) -> str:
    """A replica of the bench's server of `kind` (a hot standby, or a GTID replica), caught
    up; the DSN a source's `read_replica` gives it."""
    if kind == "postgres":
        standby = stack.enter_context(PostgresReplica(pg, base / "pg-replica")).info
        standby.wait_caught_up()
        return (
            f"host={standby.host} port={standby.port} dbname={pg.info.dbname} user={pg.info.user}"
        )
    replica = stack.enter_context(MariaDBReplica(mariadb, base / "mariadb-replica")).info
    replica.wait_caught_up()
    return f"mysql://{mariadb.info.user}@{replica.host}:{replica.port}/{mariadb.info.dbname}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=300_000, help="rows in the bench table")
    parser.add_argument("--runs", type=int, default=3, help="runs of each mode, alternating")
    parser.add_argument("--only", choices=("postgres", "mariadb"), help="one database only")
    parser.add_argument("--quick", action="store_true", help="5,000 rows, one run of each")
    args = parser.parse_args(argv)
    if args.quick:
        args.rows, args.runs = 5_000, 1
    tune_gc()
    load_before = load_average()
    kinds = [args.only] if args.only else ["postgres", "mariadb"]
    lines = ["", f"{'source':<10} {'written rows/s':>15} {'read-only rows/s':>17} {'ratio':>7}"]
    with (
        tempfile.TemporaryDirectory(prefix="dblog-bench-ro-") as tmp,
        contextlib.ExitStack() as stack,
    ):
        base = Path(tmp)
        say(f"starting the servers in {base}")
        pg = stack.enter_context(PostgresServer(base / "pg"))
        mariadb = stack.enter_context(MariaDBServer(base / "mariadb"))
        rds = stack.enter_context(RedisServer(base / "redis"))
        env = Env(base, pg.info, rds.info, mariadb.info)
        cpu_lines: list[str] = []
        for kind in kinds:
            table = prepare(env, kind, args.rows)
            server = pg if kind == "postgres" else mariadb
            assert server.pid is not None
            best = {False: 0.0, True: 0.0}
            primary_cpu = {False: (0.0, 0.0), True: (0.0, 0.0)}
            for run in range(args.runs):
                for read_only in (False, True):
                    rate, cpu, idle = dump_rate(env, kind, table, read_only, run, server.pid)
                    mode = "read-only" if read_only else "written"
                    say(f"{kind} {mode} run {run + 1}: {rate:,.0f} rows/s")
                    best[read_only] = max(best[read_only], rate)
                    primary_cpu[read_only] = cpu, idle
            ratio = best[True] / best[False]
            lines.append(f"{kind:<10} {best[False]:>15,.0f} {best[True]:>17,.0f} {ratio:>7.3f}")
            dsn = start_replica(stack, kind, pg, mariadb, base)
            rate, cpu, idle = dump_rate(env, kind, table, True, args.runs, server.pid, dsn)
            on_primary, idle_primary = primary_cpu[True]
            cpu_lines += [
                f"{kind} primary CPU s a million rows dumped (read-only; the same span "
                "with no dump; the dump's share):",
                f"  reading the primary: {on_primary:.2f}; {idle_primary:.2f}; "
                f"{on_primary - idle_primary:.2f}",
                f"  reading the replica: {cpu:.2f}; {idle:.2f}; {cpu - idle:.2f} "
                f"({rate:,.0f} rows/s there)",
            ]
    print("\n".join(lines + cpu_lines))
    print(f"\n{args.rows:,} rows, chunk size {CHUNK_SIZE:,}, parallelism {PARALLELISM}")
    print(f"load average (1, 5, 15 min): {load_before} at the start, {load_average()} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
