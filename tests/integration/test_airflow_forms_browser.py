"""The trigger forms as a person meets them, in headless Chromium against a running Airflow
(api-server, scheduler, dag-processor, triggerer) with the provider, a tailer and Spark.

In `dblog_dump`'s form the optional fields (the chunk size among them: empty is the mode's
default; the read_only switch) carry no "required" asterisk and a chunk size of 0 stays 0 (no
silent clamp to 1); triggered, it is refused there in a short message naming the param and
the bound, without the param's help, and no run starts.
From `dblog_repair`'s page, its docs; then in its form, whose chunk-size help speaks of no
mode, keys unlike one another are refused at Trigger, naming the key; a repair of composite
keys typed as `dblog dump --keys` takes them succeeds and leaves exactly those rows in the
target, with the rows, chunks and the Spark driver's log in the dump task's XCom; a repair of a
table that is not captured, which fails its first task saying so; and a repair by a filter
typed into its form (sent as typed) that calls a volatile function, which fails its first
task naming it. The connection test the
Test button runs says "this connection", not the random id Airflow tests it under, and names
a mistake in the configuration's sections as the TOML's loader does. The
repair's dump task shows its "DBLog live view" link (the connection's `ui_url`), which opens
the dump's page in a running `dblog ui`, whose link leads back to the DAG run.

Airflow knows the deployment only through its connection (the configuration's sections in
its extra, no TOML), as the README's local quick start sets it up.

Screenshots of each step are kept in a directory the test prints (`screenshots_dir`).
"""

from __future__ import annotations

import json
from contextlib import ExitStack
from pathlib import Path
from urllib.parse import quote, unquote

import psycopg
import pytest

from airflow_provider_dblog.devservices.postgres import PostgresInfo
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.hooks.spark_launcher import driver_log_path
from airflow_provider_dblog.operators.links import live_view_url
from airflow_provider_dblog.operators.request import dump_id_for
from tests.integration.airflow_server import AirflowServer, airflow_server
from tests.integration.airflow_support import (
    airflow_env,
    dblog_connection,
    holding_the_configuration,
)
from tests.integration.browser import Page, chromium, screenshots_dir
from tests.integration.e2e_support import cli_env, wait_caught_up
from tests.integration.spark_support import running_pipeline
from tests.integration.ui_support import running_ui

pytestmark = pytest.mark.integration
ROWS = 60
VOLATILE_FILTER = "active AND id < random() * 100"


def refusal(page: Page) -> str:
    """The error the trigger form shows once the api-server refused the trigger."""
    shown: str = page.wait(
        "document.querySelector('[data-testid=error-alert]')?.innerText",
        "the refusal",
    )
    return shown


def open_trigger_form(page: Page, airflow: AirflowServer, dag_id: str) -> None:
    page.navigate(f"{airflow.url}/dags/{dag_id}")
    page.click("button[aria-label='Trigger Dag']")
    page.wait("!!document.querySelector('#element_chunk_size, [name=element_chunk_size]')", "form")


def trigger_from_form(page: Page) -> str:
    """Press the form's Trigger button; the id of the run it started (the page goes to it)."""
    page.click_text("[role=dialog] button", "Trigger")
    href = page.wait(
        "location.pathname.includes('/runs/') && location.pathname", "the new run", timeout_s=180
    )
    return unquote(str(href).rsplit("/runs/", 1)[1])


