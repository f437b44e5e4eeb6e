"""A verify run's controls and its parallel chunks on real servers: a PostgreSQL source, its
tailer applying into a PostgreSQL SQL target corrupted behind its back (`corrupt_target`), the
writer stopped so that every key is checked once and the counts are exact.

A run paused from another process verifies no chunk until resumed and shows as paused; a
throttle changes its chunk size and rate; a cancelled run ends cancelled in one line, its
Airflow trigger, operator and sensor saying so without a retry, and resumes when run again; a
run of several chunks in flight, killed and resumed, counts each key once; those chunks are in
flight together, each in windows of its own; equal chunks are summed by the servers, and only
the chunks holding a corrupted key are read as rows. In the store alone: a run no process runs is
cancelled at once, one a process runs when that process sees it, and a cancelled run reopened
runs again with its pause and cancel cleared."""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple, cast

import pytest
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from airflow_provider_dblog.config import Config, load_config
from airflow_provider_dblog.core.dump_plan import Chunk
from airflow_provider_dblog.core.event import Key
from airflow_provider_dblog.core.position import Position
from airflow_provider_dblog.core.verify import ChunkSum, RowsRead
from airflow_provider_dblog.devservices.postgres import PostgresInfo
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.operators.verify import DBLogVerifyOperator
from airflow_provider_dblog.sensors.verify import DBLogVerifySensor
from airflow_provider_dblog.sources.base import Source
from airflow_provider_dblog.sources.factory import source_for
from airflow_provider_dblog.state import StateStore, VerifyState
from airflow_provider_dblog.triggers.verify import DBLogVerifyTrigger
from airflow_provider_dblog.verify.reader import RowsTarget, SumsTarget, TargetReader
from airflow_provider_dblog.verify.request import VerifyRequest, build_verify_request
from airflow_provider_dblog.verify.runner import Slot, run_verify
from airflow_provider_dblog.verify.targets import target_reader_for
from tests.integration.airflow_support import dblog_connection
from tests.integration.e2e_support import DBLOG, Databases, run_cli, wait_caught_up, wait_until
from tests.integration.verify.deployment import Deployment, running_deployment
from tests.integration.verify.test_verify_cli import (
    CORRUPTED,
    corrupt_target,
    dbs,  # noqa: F401 (the fixture)
    keys_of,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def deployment(
    dbs: Databases,  # noqa: F811 (the fixture imported above)
    redis_server: RedisInfo,
    tmp_path: Path,
) -> Iterator[Deployment]:
    with running_deployment(dbs, redis_server, tmp_path, dbs.target_dsn) as deployment:
        writer = deployment[3]
        corrupt_target(dbs)
        writer.stop()
        wait_caught_up(dbs)
        yield deployment


def start(deployment: Deployment, log: Path, *args: str) -> subprocess.Popen[bytes]:
    """`dblog verify ARGS` running, its output in `log`."""
    config, env, _, _ = deployment
    with log.open("ab") as out:
        return subprocess.Popen(
            [DBLOG, "verify", "-c", str(config), *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )


def control(deployment: Deployment, *args: str) -> subprocess.CompletedProcess[str]:
    config, env, _, _ = deployment
    command, *rest = args
    return run_cli(command, "-c", str(config), *rest, env=env)


def chunks_at_least(store: StateStore, verify_id: str, chunks: int) -> bool:
    status = store.verifies.status(verify_id)
    return status is not None and status.chunks >= chunks


def in_state(store: StateStore, verify_id: str, state: VerifyState) -> bool:
    status = store.verifies.status(verify_id)
    return status is not None and status.state is state


def assert_exact(dbs: Databases, store: StateStore, verify_id: str) -> None:  # noqa: F811
    """The corrupted keys found, each once, and every key of each table checked once."""
    found = [(d.table, d.kind, d.key) for d in store.verifies.differences(verify_id)]
    assert sorted(found, key=repr) == CORRUPTED
    counts = store.verifies.counts(verify_id)
    assert set(counts) == set(dbs.tables)
    for table, counted in counts.items():
        assert counted["in_flux"] == 0, (table, counted)
        assert counted["checked"] == len(keys_of(dbs, table)), (table, counted)


def test_a_paused_run_verifies_nothing_until_resumed_at_its_new_pace(
    dbs: Databases,  # noqa: F811
    deployment: Deployment,
    tmp_path: Path,
) -> None:
    _, _, store, _ = deployment
    log = tmp_path / "verify.log"
    run = start(
        deployment, log, *("--verify-id", "p1", "--chunk-size", "20", "--max-rows-per-s", "100")
    )
    try:
        wait_until(lambda: chunks_at_least(store, "p1", 2), 60, "two chunks verified")
        paused = control(deployment, "verify-pause", "p1")
        assert paused.returncode == 0 and "p1: pause requested" in paused.stdout, paused
        wait_until(lambda: in_state(store, "p1", VerifyState.PAUSED), 60, "the run paused")
        at_pause = store.verifies.status("p1")
        assert at_pause is not None

        shown = json.loads(control(deployment, "status", "--json").stdout)["verifies"]
        assert [(v["verify_id"], v["state"]) for v in shown] == [("p1", "paused")]
        assert shown[0]["controls"] == {
            "paused": True,
            "cancelled": False,
            "chunk_size": 20,
            "delay_ms": 0,
            "max_rows_per_s": 100.0,
        }
        table = control(deployment, "status").stdout.splitlines()
        assert any(line.split()[:2] == ["p1", "paused"] for line in table), table
        assert store.verifies.status("p1") == at_pause, "no chunk while paused"
        assert run.poll() is None, "the paused run waits"

        throttled = control(
            deployment, "verify-throttle", "p1", "--chunk-size", "100", "--max-rows-per-s", "0"
        )
        assert throttled.returncode == 0, throttled
        controls = store.verifies.controls("p1")
        assert controls is not None
        assert (controls.chunk_size, controls.max_rows_per_s) == (100, None)
        assert control(deployment, "verify-resume", "p1").returncode == 0
        code = run.wait(120)
    finally:
        run.kill()
        run.wait(30)

    output = log.read_text()
    assert code == 1, output[-3000:]
    assert_exact(dbs, store, "p1")
    done = store.verifies.status("p1")
    assert done is not None and done.state is VerifyState.DONE
    keys = [len(keys_of(dbs, table)) for table in dbs.tables]
    # Past the pause, chunks of 100 keys: at most this many, and fewer than chunks of 20 take.
    assert done.chunks - at_pause.chunks <= sum(math.ceil(n / 100) + 1 for n in keys), done
    assert done.chunks < sum(n // 20 for n in keys), done


def test_a_cancelled_run_ends_cancelled_and_resumes_when_run_again(
    dbs: Databases,  # noqa: F811
    deployment: Deployment,
    pg15: PostgresInfo,
    redis_server: RedisInfo,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config, _, store, _ = deployment
    log = tmp_path / "verify.log"
    run = start(
        deployment, log, *("--verify-id", "c1", "--chunk-size", "20", "--max-rows-per-s", "200")
    )
    try:
        wait_until(lambda: chunks_at_least(store, "c1", 2), 60, "two chunks verified")
        cancelled = control(deployment, "verify-cancel", "c1")
        assert cancelled.returncode == 0 and "c1: cancel requested" in cancelled.stdout
        code = run.wait(60)
    finally:
        run.kill()
        run.wait(30)

    output = log.read_text()
    assert code == 2, output[-3000:]
    assert "verify c1 was cancelled; to resume it: dblog verify --verify-id c1" in output
    assert "Traceback" not in output
    status = store.verifies.status("c1")
    assert status is not None and status.state is VerifyState.CANCELLED, status
    assert store.verifies.runner("c1") is None
    table = control(deployment, "status").stdout.splitlines()
    assert any(line.split()[:2] == ["c1", "cancelled"] for line in table), table
    for args, said in (
        (("verify-cancel", "c1"), "verify c1 is finished or unknown"),
        (("verify-pause", "nope"), "verify nope is finished or unknown"),
    ):
        refused = control(deployment, *args)
        assert (refused.returncode, refused.stderr.strip()) == (1, said), refused
    bad = control(deployment, "verify-throttle", "c1")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr, bad
    assert bad.stderr.strip() == "dblog: error: a throttle needs at least one setting"

    # Airflow: the trigger fires with the cancel, the operator fails without a retry.
    connection = dblog_connection(redis_server, pg15, dbs.config.name, config)
    monkeypatch.setenv("AIRFLOW_CONN_DBLOG_VERIFY", json.dumps(connection))
    trigger = DBLogVerifyTrigger("dblog_verify", "c1", poll_interval=0.1, runner_timeout_s=60)

    async def fired() -> dict[str, object]:
        event = await anext(trigger.run())
        return dict(event.payload)

    event = asyncio.run(fired())
    assert event["outcome"] == "cancelled", event
    operator = DBLogVerifyOperator(task_id="verify", dblog_conn_id="dblog_verify")
    with pytest.raises(AirflowFailException, match=r"verify c1 was cancelled .*clear this task"):
        operator.execute_complete({}, event)
    sensor = DBLogVerifySensor(task_id="wait", verify_id="c1", dblog_conn_id="dblog_verify")
    with pytest.raises(AirflowException, match="verify c1 was cancelled"):
        sensor.poke({})

    resumed = control(deployment, "verify", "--verify-id", "c1")
    assert resumed.returncode == 1, resumed.stdout + resumed.stderr[-3000:]
    assert_exact(dbs, store, "c1")


def test_a_run_with_chunks_in_flight_killed_and_resumed_counts_each_key_once(
    dbs: Databases,  # noqa: F811
    deployment: Deployment,
    tmp_path: Path,
) -> None:
    _, _, store, _ = deployment
    log = tmp_path / "verify.log"
    run = start(
        deployment,
        log,
        *("--verify-id", "par", "--chunk-size", "15", "--parallelism", "4"),
        *("--max-rows-per-s", "300"),
    )
    try:
        wait_until(lambda: chunks_at_least(store, "par", 6), 60, "six chunks verified")
    finally:
        run.kill()
        run.wait(30)
    killed = store.verifies.status("par")
    assert killed is not None and killed.state is VerifyState.RUNNING

    resumed = control(deployment, "verify", "--verify-id", "par")

    assert resumed.returncode == 1, resumed.stdout + resumed.stderr[-3000:]
    assert_exact(dbs, store, "par")
    request = store.verifies.request("par")
    assert request is not None and request["parallelism"] == 4
    again = control(deployment, "verify", "--verify-id", "p2", "--parallelism", "3")
    assert again.returncode == 1, again.stdout + again.stderr[-3000:]
    assert_exact(dbs, store, "p2")


class Gathering:
    """The target reader of one slot, its first chunk held where it waits for the target to
    catch up (both its windows open) until the first chunk of every other slot got there."""

    def __init__(self, reader: TargetReader, gathered: threading.Barrier) -> None:
        self._reader = reader
        self._gathered: threading.Barrier | None = gathered

    def applied_through(self, hw: Position, checkpoint: int | None) -> bool:
        if self._gathered is not None:
            gathered, self._gathered = self._gathered, None
            gathered.wait()
        return self._reader.applied_through(hw, checkpoint)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._reader, name)


class InProcess(NamedTuple):
    config: Config
    sources: Source
    store: StateStore


@pytest.fixture
def in_process(deployment: Deployment, monkeypatch: pytest.MonkeyPatch) -> InProcess:
    """The deployment's configuration, source and store, for a run in this process."""
    config_path, env, store, _ = deployment
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    config = load_config(config_path)
    return InProcess(config, source_for(config.source), store)


def test_chunks_of_one_table_are_in_flight_together_each_in_its_own_windows(
    dbs: Databases,  # noqa: F811
    in_process: InProcess,
) -> None:
    config, sources, store = in_process
    request = stored_request(store, config, "together", chunk_size=40, parallelism=3)
    open_windows: list[set[str]] = []

    def windows_open() -> None:
        states = (store.windows.state(w) for w in store.windows.ids())
        ids = {s.window.window_id for s in states if s and s.window.dump_id == "together"}
        open_windows.append(ids)

    gathered = threading.Barrier(3, action=windows_open, timeout=60)

    def open_slot() -> Slot:
        reader = target_reader_for(config, "output")
        return Slot(sources.chunk_source(), Gathering(reader, gathered))

    assert run_verify(store, open_slot, request) is VerifyState.DONE
    assert len(open_windows) == 1 and len(open_windows[0]) >= 6, open_windows
    counted = store.verifies.counts("together")[dbs.table("accounts")]
    assert counted["checked"] == len(keys_of(dbs, dbs.table("accounts")))
    assert (counted["in_flux"], counted["changed"]) == (0, 1), counted


def stored_request(
    store: StateStore, config: Config, verify_id: str, *, chunk_size: int, parallelism: int
) -> VerifyRequest:
    """A run of table `accounts`, stored, to run in this process."""
    source = source_for(config.source).chunk_source()
    try:
        request = build_verify_request(
            *(config, source),
            verify_id=verify_id,
            table="accounts",
            keys=None,
            where=None,
            after=None,
            upto=None,
            chunk_size=chunk_size,
            target="output",
            parallelism=parallelism,
        )
    finally:
        source.close()
    store.verifies.create(verify_id, request.to_json())
    return request


class Reads:
    """The SQL target's reader, noting the chunks it sums and those whose rows it reads."""

    def __init__(self, reader: TargetReader) -> None:
        self._reader = reader
        self.summed: list[Chunk] = []
        self.read: list[Chunk] = []

    def sum_rows(self, chunk: Chunk) -> ChunkSum | None:
        self.summed.append(chunk)
        return cast(SumsTarget, self._reader).sum_rows(chunk)

    def read_rows(self, chunk: Chunk) -> RowsRead:
        self.read.append(chunk)
        return cast(RowsTarget, self._reader).read_rows(chunk)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._reader, name)


def test_equal_chunks_are_summed_and_only_chunks_that_differ_are_read(
    dbs: Databases,  # noqa: F811
    in_process: InProcess,
) -> None:
    config, sources, store = in_process
    request = stored_request(store, config, "sums", chunk_size=50, parallelism=1)
    reads = Reads(target_reader_for(config, "output"))

    assert run_verify(store, lambda: Slot(sources.chunk_source(), reads), request) is (
        VerifyState.DONE
    )

    accounts = dbs.table("accounts")
    corrupted = [key for table, _, key in CORRUPTED if table == accounts]
    counted = store.verifies.counts("sums")[accounts]
    assert counted["checked"] == len(keys_of(dbs, accounts))
    assert (counted["in_flux"], counted["missing"], counted["extra"]) == (0, 1, 1), counted
    assert len(reads.summed) >= 6, "every chunk summed first"
    assert reads.read, "the chunks that differ read as rows"
    assert len(reads.read) < len(reads.summed)
    for chunk in reads.read:
        assert any(holds(chunk, key) for key in corrupted), (chunk, corrupted)


def holds(chunk: Chunk, key: Key) -> bool:
    return (chunk.after is None or chunk.after < key) and (chunk.upto is None or key <= chunk.upto)


def test_a_run_no_process_runs_is_cancelled_at_once(redis_server: RedisInfo) -> None:
    store = StateStore(redis_server.client(), f"test-{uuid.uuid4().hex[:12]}")
    store.verifies.create("idle", {"chunk_size": 10})
    store.verifies.create("claimed", {"chunk_size": 10})
    store.verifies.create("bare", {})  # stored without controls
    assert store.verifies.claim("claimed", "host:1", 60_000) is None

    assert store.verifies.pause("idle") and store.verifies.cancel("idle")
    idle = store.verifies.status("idle")
    assert idle is not None and idle.state is VerifyState.CANCELLED
    assert idle.reason == "cancelled while no process ran it"
    assert not store.verifies.pause("idle"), "a finished run takes no control"
    assert store.verifies.cancel("claimed")
    claimed = store.verifies.status("claimed")
    assert claimed is not None and claimed.state is VerifyState.RUNNING, "its process ends it"
    assert not store.verifies.throttle("bare", delay_ms=5)
    assert not store.verifies.cancel("nope")

    assert store.verifies.reopen("idle") and not store.verifies.reopen("claimed")
    reopened = store.verifies.status("idle")
    assert reopened is not None and reopened.state is VerifyState.RUNNING
    controls = store.verifies.controls("idle")
    assert controls is not None and not controls.paused and not controls.cancelled
