"""Ctrl-C (SIGINT) ends a `dblog` command with one line and exit status 130, no traceback, and
leaves what it stored resumable: a dump and a verify run interrupted mid-chunk (the tailer
stopped, so the chunk's window waits) run on to their end by id, the target then equal to the
source; `dblog tail` interrupted while it starts (its imports take seconds on a busy machine)
says one line too. Each command is a subprocess, sent the signal as a terminal sends it."""

from __future__ import annotations

import random
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from airflow_provider_dblog.devservices.postgres import PostgresInfo
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.state import DumpState, StateStore, VerifyState
from tests.deadlines import deadline_s
from tests.integration.e2e_support import (
    DBLOG,
    Databases,
    TailProcess,
    cli_env,
    drop_databases,
    make_databases,
    run_cli,
    wait_until,
    write_config,
)

pytestmark = pytest.mark.integration
ROWS = 200
"""Rows per table (three tables), written before capture starts."""
CHUNK = 25
TARGET_DSN_ENV = "E2E_TARGET_DSN"


@dataclass
class Deployment:
    dbs: Databases
    store: StateStore
    config: Path
    env: dict[str, str]
    tail: TailProcess

    def start(self, *args: str) -> subprocess.Popen[str]:
        """`dblog ARGS` in the background, its output in pipes."""
        return subprocess.Popen(
            [DBLOG, args[0], "-c", str(self.config), *args[1:]],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=self.env,
        )

    def open_window_of(self, run_id: str) -> bool:
        """Whether a chunk of the dump or verify run `run_id` waits in an open window."""
        found = (self.store.windows.state(w) for w in self.store.windows.ids())
        return any(s.window.dump_id == run_id and not s.state.ended for s in found if s)

    def restart_tailer(self) -> None:
        before = self.store.tailer.health()
        self.tail.start()
        wait_until(
            lambda: (h := self.store.tailer.health()) is not None and h != before,
            60,
            "the tailer beating again",
        )


@pytest.fixture
def deployment(pg15: PostgresInfo, redis_server: RedisInfo, tmp_path: Path) -> Iterator[Deployment]:
    """A source, an SQL target the tailer applies into, and the tailer running."""
    dbs = make_databases(pg15, ROWS, target=True, seed_value=random.randrange(1 << 30))
    output = {"type": "sql_apply", "dsn_env": TARGET_DSN_ENV}
    tailer = {"heartbeat_s": 0.2, "lease_ttl_ms": 3000}
    config = write_config(tmp_path / "dblog.toml", dbs, redis_server, output, tailer)
    env = cli_env(dbs, redis_server, **{TARGET_DSN_ENV: dbs.target_dsn})
    store = StateStore(redis_server.client(), dbs.config.name)
    tail = TailProcess(config, "interrupted-tailer", env, tmp_path / "tail.log")
    try:
        wait_until(lambda: store.tailer.health() is not None, 60, "the tailer beating")
        yield Deployment(dbs, store, config, env, tail)
    finally:
        tail.stop()
        drop_databases(dbs)


def interrupted(process: subprocess.Popen[str]) -> tuple[int, list[str]]:
    """SIGINT to `process`: its exit status and the lines of its stderr."""
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=deadline_s(30))
    return process.returncode, err.splitlines()


def test_a_dump_and_a_verify_interrupted_mid_chunk_say_one_line_and_resume_by_id(
    deployment: Deployment,
) -> None:
    d = deployment
    total_chunks = 3 * (ROWS // CHUNK)
    dump = d.start("dump", "--dump-id", "cut", "--chunk-size", str(CHUNK),
                   "--max-rows-per-s", "50")  # fmt: skip
    try:

        def two_chunks() -> bool:
            status = d.store.dumps.status("cut")
            return status is not None and status.chunks >= 2

        wait_until(two_chunks, 60, "two chunks dumped")
        assert d.tail.stop() == 0
        wait_until(lambda: d.open_window_of("cut"), 60, "a chunk waiting for the tailer")
        code, said = interrupted(dump)
    finally:
        dump.kill()
    assert code == 130, said
    assert said == ["dblog dump: interrupted; resume with: dblog dump --dump-id cut"]
    at_interrupt = d.store.dumps.status("cut")
    assert at_interrupt is not None and at_interrupt.state is DumpState.RUNNING, at_interrupt
    assert 2 <= at_interrupt.chunks < total_chunks, at_interrupt

    d.restart_tailer()
    resumed = run_cli("dump", "-c", str(d.config), "--dump-id", "cut", env=d.env)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr[-3000:]
    done = d.store.dumps.status("cut")
    assert done is not None
    assert (done.state, done.rows, done.chunks) == (DumpState.DONE, 3 * ROWS, total_chunks)

    assert d.tail.stop() == 0
    verify = d.start("verify", "--verify-id", "check", "--chunk-size", str(CHUNK))
    try:
        wait_until(lambda: d.open_window_of("check"), 60, "a verify chunk waiting")
        code, said = interrupted(verify)
    finally:
        verify.kill()
    assert code == 130, said
    assert said == ["dblog verify: interrupted"]
    stopped = d.store.verifies.status("check")
    assert stopped is not None and stopped.state is VerifyState.RUNNING, stopped

    d.restart_tailer()
    verified = run_cli("verify", "-c", str(d.config), "--verify-id", "check", env=d.env)
    assert verified.returncode == 0, verified.stdout + verified.stderr[-3000:]
    assert "Traceback" not in verified.stderr
    status = d.store.verifies.status("check")
    assert status is not None and status.state is VerifyState.DONE, status
    checked = sum(c["checked"] for c in d.store.verifies.counts("check").values())
    assert checked == 3 * ROWS, "the target equals the source, every row checked once"


def loaded(pid: int, library: str) -> bool:
    """Whether the process `pid` has mapped a shared library whose name has `library`."""
    try:
        return library in Path(f"/proc/{pid}/maps").read_text()
    except FileNotFoundError:
        return True  # it ended: `interrupted` says how


def test_a_tailer_interrupted_while_it_starts_says_one_line(deployment: Deployment) -> None:
    """Hiredis loads with the commands' imports, after `main` has set the handler: the signal
    lands in those imports (`dblog: tail interrupted`, 130), or, on a fast machine, once the
    tailer runs, which stops it as SIGTERM does (its own last line, 0). Never a traceback."""
    d = deployment
    assert d.tail.stop() == 0
    tail = d.start("tail", "--owner", "second")
    try:
        wait_until(lambda: loaded(tail.pid, "hiredis"), 60, "the commands' imports begun",
                   interval_s=0.005)  # fmt: skip
        code, said = interrupted(tail)
    finally:
        tail.kill()
    assert not any("Traceback" in line for line in said), said
    if code == 130:
        assert said == ["dblog tail: interrupted"]
    else:
        assert code == 0 and "tailer second stopped on SIGINT" in said[-1], (code, said)
