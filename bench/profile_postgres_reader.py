"""Where the PostgreSQL log reader's time goes: `PostgresLogReader` alone (no session, no
writer, no output) reading the backlogs of P1, P1s and P1u on a private PostgreSQL, timed in
CPU seconds and optionally profiled. Set beside the pipeline's figures (bench_pipeline.py), it
splits a tailer's CPU an event into the reader's and the rest's.

    .venv/bin/python bench/profile_postgres_reader.py              # P1, P1s and P1u
    .venv/bin/python bench/profile_postgres_reader.py --only P1u --profile   # and cProfile's top
    DBLOG_PLAIN_PYTHON=1 .venv/bin/python bench/profile_postgres_reader.py   # the plain Python

cProfile sees the compiled reader as one call: profile with `DBLOG_PLAIN_PYTHON=1` to see into
it. Another checkout's reader is measured with `PYTHONPATH=<checkout>`.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import pstats
import sys
import tempfile
import time
from pathlib import Path

from bench_pipeline import inserts_backlog, oltp_backlog
from support import Env, load_average, reader_form

from airflow_provider_dblog.core.lines import LogLines, LogRuns
from airflow_provider_dblog.core.log import Change
from airflow_provider_dblog.devservices.postgres import PostgresServer
from airflow_provider_dblog.devservices.redis import RedisServer
from airflow_provider_dblog.tailer import tune_gc

BACKLOGS = {"P1": (400_000, 1000), "P1s": (200_000, 4), "P1u": (200_000, 0)}
"""Each figure's events and inserts a transaction (0: sysbench's four statements)."""


def read(env: Env, figure: str, profile: cProfile.Profile | None) -> tuple[int, float, float]:
    """The figure's backlog read by the reader alone: (events, wall seconds, CPU seconds)."""
    rows, per_tx = BACKLOGS[figure]
    name = f"profile_{figure.lower()}"
    table, procedure, call = (
        oltp_backlog(env, name, rows) if per_tx == 0 else inserts_backlog(env, name, rows, per_tx)
    )
    source = env.source(name, [f"public.{table}"])
    source.ensure_setup()
    env.sql(procedure)
    env.sql(call)
    reader = source.log_reader()
    read = 0
    started, cpu_started = time.monotonic(), time.thread_time()
    with profile or contextlib.nullcontext():
        for item in reader.items():
            if type(item) is LogLines or type(item) is LogRuns:
                read += len(item)
            elif type(item) is Change:
                read += 1
            if read >= rows:
                break
    cpu, wall = time.thread_time() - cpu_started, time.monotonic() - started
    reader.close()
    env.drop_slot(name)
    return read, wall, cpu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default=",".join(BACKLOGS), help="P1, P1s and/or P1u")
    parser.add_argument("--profile", action="store_true", help="print cProfile's top 20")
    args = parser.parse_args(argv)
    figures = [f for f in args.only.split(",") if f]
    if unknown := [f for f in figures if f not in BACKLOGS]:
        parser.error(f"unknown figure(s) {', '.join(unknown)}: choose of {', '.join(BACKLOGS)}")
    tune_gc()  # as `dblog tail` collects
    load_before = load_average()
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        base = Path(tmp)
        pg = stack.enter_context(PostgresServer(base / "pg"))
        redis = stack.enter_context(RedisServer(base / "redis"))
        env = Env(base, pg.info, redis.info, None)
        for figure in figures:
            profile = cProfile.Profile() if args.profile else None
            events, wall, cpu = read(env, figure, profile)
            print(
                f"{figure} reader alone: {events / wall:,.0f} events/s, "
                f"{cpu * 1e6 / events:.2f} us of CPU an event",
                flush=True,
            )
            if profile is not None:
                pstats.Stats(profile).sort_stats("tottime").print_stats(20)
    print(f"load average (1, 5, 15 min): {load_before} at the start, {load_average()} at the end")
    print(f"PostgreSQL log reader: {reader_form()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
