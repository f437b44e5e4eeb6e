"""`dblog verify` on real servers: a PostgreSQL source, its tailer applying into a PostgreSQL
SQL target, a writer writing all along. The target is corrupted behind the tailer's back (a row
changed, one deleted, one added, a composite-keyed row changed); the report names exactly those
keys, none of the keys the writer keeps changing. Bad input is refused in one line before
anything is stored."""

from __future__ import annotations

import json
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from airflow_provider_dblog.core.event import TableRef
from airflow_provider_dblog.core.verify import Difference
from airflow_provider_dblog.devservices.postgres import PostgresInfo
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.state import StateStore, VerifyState
from airflow_provider_dblog.state.verifies import COUNTERS
from tests.integration.e2e_support import (
    DBLOG,
    Databases,
    TailProcess,
    cli_env,
    drop_databases,
    make_databases,
    run_cli,
    wait_caught_up,
    wait_until,
    write_config,
)
from tests.integration.verify.deployment import TARGET_DSN_ENV, Deployment, running_deployment

pytestmark = pytest.mark.integration
ROWS = 300
ACCOUNTS, ORDERS = TableRef("public", "accounts"), TableRef("public", "orders")
OWN_ACCOUNTS = (100_001, 100_002, 100_003)
"""Keys the writer never touches (its accounts are 1-1500, its regions eu, us, ap, sa): the
corruptions stay as made while it writes."""


@pytest.fixture
def dbs(pg15: PostgresInfo) -> Iterator[Databases]:
    databases = make_databases(pg15, ROWS, target=True, seed_value=42)
    yield databases
    drop_databases(databases)


@pytest.fixture(params=["written", "read-only"])
def deployment(
    request: pytest.FixtureRequest, dbs: Databases, redis_server: RedisInfo, tmp_path: Path
) -> Iterator[Deployment]:
    with running_deployment(
        dbs, redis_server, tmp_path, dbs.target_dsn, read_only=request.param == "read-only"
    ) as deployment:
        yield deployment


CORRUPTED = sorted(
    [
        (ACCOUNTS, Difference.CHANGED, (100_001,)),
        (ACCOUNTS, Difference.MISSING, (100_002,)),
        (ACCOUNTS, Difference.EXTRA, (100_010,)),
        (ORDERS, Difference.CHANGED, ("zz", 1)),
    ],
    key=repr,
)


def corrupt_target(dbs: Databases) -> None:
    """Rows of keys the writer never touches, written to the source, applied to the target,
    then corrupted there: `CORRUPTED`."""
    with psycopg.connect(dbs.source_dsn, autocommit=True) as source:
        for key in OWN_ACCOUNTS:
            source.execute(
                "INSERT INTO accounts (id, owner, balance, active) VALUES (%s, 'own', 1, true)",
                (key,),
            )
        source.execute("INSERT INTO orders (region, n, amount) VALUES ('zz', 1, 5), ('zz', 2, 6)")
    with psycopg.connect(dbs.target_dsn, autocommit=True) as target:

        def applied() -> bool:
            found = target.execute(
                "SELECT (SELECT count(*) FROM accounts WHERE id > 100000) + "
                "(SELECT count(*) FROM orders WHERE region = 'zz')"
            ).fetchone()
            return found is not None and found[0] == 5

        wait_until(applied, 60, "the rows written for the test applied to the target")
        target.execute("UPDATE accounts SET owner = 'corrupt' WHERE id = 100001")
        target.execute("DELETE FROM accounts WHERE id = 100002")
        target.execute(
            "INSERT INTO accounts (id, owner, balance, active) VALUES (100010, 'x', 0, false)"
        )
        target.execute("UPDATE orders SET note = 'corrupt' WHERE region = 'zz' AND n = 1")


