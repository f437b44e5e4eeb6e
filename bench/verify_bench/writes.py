"""A write load on the bench table while a check runs: pgbench (PostgreSQL's own load generator)
or sysbench (MariaDB) in their own processes, updating random even keys, one a transaction, at
a fixed rate, until stopped. The corrupted keys are odd (`corrupt.py`), so every key a check
reports beyond them is a false difference. The rate achieved is counted by the server: the sum
of the column each update increments."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from support import Env

SYSBENCH_SCRIPT = """
function thread_init()
  drv = sysbench.sql.driver()
  con = drv:connect()
end
function thread_done()
  con:disconnect()
end
function event()
  con:query(string.format("UPDATE vrows SET n = n + 1 WHERE id = %d",
                          2 * sysbench.rand.uniform(1, {half})))
end
"""


class WriteLoad:
    """Started on entering, stopped on leaving; `per_s` the updates a second it committed."""

    def __init__(
        self, command: list[str], environment: dict[str, str], updates: Callable[[], int]
    ) -> None:
        self._command = command
        self._environment = environment
        self._updates = updates
        self.per_s = 0.0

    def __enter__(self) -> WriteLoad:
        self._before = self._updates()
        self._started = time.monotonic()
        self._process = subprocess.Popen(
            self._command,
            env=self._environment,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        return self

    def __exit__(self, *_: object) -> None:
        self._process.terminate()
        _, errors = self._process.communicate(timeout=30)
        seconds = time.monotonic() - self._started
        if self._process.returncode not in (0, -15):
            raise RuntimeError(f"bench: the write load failed: {errors.decode()[-2000:]}")
        self.per_s = (self._updates() - self._before) / seconds


def pgbench(env: Env, rows: int, rate: int) -> WriteLoad:
    script = env.base / "writes.sql"
    script.write_text(
        f"\\set id 2 * random(1, {rows // 2})\n"
        "UPDATE public.vrows SET n = n + 1, at = now() WHERE id = :id;\n"
    )
    binary = shutil.which("pgbench")
    if binary is None:
        raise FileNotFoundError("pgbench not found: run scripts/install-system-deps.sh")
    pg = env.pg
    command = [
        binary, "-n", "-f", str(script), "-c", "2", "-j", "1", "-R", str(rate), "-T", "3600",
        "-h", pg.host, "-p", str(pg.port), "-U", pg.user, pg.dbname,
    ]  # fmt: skip
    environment = dict(os.environ, PGPASSWORD=pg.password)
    return WriteLoad(command, environment, lambda: int(env.sql("SELECT sum(n) FROM vrows")))


def sysbench(env: Env, rows: int, rate: int, base: Path) -> WriteLoad:
    info = env.mariadb
    assert info is not None
    binary = shutil.which("sysbench")
    if binary is None:
        raise FileNotFoundError("sysbench not found: run scripts/install-system-deps.sh")
    script = base / "writes.lua"
    script.write_text(SYSBENCH_SCRIPT.replace("{half}", str(rows // 2)))
    options = base / "sysbench.cfg"
    options.write_text(
        "db-driver=mysql\n"
        f"mysql-host={info.host}\nmysql-port={info.port}\nmysql-user={info.user}\n"
        f"mysql-password={info.password}\nmysql-db={info.dbname}\n"
    )
    command = [
        binary, f"--config-file={options}", "--threads=2", f"--rate={rate}", "--time=3600",
        str(script), "run",
    ]  # fmt: skip

    def updates() -> int:
        (total,) = env.mariadb_one("SELECT sum(n) FROM vrows")
        return int(total)

    return WriteLoad(command, dict(os.environ), updates)
