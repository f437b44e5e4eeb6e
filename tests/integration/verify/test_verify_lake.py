"""`dblog verify --target lake` on real servers: a PostgreSQL source, its tailer writing NDJSON,
the compaction following it into the lake (`dblog lake compact --follow`), a writer writing all
along. The lake a dump filled is equal to the source while writes go on; a row rewritten and
one deleted through deltalake, behind the compaction's back, are then named exactly, and again
once the writes stop (the lake counts as folded through hw when the compaction's cursor has
read what the event files held, with no later event to move it), with the same counts when
Spark tasks read the chunks (`--master`)."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import psycopg
import pyarrow.compute as pc
import pytest
from airflow.sdk import Context
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError

from airflow_provider_dblog.compaction.segments import CompactState
from airflow_provider_dblog.core.event import TableRef
from airflow_provider_dblog.core.position import Position
from airflow_provider_dblog.core.verify import Difference
from airflow_provider_dblog.devservices.postgres import PostgresInfo
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.lake.table import LakeTable, table_uri
from airflow_provider_dblog.lake.target_rows import LakeRows
from airflow_provider_dblog.operators.verify import DBLogVerifyOperator
from airflow_provider_dblog.state import StateStore, VerifyState
from tests.integration.airflow_support import dblog_connection
from tests.integration.e2e_support import (
    DBLOG,
    Databases,
    TailProcess,
    Writer,
    cli_env,
    drop_databases,
    make_databases,
    run_cli,
    wait_until,
    write_config,
)

pytestmark = pytest.mark.integration
ROWS = 300
ACCOUNTS = TableRef("public", "accounts")
OWN_ACCOUNTS = (100_001, 100_002)
"""Keys the writer never touches (its accounts are 1-1500): the corruptions stay as made."""
CORRUPTED = [
    (ACCOUNTS, Difference.CHANGED, (100_001,)),
    (ACCOUNTS, Difference.MISSING, (100_002,)),
]


@pytest.fixture
def dbs(pg15: PostgresInfo) -> Iterator[Databases]:
    databases = make_databases(pg15, ROWS, target=False, seed_value=42)
    yield databases
    drop_databases(databases)


Deployment = tuple[Path, dict[str, str], StateStore, Writer, Path]


@pytest.fixture
def deployment(dbs: Databases, redis_server: RedisInfo, tmp_path: Path) -> Iterator[Deployment]:
    """A tailer writing NDJSON, the compaction following it into the lake, which a dump
    filled, and a writer running."""
    root = tmp_path / "lake"
    output = {"type": "ndjson", "directory": str(tmp_path / "events")}
    tailer = {"heartbeat_s": 0.2, "window_ttl_s": 30, "lease_ttl_ms": 3000}
    config = write_config(tmp_path / "dblog.toml", dbs, redis_server, output, tailer)
    with config.open("a") as toml:
        toml.write(f'[lake]\nroot = "{root}"\n')
    env = cli_env(dbs, redis_server)
    store = StateStore(redis_server.client(), dbs.config.name)
    tail = TailProcess(config, "verify-tailer", env, tmp_path / "tail.log")
    follow = ["lake", "compact", "--follow", "--interval", "0.2", "--config", str(config)]
    with (tmp_path / "follow.log").open("ab") as out:
        follower = subprocess.Popen([DBLOG, *follow], stdout=out, stderr=out, env=env)
    writer = Writer(dbs, tmp_path, seed_value=5, per_s=50)
    try:
        wait_until(lambda: store.tailer.health() is not None, 30, "the tailer beating")
        dumped = run_cli("dump", "-c", str(config), "--chunk-size", "200", env=env)
        assert dumped.returncode == 0, dumped.stderr[-2000:]
        writer.wait_for(10)
        yield config, env, store, writer, root
    finally:
        writer.kill()
        follower.kill()
        follower.wait(30)
        tail.stop()


def own_rows_in_the_lake(dbs: Databases, root: Path) -> None:
    """Rows of keys the writer never touches, written to the source and folded into the lake."""
    with psycopg.connect(dbs.source_dsn, autocommit=True) as source:
        for key in OWN_ACCOUNTS:
            source.execute(
                "INSERT INTO accounts (id, owner, balance, active) VALUES (%s, 'own', 1, true)",
                (key,),
            )

    def folded() -> bool:
        if not LakeTable.exists(root, ACCOUNTS):
            return False
        rows = LakeTable.open(root, ACCOUNTS).rows()
        return len(rows.filter(pc.field("id") > 100_000)) == len(OWN_ACCOUNTS)

    wait_until(folded, 90, "the rows written for the test folded into the lake")


def corrupt_lake(root: Path) -> None:
    """A row rewritten and one deleted through deltalake (a commit the compaction's may race:
    run again on the new version, as any writer of the table does)."""
    for attempt in range(20):
        try:
            table = DeltaTable(table_uri(root, ACCOUNTS))
            table.update(predicate="id = 100001", updates={"owner": "'corrupt'"})
            DeltaTable(table_uri(root, ACCOUNTS)).delete("id = 100002")
            return
        except CommitFailedError:
            if attempt == 19:
                raise
            time.sleep(0.1)


def test_an_equal_lake_passes_and_a_rewritten_row_is_named_while_writes_go_on(
    dbs: Databases,
    deployment: Deployment,
    tmp_path: Path,
    pg15: PostgresInfo,
    redis_server: RedisInfo,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config, env, store, writer, root = deployment
    empty = tmp_path / "empty.toml"
    empty.write_text(config.read_text().replace(f'root = "{root}"', f'root = "{tmp_path}/none"'))
    refused = run_cli("verify", "-c", str(empty), "--target", "lake", env=env)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    errors = [line for line in refused.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and "the lake holds no table of public." in errors[0], refused.stderr
    assert store.verifies.ids() == []

    own_rows_in_the_lake(dbs, root)
    verify = ("verify", "-c", str(config), "--target", "lake", "--chunk-size", "120")
    source_only = ("--table", "accounts", "--where", "pg_column_size(owner) > 0")
    refused = run_cli(*verify, *source_only, env=env)  # PostgreSQL's function, not DataFusion's
    assert refused.returncode == 2, refused.stdout + refused.stderr
    errors = [line for line in refused.stderr.splitlines() if "error" in line]
    assert len(errors) == 1, refused.stderr
    assert "the lake cannot run the filter on public.accounts" in errors[0], refused.stderr
    assert "pg_column_size" in errors[0] and "Traceback" not in refused.stderr
    assert store.verifies.ids() == []

    equal = run_cli(*verify, "--verify-id", "l1", env=env)

    assert equal.returncode == 0, equal.stdout + equal.stderr[-3000:]
    assert store.verifies.differences("l1") == []
    counts = store.verifies.counts("l1")
    assert sum(c["checked"] + c["in_flux"] for c in counts.values()) >= 3 * ROWS
    assert all(c["checked"] > 0 for c in counts.values()), counts

    corrupt_lake(root)
    written = len(writer.transactions())
    corrupted = run_cli(*verify, "--verify-id", "l2", env=env)

    assert corrupted.returncode == 1, corrupted.stdout + corrupted.stderr[-3000:]
    assert len(writer.transactions()) > written, "the writer wrote while verify ran"
    found = [(d.table, d.kind, d.key) for d in store.verifies.differences("l2")]
    assert sorted(found, key=repr) == CORRUPTED
    assert "public.accounts changed [100001]" in corrupted.stdout, corrupted.stdout
    status = store.verifies.status("l2")
    assert status is not None and status.state is VerifyState.DONE

    narrowed = ("--table", "accounts", "--window-timeout", "30")
    filtered = run_cli(*verify, *narrowed, "--where", "id > 100000 AND owner <> 'x'", env=env)
    assert filtered.returncode == 1, filtered.stdout + filtered.stderr[-3000:]
    for line in ("changed [100001]", "missing [100002]"):
        assert f"public.accounts {line}" in filtered.stdout, filtered.stdout
    ranged = run_cli(*verify, *narrowed, "--after", "100001", "--upto", "100002", env=env)
    assert ranged.returncode == 1, ranged.stdout + ranged.stderr[-3000:]
    assert "public.accounts missing [100002]" in ranged.stdout, ranged.stdout
    assert "changed [100001]" not in ranged.stdout  # below the range

    writer.stop()
    quiet = run_cli(*verify, "--verify-id", "l3", "--window-timeout", "30", env=env)
    assert quiet.returncode == 1, quiet.stdout + quiet.stderr[-3000:]
    found = [(d.table, d.kind, d.key) for d in store.verifies.differences("l3")]
    assert sorted(found, key=repr) == CORRUPTED
    assert store.verifies.counts("l3")[ACCOUNTS]["in_flux"] == 0

    on_spark = ("--verify-id", "l4", "--window-timeout", "30", "--master", "local[2]")
    spark = subprocess.run(
        [DBLOG, *verify, *on_spark, "--tasks", "2"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert spark.returncode == 1, spark.stdout + spark.stderr[-3000:]
    assert store.verifies.differences("l4") == store.verifies.differences("l3")
    assert store.verifies.counts("l4") == store.verifies.counts("l3")

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    connection = dblog_connection(redis_server, pg15, dbs.config.name, config)
    monkeypatch.setenv("AIRFLOW_CONN_DBLOG_LAKE", json.dumps(connection))
    operator = DBLogVerifyOperator(
        task_id="verify",
        dblog_conn_id="dblog_lake",
        target="lake",
        verify_id="l5",
        chunk_size=120,
        window_timeout_s=30,
        deferrable=False,
    )
    outcome = operator.execute(cast(Context, {}))
    assert (outcome["outcome"], outcome["differing"]) == ("done", len(CORRUPTED)), outcome
    assert store.verifies.differences("l5") == store.verifies.differences("l3")
    assert (store.verifies.request("l5") or {})["target"] == "lake"


def test_the_lake_has_folded_through_hw_once_the_cursor_covers_what_the_files_held(
    tmp_path: Path,
) -> None:
    """Not before the checkpoint reaches hw (the files may lack events up to it), nor before
    the compaction's cursor (written by the compaction's own `CompactState`) covers the bytes
    the files held then; bytes written after that are not waited for."""
    sizes = {"events-1.ndjson": 10}
    reader = LakeRows(tmp_path, lambda: dict(sizes))
    hw = Position(100, 0)
    assert not reader.applied_through(hw, 99)
    assert not reader.applied_through(hw, 100)
    sizes["events-1.ndjson"] = 50
    CompactState(None, {"events-1.ndjson": 10}).save(tmp_path)
    assert reader.applied_through(hw, 100)
    later = Position(200, 0)
    assert not reader.applied_through(later, 200)
    CompactState([200, 0], {"events-1.ndjson": 50}).save(tmp_path)
    assert reader.applied_through(later, 200)
