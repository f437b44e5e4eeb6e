"""MySQL users' reference: Percona Toolkit's pt-table-checksum (Debian's `percona-toolkit`) on a
private MariaDB primary and its replica, the replica corrupted as the SQL target is. It
checksums chunks of the table on the primary in statements that replicate, so the replica
checksums the same chunks at the same point of the log; the chunks whose checksums differ are
then listed key by key by pt-table-sync (`--print`, run on nothing). Both run as a user runs
them, the login in an option file."""

from __future__ import annotations

import contextlib
import re
import secrets
import shutil
import subprocess
import time
from typing import Any

import pymysql
from support import Env, step

from airflow_provider_dblog.core.verify import Difference
from airflow_provider_dblog.devservices.mariadb import MariaDBServer
from airflow_provider_dblog.devservices.mariadb_replica import MariaDBReplica, MariaDBReplicaInfo
from verify_bench.corrupt import Corruption, Found
from verify_bench.writes import sysbench

USER = "ptcheck"
_KEY = re.compile(r"`id`\s*=\s*'?(\d+)'?")


def _run(info: Any, statement: str, params: Any = None) -> None:
    with (
        pymysql.connect(**info.admin_connect_kwargs(), autocommit=True) as conn,
        conn.cursor() as cursor,
    ):
        cursor.execute(statement, params)


class Checksum:
    """pt-table-checksum and pt-table-sync on the primary and its replica."""

    def __init__(self, env: Env, primary: MariaDBServer, replica: MariaDBReplicaInfo) -> None:
        self.env = env
        self.replica = replica
        self.port = primary.port
        self.database = env.mariadb.dbname if env.mariadb else ""
        password = secrets.token_hex(16)
        options = env.base / "pt.cnf"
        options.write_text(f"[client]\nuser={USER}\npassword={password}\n")
        options.chmod(0o600)
        self.options = options
        primary_info = primary.info
        _run(primary_info, f"CREATE USER '{USER}'@'%%' IDENTIFIED BY %s", (password,))
        _run(primary_info, f"GRANT ALL ON *.* TO '{USER}'@'%'")
        _run(primary_info, "CREATE DATABASE percona")
        _run(
            primary_info,
            "CREATE TABLE percona.dsns (id int AUTO_INCREMENT PRIMARY KEY, parent_id int,"
            " dsn varchar(255) NOT NULL)",
        )
        _run(primary_info, "INSERT INTO percona.dsns (dsn) VALUES (%s)", (self._dsn(replica.port),))
        replica.wait_replayed(replica.primary_position())

    def _dsn(self, port: int) -> str:
        return f"h=127.0.0.1,P={port},F={self.options}"

    def _tool(self, name: str, *args: str) -> subprocess.CompletedProcess[str]:
        binary = shutil.which(name)
        if binary is None:
            raise FileNotFoundError(f"{name} not found: apt-get install percona-toolkit")
        return subprocess.run(
            [binary, "--no-version-check", *args],
            capture_output=True,
            text=True,
            timeout=3600,
            check=False,
        )

    def checksum(self) -> tuple[float, int, int]:
        """One pt-table-checksum of the table: its seconds, the chunks whose checksums differ,
        and the chunks it checksummed."""
        started = time.monotonic()
        done = self._tool(
            "pt-table-checksum", "--replicate=percona.checksums",
            "--recursion-method=dsn=D=percona,t=dsns", "--no-check-binlog-format",
            f"--databases={self.database}",
            "--tables=vrows", self._dsn(self.port),
        )  # fmt: skip
        seconds = time.monotonic() - started
        lines = done.stdout.splitlines()
        head = next((x.split() for x in lines if x.split()[:1] == ["TS"]), None)
        line = next((x.split() for x in lines if x.endswith(".vrows")), None)
        if head is None or line is None:
            raise RuntimeError(f"bench: pt-table-checksum failed:\n{done.stdout}{done.stderr}")
        column = dict(zip(head, line, strict=True))
        errors, diffs, chunks = (int(column[c]) for c in ("ERRORS", "DIFFS", "CHUNKS"))
        if errors:
            raise RuntimeError(f"bench: pt-table-checksum had errors:\n{done.stdout}{done.stderr}")
        return seconds, diffs, chunks

    def sync_keys(self) -> tuple[float, Found]:
        """The keys pt-table-sync would write to put the replica right (printed, not run): its
        seconds and the keys, classed by what the replica holds."""
        started = time.monotonic()
        done = self._tool(
            "pt-table-sync", "--print", "--replicate=percona.checksums", "--sync-to-master",
            f"--databases={self.database}", "--tables=vrows", self._dsn(self.replica.port),
        )  # fmt: skip
        seconds = time.monotonic() - started
        if done.returncode not in (0, 2):  # 2: it found differences
            raise RuntimeError(f"bench: pt-table-sync failed:\n{done.stdout}{done.stderr}")
        replaced, deleted = set(), set()
        for line in done.stdout.splitlines():
            match = _KEY.search(line)
            if line.startswith("DELETE") and match:
                deleted.add(int(match.group(1)))
            elif line.startswith(("REPLACE", "INSERT")):
                first = re.search(r"VALUES \('?(\d+)", line)
                if first is not None:
                    replaced.add(int(first.group(1)))
        held = self._replica_holds(replaced)
        found: Found = {(Difference.EXTRA, k) for k in deleted}
        found |= {(Difference.CHANGED if k in held else Difference.MISSING, k) for k in replaced}
        return seconds, found

    def _replica_holds(self, keys: set[int]) -> set[int]:
        if not keys:
            return set()
        listed = ", ".join(str(k) for k in keys)
        with (
            pymysql.connect(**self.replica.admin_connect_kwargs()) as conn,
            conn.cursor() as cursor,
        ):
            cursor.execute(f"SELECT id FROM vrows WHERE id IN ({listed})")
            return {int(row[0]) for row in cursor.fetchall()}

    def corrupt(self, corruption: Corruption) -> None:
        """The replica's rows corrupted as the SQL target's are (`Corruption.apply_sql`)."""
        changed = ", ".join(str(k) for k in corruption.changed)
        missing = ", ".join(str(k) for k in corruption.missing)
        with (
            pymysql.connect(**self.replica.admin_connect_kwargs(), autocommit=True) as conn,
            conn.cursor() as cursor,
        ):
            cursor.execute("SET sql_log_bin = 0")  # the replica's own binlog stays empty
            cursor.execute(
                f"UPDATE vrows SET name = concat(name, '-corrupt') WHERE id IN ({changed})"
            )
            cursor.execute(f"DELETE FROM vrows WHERE id IN ({missing})")
            for key in corruption.extra:
                cursor.execute(
                    "INSERT INTO vrows VALUES (%s, concat('extra-', %s), 0, 0, now(6))",
                    (key, key),
                )


