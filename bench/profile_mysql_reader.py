"""Where the MySQL/MariaDB log reader's time goes: `MysqlLogReader` alone (no tailer, no
output) reading a backlog of inserts on a private MariaDB, timed in CPU seconds and optionally
profiled. By default single-row inserts (each its own rows event after a table map, as OLTP
writes log them); `--batch` rows an INSERT, as P1b heavy writes them (1000: rows events of
about 8 KiB, some fifty rows each).

    .venv/bin/python bench/profile_mysql_reader.py                 # 50k rows of the P1b table
    .venv/bin/python bench/profile_mysql_reader.py --heavy         # P1b heavy's table and rows
    .venv/bin/python bench/profile_mysql_reader.py --heavy --batch 1000   # as P1b heavy logs them
    .venv/bin/python bench/profile_mysql_reader.py --profile       # and cProfile's top functions

Another checkout's reader is measured with `PYTHONPATH=<checkout>`, to compare two readers on
one machine.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path

import pymysql
from bench_pipeline import HEAVY_TABLE, heavy_row

from airflow_provider_dblog.core.event import TableRef
from airflow_provider_dblog.core.lines import LogLines
from airflow_provider_dblog.core.log import Change, Idle
from airflow_provider_dblog.devservices.mariadb import MariaDBServer
from airflow_provider_dblog.sources.mysql.binlog import MysqlLogReader
from airflow_provider_dblog.sources.mysql.config import MysqlSourceConfig
from airflow_provider_dblog.sources.mysql.setup import ensure_setup
from airflow_provider_dblog.tailer import tune_gc

PASSWORD_ENV = "DBLOG_BENCH_PROFILE_PASSWORD"
PLAIN = "CREATE TABLE t (id bigint PRIMARY KEY, name varchar(40), n int, ts datetime(6))"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--heavy", action="store_true", help="P1b heavy's table and rows")
    parser.add_argument(
        "--batch", type=int, default=1, help="rows an INSERT (default 1; 1000 a transaction)"
    )
    parser.add_argument("--profile", action="store_true", help="print cProfile's top 20")
    args = parser.parse_args(argv)
    tune_gc()  # as `dblog tail` collects
    with tempfile.TemporaryDirectory() as tmp, MariaDBServer(Path(tmp)) as server:
        info = server.info
        os.environ[PASSWORD_ENV] = info.password
        with pymysql.connect(**info.connect_kwargs()) as conn, conn.cursor() as cursor:
            cursor.execute(HEAVY_TABLE if args.heavy else PLAIN)
        config = MysqlSourceConfig(
            name="profile",
            dsn=f"mysql://{info.user}@{info.host}:{info.port}/{info.dbname}",
            tables=(TableRef(info.dbname, "p1b_heavy" if args.heavy else "t"),),
            password_env=PASSWORD_ENV,
        )
        ensure_setup(config)
        reader = MysqlLogReader(config, None)
        items = reader.items()
        assert isinstance(next(items), Idle)
        with pymysql.connect(**info.connect_kwargs()) as conn, conn.cursor() as cursor:
            for first in range(1, args.rows + 1, 1000):  # a transaction
                last = min(first + 999, args.rows)
                for start in range(first, last + 1, args.batch):  # an INSERT
                    ids = range(start, min(start + args.batch - 1, last) + 1)
                    if args.heavy:
                        values = ", ".join(["(%s, %s, %s, %s, %s, %s, %s)"] * len(ids))
                        rows = [value for i in ids for value in heavy_row(i)]
                        cursor.execute(f"INSERT INTO p1b_heavy VALUES {values}", rows)
                    else:
                        values = ", ".join(["(%s, %s, %s, UTC_TIMESTAMP(6))"] * len(ids))
                        rows = [value for i in ids for value in (i, f"name-{i}", i % 1000)]
                        cursor.execute(f"INSERT INTO t VALUES {values}", rows)
                conn.commit()
        profile = cProfile.Profile() if args.profile else None
        read = 0
        started, cpu = time.monotonic(), time.process_time()
        if profile is not None:
            profile.enable()
        for item in items:
            if isinstance(item, Change | LogLines):
                read += len(item) if isinstance(item, LogLines) else 1
                if read >= args.rows:
                    break
        if profile is not None:
            profile.disable()
        seconds, cpu = time.monotonic() - started, time.process_time() - cpu
        reader.close()
    one, five, fifteen = os.getloadavg()
    print(
        f"{read} rows in {seconds:.2f} s ({read / seconds:,.0f} rows/s), {cpu:.2f} CPU s "
        f"({read / cpu:,.0f} rows per CPU second, {cpu / read * 1e6:.1f} µs a row); "
        f"load {one:.2f} {five:.2f} {fifteen:.2f}"
    )
    if profile is not None:
        pstats.Stats(profile).sort_stats("tottime").print_stats(20)
    return 0


if __name__ == "__main__":
    sys.exit(main())