def test_a_person_repairs_composite_keys_from_the_trigger_form(
    pg15: PostgresInfo, redis_server: RedisInfo, tmp_path: Path
) -> None:
    shots = screenshots_dir("forms-browser-")
    print(f"screenshots of the browser test: {shots}")
    with ExitStack() as stack:
        pipeline = stack.enter_context(running_pipeline(pg15, redis_server, tmp_path, rows=ROWS))
        dbs = pipeline.dbs
        with psycopg.connect(dbs.source_dsn) as source:
            keys = [list(r) for r in source.execute("SELECT region, n FROM orders LIMIT 5")]
        # Airflow has the connection only, as the README's local quick start sets it up.
        conn = holding_the_configuration(
            dblog_connection(redis_server, pg15, dbs.config.name, pipeline.config_path),
            pipeline.config_path,
        )
        home = tmp_path / "airflow"
        ui = stack.enter_context(
            running_ui(pipeline.config_path, cli_env(dbs, redis_server), tmp_path)
        )
        conn["extra"]["ui_url"] = ui
        env = airflow_env(home, conn, AIRFLOW__CORE__TEST_CONNECTION="Enabled")
        with airflow_server(home, env) as airflow, chromium(tmp_path) as page:
            for dag_id in ("dblog_dump", "dblog_repair"):
                airflow.wait_dag(dag_id)
            assert airflow.client is not None
            token = airflow.client.headers["Authorization"].removeprefix("Bearer ")
            page.send("Network.setCookie", name="_token", value=token, url=f"{airflow.url}/")

            # dblog_dump's form: only what is needed is marked required; 0 stays 0.
            open_trigger_form(page, airflow, "dblog_dump")
            required = page.evaluate(
                "Object.fromEntries([...document.querySelectorAll('[role=group] label')]"
                ".map(l => [l.innerText.split('\\n')[0].trim(), l.innerText.includes('*')]))"
            )
            shown = ("source", "tables", "keys", "where", "chunk_size", "read_only")
            assert {k: required.get(k) for k in shown} == {
                "source": True,
                "tables": False,
                "keys": False,
                "where": False,  # empty: no filter
                "chunk_size": False,  # empty: the mode's default
                "read_only": False,  # a switch, off unless turned on
            }, required
            page.type_into("[name=element_chunk_size]", "0")
            page.evaluate("document.querySelector('#element_keys').focus()")  # leave the field
            assert page.evaluate("document.querySelector('[name=element_chunk_size]').value") == "0"
            page.screenshot(shots / "1-dump-form.png")
            # Triggered, it is refused there, naming the param and the bound, and no run starts.
            page.click_text("[role=dialog] button", "Trigger")
            refused = refusal(page)
            page.screenshot(shots / "1b-dump-refused.png")
            assert "Invalid input for param chunk_size: 0 is less than the minimum of 1" in refused
            assert "How many rows" not in refused and len(refused) < 400, refused
            assert airflow.api("GET", "/api/v2/dags/dblog_dump/dagRuns")["total_entries"] == 0

            # dblog_repair's docs, on its page.
            page.navigate(f"{airflow.url}/dags/dblog_repair")
            page.click("button[aria-label='Dag Docs']")
            page.wait("document.body.innerText.includes('re-send given rows')", "the DAG's docs")
            page.screenshot(shots / "2-repair-docs.png")

            # Keys unlike one another fit no table: refused at Trigger, naming the key.
            open_trigger_form(page, airflow, "dblog_repair")
            chunk_help = page.evaluate(
                "document.querySelector('[name=element_chunk_size]').closest('[role=group]')"
                ".innerText"
            )
            assert "Empty: 10,000 (100,000 in a deployment with a lake)." in chunk_help
            assert "direct" not in chunk_help and "sequenced" not in chunk_help, chunk_help
            page.type_into("#element_table", "public.orders")
            page.type_into("#element_keys", json.dumps([keys[0], keys[1][:1]]))
            page.click_text("[role=dialog] button", "Trigger")
            refused = refusal(page)
            page.screenshot(shots / "3a-repair-keys-refused.png")
            assert f"Invalid input for param keys: {keys[1][:1]!r} is too short" in refused
            assert airflow.api("GET", "/api/v2/dags/dblog_repair/dagRuns")["total_entries"] == 0

            # A repair of composite keys, typed as `dblog dump --keys` takes them.
            page.type_into("#element_keys", json.dumps(keys))
            page.type_into("[name=element_chunk_size]", "2")
            page.screenshot(shots / "3-repair-form.png")
            repair_run = trigger_from_form(page)

            # A repair of a table that is not captured.
            open_trigger_form(page, airflow, "dblog_repair")
            page.type_into("#element_table", "public.nope")
            page.type_into("#element_keys", "1,2")
            bad_run = trigger_from_form(page)

            # A repair by a filter the source refuses: it calls a volatile function.
            open_trigger_form(page, airflow, "dblog_repair")
            page.type_into("#element_table", "public.accounts")
            page.type_into("#element_where", VOLATILE_FILTER)
            page.screenshot(shots / "3b-repair-filter-form.png")
            filter_run = trigger_from_form(page)
            try:
                state = airflow.wait_run("dblog_repair", filter_run, 300, fail_fast=True)
                report = airflow.report("dblog_repair", filter_run)
                assert state == "failed", report
                assert airflow.task_states("dblog_repair", filter_run)["check_request"] == "failed"
                check_log = airflow.task_log("dblog_repair", filter_run, "check_request", 1)
                assert "calls random(), which is volatile" in check_log, report
                sent = airflow.api("GET", f"/api/v2/dags/dblog_repair/dagRuns/{filter_run}")
                assert sent["conf"]["where"] == VOLATILE_FILTER, sent["conf"]
                assert not sent["conf"].get("keys"), sent["conf"]

                state = airflow.wait_run("dblog_repair", bad_run, 300, fail_fast=True)
                report = airflow.report("dblog_repair", bad_run)
                assert state == "failed", report
                assert airflow.task_states("dblog_repair", bad_run)["check_request"] == "failed"
                check_log = airflow.task_log("dblog_repair", bad_run, "check_request", 1)
                assert "table public.nope is not captured by source" in check_log, report

                state = airflow.wait_run("dblog_repair", repair_run, 300, fail_fast=True)
                assert state == "success", airflow.report("dblog_repair", repair_run)
            finally:
                # A failed test must not leave the detached Spark application dumping.
                pipeline.store.dumps.cancel(dump_id_for("dblog_repair", repair_run, "dump"))
            page.navigate(f"{airflow.url}/dags/dblog_repair/runs/{repair_run}")
            page.wait("document.body.innerText.includes('dump')", "the run's page")
            page.screenshot(shots / "4-repair-run.png")

            # The dump task links to its dump in the live view, which links back to the run.
            dump_id = dump_id_for("dblog_repair", repair_run, "dump")
            link = live_view_url(ui, dump_id)
            links = airflow.api(
                "GET", f"/api/v2/dags/dblog_repair/dagRuns/{repair_run}/taskInstances/dump/links"
            )
            assert links["extra_links"] == {"DBLog live view": link}, links
            page.navigate(f"{airflow.url}/dags/dblog_repair/runs/{repair_run}/tasks/dump/details")
            shown = f"[...document.querySelectorAll('a')].find(a => a.href === {json.dumps(link)})"
            try:
                assert page.wait(f"{shown}?.textContent", "the link") == "DBLog live view"
            finally:
                page.screenshot(shots / "5-dump-task-link.png")
            page.navigate(link)
            back = page.wait(
                f"document.querySelector('.dump[data-dump-id=\"{dump_id}\"] .origin a')?.href",
                "the dump's page",
            )
            assert back == f"{airflow.url}/dags/dblog_repair/runs/{quote(repair_run, safe='')}"
            page.screenshot(shots / "6-live-view-dump.png")

            sent = airflow.api("GET", f"/api/v2/dags/dblog_repair/dagRuns/{repair_run}")["conf"]
            assert sent["keys"] == keys, sent  # the form sent the JSON typed, as JSON
            result = airflow.xcom("dblog_repair", repair_run, "dump")

            # What the connection form's Test button asks the api-server: a connection without
            # its configuration, and one whose sections (JSON in the form) capture no table,
            # named as the TOML's loader names it.
            section = {"name": "shop", "dsn": "host=db dbname=shop user=dblog", "tables": []}
            cases = {
                "this connection needs config_path in its extras": {"source_name": "shop"},
                "this connection: the PostgreSQL source captures no table: list at least one": {
                    "source": section,
                    "output": {"type": "ndjson"},
                },
            }
            for message, extra in cases.items():
                tested = airflow.api(
                    "POST",
                    "/api/v2/connections/test",
                    json={
                        "connection_id": "my_dblog",
                        "conn_type": "dblog",
                        "host": redis_server.host,
                        "extra": json.dumps(extra),
                    },
                )
                assert tested == {"status": False, "message": message}

        wait_caught_up(dbs)
        with psycopg.connect(dbs.source_dsn) as source, psycopg.connect(dbs.target_dsn) as target:
            query = "SELECT row_to_json(t)::text FROM orders t WHERE (region, n) = (%s, %s)"
            expected = [source.execute(query, key).fetchone() for key in keys]
            repaired = [target.execute(query, key).fetchone() for key in keys]
            others = target.execute("SELECT count(*) FROM orders").fetchone()
        assert None not in expected and repaired == expected
        assert others == (len(keys),)
        dump_id = dump_id_for("dblog_repair", repair_run, "dump")
        assert result["state"] == "done" and result["rows"] == len(keys), result
        assert result["chunks"] == -(-len(keys) // 2) and result["windows_retried"] >= 0, result
        assert result["spark_log"] == str(driver_log_path(dump_id)), result
        assert Path(result["spark_log"]).stat().st_size > 0