def test_the_report_names_exactly_the_corrupted_keys_while_writes_go_on(
    dbs: Databases, deployment: Deployment
) -> None:
    config, env, store, writer = deployment
    corrupt_target(dbs)
    written = len(writer.transactions())

    done = run_cli(
        *("verify", "-c", str(config), "--verify-id", "v1", "--chunk-size", "120"), env=env
    )

    assert done.returncode == 1, done.stdout + done.stderr[-3000:]
    assert len(writer.transactions()) > written, "the writer wrote while verify ran"
    found = [(d.table, d.kind, d.key) for d in store.verifies.differences("v1")]
    assert sorted(found, key=repr) == CORRUPTED
    for line in ("public.accounts changed [100001]", "public.orders changed ['zz', 1]"):
        assert line in done.stdout, done.stdout
    status = store.verifies.status("v1")
    assert status is not None and status.state is VerifyState.DONE
    counts = store.verifies.counts("v1")
    assert counts[ACCOUNTS]["missing"] == counts[ACCOUNTS]["extra"] == 1
    assert sum(c["checked"] + c["in_flux"] for c in counts.values()) >= 3 * ROWS
    assert all(c["checked"] > 0 for c in counts.values()), counts

    shown = run_cli("status", "-c", str(config), env=env)
    assert shown.returncode == 0, shown.stderr[-2000:]
    lines = shown.stdout.splitlines()
    header = lines.index(next(line for line in lines if line.startswith("verify ")))
    assert lines[header].split()[1:] == [
        "state",
        "chunks",
        "checked",
        "in",
        "flux",
        "missing",
        "extra",
        "changed",
        "repair",
        "reason",
    ]
    total = {c: sum(per_table[c] for per_table in counts.values()) for c in COUNTERS}
    assert lines[header + 1].split() == [
        "v1", "done", str(status.chunks), *(str(total[c]) for c in COUNTERS), "-"
    ], lines  # fmt: skip
    assert (total["missing"], total["extra"], total["changed"]) == (1, 1, 2)
    as_json = json.loads(run_cli("status", "-c", str(config), "--json", env=env).stdout)
    assert as_json["verifies"] == [
        {
            "verify_id": "v1",
            "state": "done",
            "reason": "",
            "chunks": status.chunks,
            "windows_retried": status.windows_retried,
            "created_ms": status.created_ms,
            "finished_ms": status.finished_ms,
            "runner": None,
            "controls": {
                "paused": False,
                "cancelled": False,
                "chunk_size": 120,
                "delay_ms": 0,
                "max_rows_per_s": None,
            },
            **total,
            "removed": 0,
            "repair_dumps": None,
        }
    ]

    narrowed = run_cli(
        *("verify", "-c", str(config), "--table", "accounts"),
        *("--after", "100001", "--upto", "100003"),
        env=env,
    )
    assert narrowed.returncode == 1, narrowed.stdout + narrowed.stderr[-3000:]
    assert "public.accounts missing [100002]" in narrowed.stdout
    assert "changed [100001]" not in narrowed.stdout  # below the range

    listed = run_cli(
        *("verify", "-c", str(config), "--table", "accounts"),
        *("--keys", "100001,100002,100003,100010"),
        env=env,
    )
    assert listed.returncode == 1, listed.stdout + listed.stderr[-3000:]
    for line in ("changed [100001]", "missing [100002]", "extra [100010]"):
        assert f"public.accounts {line}" in listed.stdout, listed.stdout


