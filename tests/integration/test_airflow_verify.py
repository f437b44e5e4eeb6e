"""The `dblog_verify` DAG run with `dag.test()` against real PostgreSQL and Redis, a tailer
applying into a PostgreSQL SQL target and a writer writing all along. The target is corrupted
behind the tailer's back: a run with repair `none`, on Spark, reports exactly the corrupted keys
and repairs nothing; a run with repair `approve` and a threshold above the count repairs without
asking anyone (the verify and the repair each wait in the triggerer, run inline by
`dag.test()`), after which the target equals the source. A table that is not captured fails
the run at its first task.

With a running Airflow (api-server, scheduler, triggerer) and headless Chromium: the trigger
form offers the verify's params, none required but the threshold, and a key range typed into
it reaches the verify as typed (the report names only the keys inside it); a run with repair
`approve` and a threshold below the count waits in `approve` for a person, whose task page
shows the counts and the first differing keys; approved there, the repair runs and the target
equals the source. Screenshots of each step are kept in a directory the test prints."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote, unquote

import pytest

from airflow_provider_dblog.devservices.postgres import PostgresInfo
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.state import DumpState, StateStore, VerifyState
from tests.integration.airflow_server import airflow_server, wait_for
from tests.integration.airflow_support import airflow_env, dag_tests, dblog_connection, migrate
from tests.integration.browser import chromium, screenshots_dir
from tests.integration.e2e_support import (
    Databases,
    TailProcess,
    Writer,
    cli_env,
    run_cli,
    wait_caught_up,
    wait_until,
    write_config,
)
from tests.integration.verify.deployment import TARGET_DSN_ENV
from tests.integration.verify.test_verify_cli import (
    CORRUPTED,
    corrupt_target,
    dbs,  # noqa: F401 (the fixture)
)
from tests.integration.verify.test_verify_repair import TABLES, rows_of

pytestmark = pytest.mark.integration
SPARK = "spark_default"
"""The Spark connection `airflow_env` defines (local mode)."""


@pytest.fixture
def deployment(
    dbs: Databases,  # noqa: F811 (the fixture imported above)
    pg15: PostgresInfo,
    redis_server: RedisInfo,
    tmp_path: Path,
) -> Iterator[tuple[dict[str, str], StateStore, Writer]]:
    """A tailer applying into the SQL target, which a dump filled, a writer running, and
    the environment of an Airflow whose `dblog` connection points at them."""
    output = {"type": "sql_apply", "dsn_env": TARGET_DSN_ENV}
    tailer = {"heartbeat_s": 0.2, "window_ttl_s": 30, "lease_ttl_ms": 3000}
    env = cli_env(dbs, redis_server, **{TARGET_DSN_ENV: dbs.target_dsn})
    config = write_config(tmp_path / "dblog.toml", dbs, redis_server, output, tailer)
    store = StateStore(redis_server.client(), dbs.config.name)
    tail = TailProcess(config, "verify-dag-tailer", env, tmp_path / "tail.log")
    writer = Writer(dbs, tmp_path, seed_value=11, per_s=20)
    connection = dblog_connection(redis_server, pg15, dbs.config.name, config)
    airflow = airflow_env(tmp_path / "airflow", connection, **{TARGET_DSN_ENV: dbs.target_dsn})
    try:
        migrate(airflow)
        wait_until(lambda: store.tailer.health() is not None, 30, "the tailer beating")
        dumped = run_cli("dump", "-c", str(config), "--chunk-size", "200", env=env)
        assert dumped.returncode == 0, dumped.stderr[-2000:]
        writer.wait_for(10)
        yield airflow, store, writer
    finally:
        writer.kill()
        tail.stop()


def test_the_verify_dag_reports_then_repairs_what_differs(
    dbs: Databases,  # noqa: F811 (the fixture imported above)
    deployment: tuple[dict[str, str], StateStore, Writer],
) -> None:
    airflow, store, writer = deployment
    corrupt_target(dbs)

    refused, reported, repaired = dag_tests(
        airflow,
        [
            ("dblog_verify", {"table": "public.nope"}),
            ("dblog_verify", {"repair": "none", "chunk_size": 150, "spark_conn_id": SPARK}),
            ("dblog_verify", {"repair": "approve", "approve_above": 10}),
        ],
    )

    assert refused.state == "failed", refused.output[-6000:]
    assert refused.tasks["verify"] == "failed"
    assert "table public.nope is not captured" in refused.output
    assert reported.state == "success", reported.output[-6000:]
    assert "the Spark verify application starts" in reported.output
    assert reported.tasks == {
        "verify": "success",
        "decide": "success",
        "approve": "skipped",
        "no_approval_needed": "skipped",
        "repair": "skipped",
    }
    assert repaired.state == "success", repaired.output[-6000:]
    assert repaired.tasks["approve"] == "skipped"  # 4 keys differ, at most 10 need no person
    assert repaired.tasks["repair"] == "success", repaired.output[-6000:]

    first, second = store.verifies.ids()
    for verify_id in (first, second):
        found = [(d.table, d.kind, d.key) for d in store.verifies.differences(verify_id)]
        assert sorted(found, key=repr) == CORRUPTED, verify_id
    reported_status, repaired_status = map(store.verifies.status, (first, second))
    assert reported_status is not None and reported_status.repair_dumps is None
    assert repaired_status is not None and repaired_status.state is VerifyState.DONE
    assert repaired_status.removed == 1 and repaired_status.repair_dumps
    for dump_id in repaired_status.repair_dumps:
        dumped = store.dumps.status(dump_id)
        assert dumped is not None and dumped.state is DumpState.DONE, dump_id
    assert "Repair: 1 extra keys removed" in repaired.output

    writer.stop()
    wait_caught_up(dbs)
    source, target = rows_of(dbs.source_dsn), rows_of(dbs.target_dsn)
    for table in TABLES:
        assert source[table] == target[table], table


def test_a_repair_above_the_threshold_waits_for_a_person_to_approve_it(
    dbs: Databases,  # noqa: F811 (the fixture imported above)
    deployment: tuple[dict[str, str], StateStore, Writer],
    tmp_path: Path,
) -> None:
    airflow, store, writer = deployment
    corrupt_target(dbs)
    writer.stop()
    shots = screenshots_dir("verify-browser-")
    print(f"screenshots of the browser test: {shots}")
    # Polls 3 s apart: a trigger's first look comes after the deferring process has exited.
    env = {**airflow, "DBLOG_POLL_S": "3"}
    with (
        airflow_server(tmp_path / "airflow-server", env) as server,
        chromium(tmp_path) as page,
    ):
        server.wait_dag("dblog_verify")
        assert server.client is not None
        token = server.client.headers["Authorization"].removeprefix("Bearer ")
        page.send("Network.setCookie", name="_token", value=token, url=f"{server.url}/")

        server.api("PATCH", "/api/v2/dags/dblog_verify", json={"is_paused": False})
        page.navigate(f"{server.url}/dags/dblog_verify")
        page.click("button[aria-label='Trigger Dag']")
        page.wait("!!document.querySelector('#element_after')", "the trigger form")
        required = page.evaluate(
            "Object.fromEntries([...document.querySelectorAll('[role=group] label')]"
            ".map(l => [l.innerText.split('\\n')[0].trim(), l.innerText.includes('*')]))"
        )
        shown = (
            *("table", "after", "upto", "where", "repair", "approve_above", "target"),
            *("chunk_size", "parallelism", "spark_conn_id"),
        )
        optional = dict.fromkeys(shown, False)
        # Counts with their defaults always there, as the dump form's parallelism.
        counts = {"approve_above": True, "parallelism": True}
        assert {k: required.get(k) for k in shown} == {**optional, **counts}, required
        page.type_into("#element_table", "public.accounts")
        page.type_into("#element_after", "100000")
        page.screenshot(shots / "1-verify-form.png")
        page.click_text("[role=dialog] button", "Trigger")
        href = page.wait("location.pathname.includes('/runs/') && location.pathname", "the run")
        ranged = unquote(str(href).rsplit("/runs/", 1)[1])
        assert server.wait_run("dblog_verify", ranged, 120) == "success", server.report(
            "dblog_verify", ranged
        )
        reported = server.xcom("dblog_verify", ranged, "verify")
        assert sorted(reported["first_keys"]) == [
            "public.accounts changed [100001]",
            "public.accounts extra [100010]",
            "public.accounts missing [100002]",
        ], reported
        assert server.task_states("dblog_verify", ranged)["repair"] == "skipped"

        run_id = server.trigger("dblog_verify", {"repair": "approve", "approve_above": 1})
        path = f"/api/v2/dags/dblog_verify/dagRuns/{run_id}/taskInstances/approve/-1/hitlDetails"

        def asked() -> dict[str, object] | None:
            server.check_alive()
            assert server.run_state("dblog_verify", run_id) != "failed", server.report(
                "dblog_verify", run_id
            )
            assert server.client is not None
            answer = server.client.get(path)
            return answer.json() if answer.status_code == 200 else None

        question = wait_for(asked, 120, "the approve task asking a person")
        assert question["subject"] == "Repair 4 differing keys?", question
        body = str(question["body"])
        for line in ("missing: 1", "extra: 1", "changed: 2", "`public.accounts extra [100010]`"):
            assert line in body, body
        waiting = store.verifies.status(store.verifies.ids()[-1])
        assert waiting is not None and waiting.repair_dumps is None, "nothing repaired yet"

        # Approved before the scheduler heard that the deferring process ended, Airflow can take
        # that late event for the resumed try's end and fail it: wait for the event first.
        ended = f"task_id='approve', run_id='{run_id}', try_number=1"
        wait_for(
            lambda: any(
                "Received executor event" in line and ended in line
                for line in server.log_of("scheduler").read_text(errors="replace").splitlines()
            ),
            120,
            "the scheduler hearing that the approve task's deferring process ended",
        )

        task = f"{server.url}/dags/dblog_verify/runs/{quote(run_id)}/tasks/approve"
        page.navigate(f"{task}/required_actions")
        page.wait(
            "document.body.innerText.includes('public.accounts extra [100010]')",
            "the approval's counts and keys on its Required action",
            timeout_s=60,
        )
        page.screenshot(shots / "2-approval.png")
        page.click_text("button", "Approve")

        state = server.wait_run("dblog_verify", run_id, 120)
        assert state == "success", server.report("dblog_verify", run_id)
        assert server.task_states("dblog_verify", run_id) == {
            "verify": "success",
            "decide": "success",
            "approve": "success",
            "no_approval_needed": "skipped",
            "repair": "success",
        }
        repaired = server.xcom("dblog_verify", run_id, "repair")
        assert repaired["repair"]["removed"] == 1, repaired
    wait_caught_up(dbs)
    source, target = rows_of(dbs.source_dsn), rows_of(dbs.target_dsn)
    for table in TABLES:
        assert source[table] == target[table], table