def checksum_part(
    env: Env,
    primary: MariaDBServer,
    stack: contextlib.ExitStack,
    report: Any,
    rows: int,
    rate: int,
) -> None:
    """pt-table-checksum and pt-table-sync on the table equal, corrupted, and under writes."""
    step(f"MariaDB: {rows} rows and a replica")
    env.mariadb_one(
        "CREATE TABLE vrows (id bigint PRIMARY KEY, name varchar(100) NOT NULL, n int NOT NULL,"
        " v decimal(14,4), at datetime(6) NOT NULL)"
    )
    env.mariadb_one(
        "INSERT INTO vrows SELECT seq, concat('name-', seq, repeat('x', seq % 40)), seq % 1000,"
        f" seq / 7, timestamp'2026-01-01 00:00:00' + interval seq second FROM seq_1_to_{rows}"
    )
    env.mariadb_one("SET GLOBAL innodb_flush_log_at_trx_commit = 2", admin=True)
    replica = stack.enter_context(MariaDBReplica(primary, env.base / "mariadb-replica")).info
    replica.wait_caught_up()
    check = Checksum(env, primary, replica)
    seconds, diffs, chunks = check.checksum()
    report.figure(
        f"M1 pt-table-checksum equal: {rows / seconds:.0f} rows/s ({seconds:.1f} s), "
        f"{diffs} of {chunks} chunks differ"
    )
    report.row("MariaDB: pt-table-checksum, equal", seconds, "", f"{diffs} chunks")
    corruption = Corruption.pick(rows, seed=1)
    check.corrupt(corruption)
    seconds, diffs, chunks = check.checksum()
    sync_s, found = check.sync_keys()
    right, other = corruption.judge(found)
    report.figure(
        f"M2 pt-table-checksum corrupted: {rows / seconds:.0f} rows/s ({seconds:.1f} s), {diffs} "
        f"of {chunks} chunks differ; pt-table-sync {sync_s:.1f} s, found {right} of "
        f"{len(corruption)} corrupted keys, {other} other keys"
    )
    report.row(
        "MariaDB: pt-table-checksum, 0.1% corrupted",
        seconds,
        f"{right}/{len(corruption)}",
        str(other),
    )
    with sysbench(env, rows, rate, env.base) as load:
        seconds, diffs, chunks = check.checksum()
        sync_s, found = check.sync_keys()
    right, other = corruption.judge(found)
    report.figure(
        f"M4 pt-table-checksum under writes: {rows / seconds:.0f} rows/s ({seconds:.1f} s), "
        f"{diffs} of {chunks} chunks differ; pt-table-sync {sync_s:.1f} s, found {right} of "
        f"{len(corruption)} corrupted keys, {other} other keys; {load.per_s:.0f} updates/s"
    )
    report.row(
        "MariaDB: pt-table-checksum, writes", seconds, f"{right}/{len(corruption)}", str(other)
    )