def test_a_killed_run_resumes_from_its_last_chunk_and_counts_each_key_once(
    dbs: Databases, deployment: Deployment, tmp_path: Path
) -> None:
    config, env, store, writer = deployment
    corrupt_target(dbs)
    writer.stop()  # quiet: every key is checked, none in flux, so the counts are exact
    wait_caught_up(dbs)
    argv = [DBLOG, "verify", "-c", str(config), "--verify-id", "v2", "--chunk-size", "40"]
    with (tmp_path / "verify.log").open("ab") as out:
        first = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:

        def three_chunks() -> bool:
            status = store.verifies.status("v2")
            return status is not None and status.chunks >= 3

        wait_until(three_chunks, 60, "three chunks verified")
    finally:
        first.kill()
        first.wait(30)
    status = store.verifies.status("v2")
    assert status is not None and status.state is VerifyState.RUNNING
    killed = f"{socket.gethostname()}:{first.pid}"
    assert store.verifies.runner("v2") == killed, "its claim outlives it"

    store.verifies.claim("v2", "elsewhere:1", 60_000, gone=killed)  # another host runs it
    refused = run_cli("verify", "-c", str(config), "--verify-id", "v2", env=env)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    errors = [line for line in refused.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and "v2 is running in elsewhere:1" in errors[0], refused.stderr
    assert "Traceback" not in refused.stderr
    assert store.verifies.status("v2") == status, "the refused process changed nothing"
    store.verifies.claim("v2", killed, 60_000, gone="elsewhere:1")  # the killed one's again

    done = run_cli("verify", "-c", str(config), "--verify-id", "v2", env=env)

    assert done.returncode == 1, done.stdout + done.stderr[-3000:]
    found = [(d.table, d.kind, d.key) for d in store.verifies.differences("v2")]
    assert sorted(found, key=repr) == CORRUPTED
    for table, counted in store.verifies.counts("v2").items():
        assert counted["in_flux"] == 0
        assert counted["checked"] == len(keys_of(dbs, table)), table  # each key once
    again = run_cli("verify", "-c", str(config), "--verify-id", "v2", env=env)
    assert again.returncode == 1 and "public.accounts missing [100002]" in again.stdout


def keys_of(dbs: Databases, table: TableRef) -> set[str]:
    """The keys of `table` in the source or the target."""
    order = {"accounts": "id", "orders": "region, n", "items": "id"}[table.name]
    found: set[str] = set()
    for dsn in (dbs.source_dsn, dbs.target_dsn):
        with psycopg.connect(dsn) as conn:
            query = f"SELECT ({order})::text FROM {table}"
            found.update(str(row[0]) for row in conn.execute(query))
    return found


REFUSALS = [
    (("--table", "public.nope"), "table public.nope is not captured"),
    (("--target", "lake"), "unknown target 'lake'"),
    (("--target", "search"), "unknown target 'search'"),
    (("--table", "accounts", "--after", "abc"), "after: "),
    (("--table", "orders", "--upto", "[1, 2, 3]"), "upto: "),
    (("--table", "accounts", "--where", "nope = 1"), "nope"),
    (
        ("--table", "accounts", "--where", "only_in_source(id)"),
        "the sql_apply output cannot run the filter on public.accounts: function only_in_source",
    ),
    (("--keys", "1,2"), "need --table"),
    (("--table", "accounts", "--keys", "1", "--after", "2"), "no keys"),
]


def test_bad_input_is_refused_in_one_line_before_anything_is_stored(
    dbs: Databases, redis_server: RedisInfo, tmp_path: Path
) -> None:
    """Each refusal is one `dblog: error:` line, exit 2, no traceback, no run stored: a filter
    the source runs but the target cannot (a function only the source has), a target whose
    table map names a table it does not have, a range of a table without a primary key."""
    with psycopg.connect(dbs.source_dsn, autocommit=True) as source:
        source.execute(
            "CREATE FUNCTION only_in_source(bigint) RETURNS boolean IMMUTABLE LANGUAGE sql "
            "AS 'SELECT $1 > 0'"
        )
        source.execute("CREATE TABLE loose (id bigint, note text)")
    output = {"type": "sql_apply", "dsn_env": TARGET_DSN_ENV}
    config = write_config(tmp_path / "dblog.toml", dbs, redis_server, output)
    missing = write_config(tmp_path / "missing.toml", dbs, redis_server, output)
    with missing.open("a") as toml:
        toml.write('[output.table_map]\n"public.items" = "public.missing"\n')
    loose = config.read_text().replace('tables = ["', 'tables = ["public.loose", "', 1)
    (tmp_path / "loose.toml").write_text(loose)
    env = cli_env(dbs, redis_server, **{TARGET_DSN_ENV: dbs.target_dsn})
    store = StateStore(redis_server.client(), dbs.config.name)
    tail = TailProcess(config, "verify-tailer", env, tmp_path / "tail.log")
    try:
        wait_until(lambda: store.tailer.health() is not None, 30, "the tailer beating")
        cases = [((str(config), *args), refusal) for args, refusal in REFUSALS]
        cases.append(((str(missing),), "holds no table public.missing for public.items"))
        ranged = (str(tmp_path / "loose.toml"), "--table", "loose", "--after", "1")
        cases.append((ranged, "public.loose has no primary key"))
        for (path, *args), refusal in cases:
            done = run_cli("verify", "-c", path, *args, env=env)
            assert done.returncode == 2, (args, done.stdout + done.stderr)
            errors = [line for line in done.stderr.splitlines() if "error" in line]
            assert len(errors) == 1 and refusal in errors[0], (args, done.stderr)
            assert "Traceback" not in done.stderr
        assert store.verifies.ids() == []
    finally:
        tail.stop()
