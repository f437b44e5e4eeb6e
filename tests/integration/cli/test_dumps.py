"""The dump commands through the `dblog` executable: `dump` (with `--parallelism`,
`--max-rows-per-s`, `--dump-id`, `--resume` and `--where`), `status`, `pause`, `resume`,
`cancel` and `throttle`, against a running `dblog tail`, each command a subprocess reading a
TOML file and its passwords from the environment.

What a control did is read from Redis (the dump's status and progress). A throttle's effect is
shown by a lower bound on time, which the dump's own waits guarantee: it holds on any machine,
and the same dump without the throttle takes a fraction of it.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path

import psycopg
import pytest

from airflow_provider_dblog.config import load_config
from airflow_provider_dblog.core.dump_plan import DumpKind, DumpRequest
from airflow_provider_dblog.core.errors import InvalidRequest
from airflow_provider_dblog.core.event import TableRef
from airflow_provider_dblog.devservices.postgres import PostgresInfo
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.dump.request import build_request
from airflow_provider_dblog.state import DumpStatus, StateStore, WindowStatus
from airflow_provider_dblog.state.keys import SourceKeys
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
ROWS = 600
"""Rows per table, written before capture starts; no other writes, so a dump reads each once."""
SLOW = 40
"""Rows per second of a dump that a `dblog` command must catch mid-run: a command's start-up on
a busy machine takes seconds, so the dump leaves it many."""


@dataclass
class Cli:
    """A source with `dblog tail` running on it, and what a `dblog` command needs."""

    dbs: Databases
    store: StateStore
    redis: RedisInfo
    config: Path
    env: dict[str, str]
    work: Path

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return run_cli(args[0], "-c", str(self.config), *args[1:], env=self.env)

    def status(self, dump_id: str) -> DumpStatus:
        status = self.store.dumps.status(dump_id)
        assert status is not None, f"no dump {dump_id}"
        return status

    def chunks(self, dump_id: str) -> int:
        status = self.store.dumps.status(dump_id)
        return 0 if status is None else status.chunks

    def now_ms(self) -> int:
        """Redis's clock, the one the dump's status times come from."""
        seconds, micros = self.redis.client().time()
        return int(seconds) * 1000 + int(micros) // 1000


@pytest.fixture
def cli(pg15: PostgresInfo, redis_server: RedisInfo, tmp_path: Path) -> Iterator[Cli]:
    dbs = make_databases(pg15, ROWS, target=False, seed_value=random.randrange(1 << 30))
    config = write_config(
        tmp_path / "dblog.toml",
        dbs,
        redis_server,
        {"type": "ndjson", "directory": str(tmp_path / "events")},
        {"heartbeat_s": 0.2},
    )
    env = cli_env(dbs, redis_server)
    store = StateStore(redis_server.client(), dbs.config.name)
    tail = TailProcess(config, "cli-tailer", env, tmp_path / "tail.log")
    try:
        wait_until(
            lambda: (h := store.tailer.health()) is not None and h.owner == "cli-tailer",
            30,
            "dblog tail beating",
        )
        yield Cli(dbs, store, redis_server, config, env, tmp_path)
        assert tail.stop() == 0, (tmp_path / "tail.log").read_text()[-3000:]
    finally:
        if tail.alive():
            tail.kill()
        drop_databases(dbs)


class DumpProcess:
    """`dblog dump ARGS` running in the background, its output in a file."""

    def __init__(self, cli: Cli, dump_id: str, *args: str) -> None:
        self.log = cli.work / f"dump-{dump_id}.log"
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [DBLOG, "dump", "-c", str(cli.config), "--dump-id", dump_id, *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=cli.env,
            )

    def running(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"dblog dump exited early: {self.output()}")
        return True

    def wait(self) -> int:
        return self.process.wait(120)

    def output(self) -> str:
        return self.log.read_text()

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(30)


def said(done: subprocess.CompletedProcess[str]) -> str:
    return done.stdout + done.stderr


UNREADABLE_ITEMS = """
CREATE FUNCTION unreadable() RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'items is unreadable' USING HINT = 'the test made it so'; END $$;
CREATE POLICY unreadable ON items USING (unreadable());
ALTER TABLE items ENABLE ROW LEVEL SECURITY;
ALTER TABLE items FORCE ROW LEVEL SECURITY;
"""
"""Makes every read of `items` by its owner fail with a two-line error (a chunk reads the
table's columns afresh, so an ALTER no longer breaks a dump)."""


def test_status_pause_and_a_failed_dump_resumed_with_resume(cli: Cli) -> None:
    """`dblog status` shows the tailer and each dump, a failed dump's multi-line database error
    cut to its first line (`--dump ID` shows it whole, `--json` gives it to scripts). A paused
    dump reads no chunk while its process keeps looking at the controls. The failed dump is
    refused by id alone with a message naming `--resume`, resumes with it after its last
    completed chunk (every row read once), and once done cannot be resumed."""
    shown = cli.run("status")
    assert shown.returncode == 0, said(shown)
    lines = shown.stdout.splitlines()
    assert lines[0].startswith("tailer: cli-tailer, heartbeat"), lines
    assert lines[1].split()[:2] == ["dump", "state"] and len(lines) == 2, lines

    dump = DumpProcess(cli, "broken", "--table", "public.items", "--chunk-size", "50",
                       "--max-rows-per-s", str(SLOW))  # fmt: skip
    try:
        wait_until(lambda: dump.running() and cli.chunks("broken") >= 2, 60, "two chunks")
        paused = cli.run("pause", "broken")
        assert paused.returncode == 0, said(paused)
        wait_until(lambda: cli.status("broken").state == "paused", 30, "the dump pausing")
        at_pause = cli.status("broken")
        progress = cli.store.dumps.load_progress("broken")
        # The paused dump marks itself paused each time it reads its controls: a second of
        # those marks is a second in which it was free to read a chunk and did not.
        wait_until(
            lambda: cli.status("broken").updated_ms >= at_pause.updated_ms + 1000,
            30,
            "the paused dump reading its controls for a second",
        )
        held = cli.status("broken")
        assert (held.state, held.chunks, held.rows) == ("paused", at_pause.chunks, at_pause.rows)
        assert cli.store.dumps.load_progress("broken") == progress

        with psycopg.connect(cli.dbs.source_dsn, autocommit=True) as conn:
            conn.execute(UNREADABLE_ITEMS)
        resumed = cli.run("resume", "broken")
        assert resumed.returncode == 0, said(resumed)
        assert dump.wait() == 1, dump.output()
    finally:
        dump.kill()
    failed = cli.status("broken")
    assert failed.state == "failed" and failed.chunks == at_pause.chunks, failed
    # PostgreSQL's error, its hint on a line of its own.
    assert "RaiseException" in failed.reason and "\nHINT:" in failed.reason, failed.reason

    shown = cli.run("status")
    assert shown.returncode == 0, said(shown)
    lines = shown.stdout.splitlines()
    assert len(lines) == 4, lines
    assert lines[2].split()[:3] == ["broken", "failed", str(at_pause.chunks)], lines
    assert "RaiseException" in lines[2] and "HINT" not in shown.stdout, lines
    assert lines[3] == "(the whole reason: dblog status --dump broken)", lines
    detail = cli.run("status", "--dump", "broken")
    assert detail.returncode == 0, said(detail)
    assert "\n    HINT:" in detail.stdout and "public.items: " in detail.stdout, detail.stdout
    as_json = json.loads(cli.run("status", "--json").stdout)
    assert as_json["tailer"]["owner"] == "cli-tailer", as_json
    assert [(d["dump_id"], d["state"]) for d in as_json["dumps"]] == [("broken", "failed")]
    assert as_json["dumps"][0]["reason"] == failed.reason

    with psycopg.connect(cli.dbs.source_dsn, autocommit=True) as conn:
        conn.execute("ALTER TABLE items NO FORCE ROW LEVEL SECURITY")
    refused = cli.run("dump", "--dump-id", "broken")
    assert refused.returncode == 1, said(refused)
    assert "broken is failed" in refused.stderr, said(refused)
    assert "dblog dump --dump-id broken --resume" in refused.stderr, said(refused)
    assert "\nHINT" not in refused.stderr, "the reason is on one line"
    assert cli.status("broken").state == "failed"

    again = cli.run("dump", "--dump-id", "broken", "--resume", "--max-rows-per-s", "0")
    assert again.returncode == 0, said(again)
    done = cli.status("broken")
    assert done.state == "done" and done.reason == "", done
    assert done.rows == ROWS, "the resumed dump read every row exactly once"
    assert done.chunks == ROWS // 50

    for args in (["dump", "--dump-id", "broken", "--resume"], ["dump", "--dump-id", "broken"]):
        finished = cli.run(*args)
        assert finished.returncode == 1, said(finished)
        assert "broken is done: there is nothing left to resume" in finished.stderr
    assert cli.status("broken").chunks == ROWS // 50
    late = cli.run("pause", "broken")
    assert late.returncode == 1 and "finished or unknown" in late.stderr, said(late)
    unknown = cli.run("dump", "--dump-id", "nope", "--resume")
    assert unknown.returncode == 2, said(unknown)
    assert "no dump nope to resume" in unknown.stderr
    assert cli.store.dumps.ids() == ["broken"]


def dump_windows(cli: Cli, dump_id: str) -> list[WindowStatus]:
    """Every window of the dump still in Redis (they outlive the chunk by their TTL)."""
    found = (cli.store.windows.state(w) for w in cli.store.windows.ids())
    return [s for s in found if s is not None and s.window.dump_id == dump_id]


def most_at_once(windows: Sequence[WindowStatus]) -> int:
    """The most windows open at one moment, each from its registration to its end (its last
    update); one that ends as another registers does not overlap it."""
    moments = sorted(
        [(w.registered_ms, 1) for w in windows] + [(w.updated_ms, -1) for w in windows]
    )
    return max(accumulate(change for _, change in moments), default=0)


def test_status_shows_a_dumps_filter_line_by_line(cli: Cli) -> None:
    """A filtered dump's `dblog status --dump ID` shows its filter under its request, each of
    its lines aligned; `--json` gives it to scripts; the dump read only the matching rows.
    It is read-only (`--read-only`) on a source that may be written: its watermark row is
    never written (same value, same row version), its windows were armed by the tailer, and
    the request says so; `--read-only` is refused for a direct dump and on a writing dump."""
    where = "active\n  AND id % 7 = 0"
    watermark = "SELECT xmin::text, value FROM dblog.watermark"
    with psycopg.connect(cli.dbs.source_dsn) as conn:
        before = conn.execute(watermark).fetchall()
    done = cli.run("dump", "--dump-id", "filtered", "--table", "public.accounts", "--where",
                   where, "--read-only")  # fmt: skip
    assert done.returncode == 0, said(done)
    with psycopg.connect(cli.dbs.source_dsn) as conn:
        assert conn.execute(watermark).fetchall() == before
    keys, client = SourceKeys(cli.dbs.config.name), cli.redis.client()
    windows = [keys.window(w.window.window_id) for w in dump_windows(cli, "filtered")]
    assert windows and all(client.hget(w, "armed_at") for w in windows), windows
    with psycopg.connect(cli.dbs.source_dsn) as conn:
        (matching,) = conn.execute(f"SELECT count(*) FROM accounts WHERE {where}").fetchone() or (
            0,
        )
    assert 0 < matching < ROWS // 7
    assert cli.status("filtered").rows == matching
    detail = cli.run("status", "--dump", "filtered")
    assert detail.returncode == 0, said(detail)
    lines = detail.stdout.splitlines()
    assert lines[1].startswith("  request   table of public.accounts, chunk size"), lines
    assert lines[2:4] == ["  where     active", "              AND id % 7 = 0"], lines
    assert lines[1].endswith(", read-only"), lines
    as_json = json.loads(cli.run("status", "--dump", "filtered", "--json").stdout)
    assert as_json["request"]["where"] == where and as_json["request"]["keys"] == []
    assert as_json["request"]["read_only"] is True
    chunks = cli.dbs.source.chunk_source(read_only=True)
    try:  # what `dblog dump --read-only --mode direct` asks, in this process: quicker
        with pytest.raises(InvalidRequest, match="a read-only dump is sequenced"):
            build_request(load_config(cli.config), chunks, dump_id="direct", tables=None,
                          keys=None, chunk_size=None, parallelism=1, mode="direct")  # fmt: skip
    finally:
        chunks.close()
    cli.store.dumps.create(DumpRequest("writes", DumpKind.TABLE, (TableRef("public", "items"),)))
    again = cli.run("dump", "--dump-id", "writes", "--read-only")
    assert again.returncode == 2 and "dump writes writes watermarks" in again.stderr, said(again)


def test_a_role_that_may_not_write_the_watermark_is_told_to_grant_it_or_dump_read_only(
    cli: Cli,
) -> None:
    """A dump whose role lost UPDATE on the watermark table fails at its first chunk with one
    line naming the table and the two ways out, not a driver's traceback."""
    with psycopg.connect(cli.dbs.source_dsn, autocommit=True) as conn:
        conn.execute("REVOKE UPDATE ON dblog.watermark FROM CURRENT_USER")
    try:
        denied = cli.run("dump", "--dump-id", "denied", "--table", "public.items")
    finally:
        with psycopg.connect(cli.dbs.source_dsn, autocommit=True) as conn:
            conn.execute("GRANT UPDATE ON dblog.watermark TO CURRENT_USER")
    assert denied.returncode == 2, said(denied)  # a configuration error
    assert "may not write its watermark table dblog.watermark" in denied.stderr, said(denied)
    assert "dblog dump --read-only" in denied.stderr and "Traceback" not in denied.stderr
    assert cli.status("denied").state == "failed"


def test_parallelism_and_max_rows_per_s(cli: Cli) -> None:
    """`--parallelism 3` reads three chunks at a time (never more than three windows open at
    once, and three at some moment) and `--max-rows-per-s` holds the dump to that rate over
    the whole run."""
    dump = DumpProcess(cli, "wide", "--table", "public.accounts", "--chunk-size", "20",
                       "--parallelism", "3", "--max-rows-per-s", "300")  # fmt: skip
    try:
        wait_until(lambda: dump.process.poll() is not None, 60, "the dump ending")
    finally:
        dump.kill()
    assert dump.process.returncode == 0, dump.output()
    status = cli.status("wide")
    assert (status.state, status.rows, status.chunks) == ("done", ROWS, ROWS // 20), status
    windows = dump_windows(cli, "wide")
    assert len(windows) == ROWS // 20, windows  # no window failed: one a chunk
    assert most_at_once(windows) == 3, windows
    stored = cli.store.dumps.get("wide")
    assert stored is not None and stored.request.parallelism == 3
    assert status.started_ms is not None and status.finished_ms is not None
    assert status.finished_ms - status.started_ms >= 1000 * ROWS / 300


def test_cancel_stops_the_dump_and_resume_finishes_it(cli: Cli) -> None:
    """`dblog cancel` ends the dump after its current chunk (the process exits 1, the dump is
    cancelled short of its end); controls on it are refused; it is resumed only with
    `--resume`, after its last chunk."""
    dump = DumpProcess(cli, "stop", "--table", "public.accounts", "--chunk-size", "20",
                       "--max-rows-per-s", str(SLOW))  # fmt: skip
    try:
        wait_until(lambda: dump.running() and cli.chunks("stop") >= 3, 60, "three chunks")
        cancelled = cli.run("cancel", "stop")
        assert cancelled.returncode == 0, said(cancelled)
        assert "cancel requested" in cancelled.stdout
        assert dump.wait() == 1, dump.output()
    finally:
        dump.kill()
    assert "dump stop: cancelled" in dump.output()
    status = cli.status("stop")
    assert status.state == "cancelled" and 3 <= status.chunks < ROWS // 20, status
    for control in (["pause", "stop"], ["throttle", "stop", "--delay-ms", "5"]):
        refused = cli.run(*control)
        assert refused.returncode == 1 and "finished or unknown" in refused.stderr, said(refused)

    refused = cli.run("dump", "--dump-id", "stop")
    assert refused.returncode == 1, said(refused)
    assert "stop is cancelled" in refused.stderr and "--resume" in refused.stderr
    assert cli.status("stop").chunks == status.chunks

    again = cli.run("dump", "--dump-id", "stop", "--resume", "--max-rows-per-s", "0")
    assert again.returncode == 0, said(again)
    done = cli.status("stop")
    assert (done.state, done.rows, done.chunks) == ("done", ROWS, ROWS // 20), done


def test_throttle_applies_from_the_next_chunk(cli: Cli) -> None:
    """`dblog throttle` on a paused dump: after `resume` its chunks have the new size and wait
    the new delay; a second throttle sets a rate that holds the rest of the dump. The dump runs
    slowly enough between a `dblog pause` and its taking hold (a CLI process starting, seconds
    on a loaded machine) that plenty of rows are left for the second throttle to show on."""
    dump = DumpProcess(cli, "pace", "--table", "public.accounts", "--chunk-size", "10",
                       "--max-rows-per-s", "10")  # fmt: skip
    try:
        wait_until(lambda: dump.running() and cli.chunks("pace") >= 2, 60, "two chunks")
        before = pause(cli, "pace")
        assert before.rows == 10 * before.chunks

        changed = cli.run("throttle", "pace", "--chunk-size", "50", "--delay-ms", "3000",
                          "--max-rows-per-s", "0")  # fmt: skip
        assert changed.returncode == 0, said(changed)
        controls = cli.store.dumps.controls("pace")
        assert controls is not None
        assert (controls.chunk_size, controls.delay_ms, controls.max_rows_per_s) == (50, 3000, None)
        resumed_at = cli.now_ms()
        assert cli.run("resume", "pace").returncode == 0
        wait_until(
            lambda: dump.running() and cli.chunks("pace") >= before.chunks + 2, 60, "2 chunks"
        )
        # Two chunks have a wait of the new delay between them.
        assert cli.now_ms() - resumed_at >= 3000
        middle = pause(cli, "pace")
        assert middle.rows - before.rows == 50 * (middle.chunks - before.chunks)
        left = ROWS - middle.rows
        assert left >= 100, "the first throttle left too little to see the second"

        changed = cli.run("throttle", "pace", "--delay-ms", "0", "--max-rows-per-s", "200")
        assert changed.returncode == 0, said(changed)
        resumed_at = cli.now_ms()
        assert cli.run("resume", "pace").returncode == 0
        assert dump.wait() == 0, dump.output()
    finally:
        dump.kill()
    done = cli.status("pace")
    assert (done.state, done.rows) == ("done", ROWS), done
    assert done.chunks - middle.chunks == -(-left // 50)
    assert done.finished_ms is not None and done.finished_ms - resumed_at >= 1000 * left / 200


def pause(cli: Cli, dump_id: str) -> DumpStatus:
    """`dblog pause` and wait until the dump holds; its status then."""
    paused = cli.run("pause", dump_id)
    assert paused.returncode == 0, said(paused)
    wait_until(lambda: cli.status(dump_id).state == "paused", 30, f"{dump_id} pausing")
    return cli.status(dump_id)


def test_a_killed_dump_resumes_by_id_after_its_last_completed_chunk(cli: Cli) -> None:
    """`dblog dump` SIGKILLed between chunks (in its rate limit's wait) and run again with the
    same `--dump-id`: no `--resume` needed for a dump that never finished; it reads only the
    chunks after the last one it completed (rows and chunks counted once)."""
    dump = DumpProcess(cli, "killed", "--table", "public.accounts", "--chunk-size", "20",
                       "--max-rows-per-s", str(SLOW))  # fmt: skip
    try:
        # Each chunk of 20 rows is followed by a wait of about half a second: the chunk count
        # moving means the dump has just entered that wait.
        wait_until(lambda: dump.running() and cli.chunks("killed") >= 2, 60, "two chunks")
    finally:
        dump.kill()
    at_kill = cli.status("killed")
    assert at_kill.state == "running" and at_kill.chunks < ROWS // 20, at_kill

    again = cli.run("dump", "--dump-id", "killed", "--max-rows-per-s", "0")
    assert again.returncode == 0, said(again)
    done = cli.status("killed")
    assert (done.state, done.rows, done.chunks) == ("done", ROWS, ROWS // 20), done
    progress = cli.store.dumps.load_progress("killed")
    assert [(p.chunks_done, p.rows_done, p.done) for p in progress.values()] == [
        (ROWS // 20, ROWS, True)
    ]
