"""The dump request checks behind the Airflow hook and operators, on real PostgreSQL and Redis:
the same refusals as `dblog dump` (key values against their columns' types, filters the
server refuses, a source no tailer has set up, unknown tables), failing the task without
retry and storing nothing; a source out of reach fails it as retryable."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_provider_dblog.devservices.postgres import PostgresInfo
from airflow_provider_dblog.devservices.redis import RedisInfo
from airflow_provider_dblog.state import StateStore
from tests.integration.airflow_support import dblog_connection
from tests.integration.e2e_support import Databases, drop_databases, make_databases, write_config

pytestmark = pytest.mark.integration


@dataclass
class Checks:
    dbs: Databases
    store: StateStore
    toml: Path


@pytest.fixture(scope="module")
def source(pg15: PostgresInfo, redis_server: RedisInfo) -> Iterator[Databases]:
    dbs = make_databases(pg15, 10, target=False, seed_value=3)
    try:
        dbs.source.ensure_setup()
        yield dbs
    finally:
        drop_databases(dbs)


@pytest.fixture
def checks(
    source: Databases,
    pg15: PostgresInfo,
    redis_server: RedisInfo,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Checks:
    """A `dblog_checks` connection on the source, its TOML in `tmp_path`."""
    toml = write_config(tmp_path / "dblog.toml", source, redis_server, {"type": "ndjson"})
    conn = dblog_connection(redis_server, pg15, source.config.name, toml)
    monkeypatch.setenv("AIRFLOW_CONN_DBLOG_CHECKS", json.dumps(conn))
    store = StateStore(redis_server.client(), source.config.name)
    return Checks(source, store, toml)


def context() -> Any:
    ti = SimpleNamespace(dag_id="d", run_id=f"r{uuid.uuid4().hex[:6]}", task_id="t", map_index=-1)
    return {"ti": ti}


@pytest.mark.parametrize(
    ("tables", "keys", "message"),
    [
        (
            ["public.accounts"],
            ["7", "abc"],
            "key value 'abc' is not a valid bigint for column id of public.accounts",
        ),
        (["accounts"], "1, 2, x", "key value 'x' is not a valid bigint for column id"),
        (["public.orders"], [["eu", "one"]], "'one' is not a valid integer for column n"),
        (["public.items"], ["not-a-uuid"], "is not a valid uuid for column id of public.items"),
        (["public.nope"], None, "table public.nope is not captured"),
        (["public.orders"], "eu,1", "composite primary key"),
    ],
)
def test_bad_requests_fail_the_check_and_the_dump_without_retry(
    checks: Checks, tables: list[str], keys: Any, message: str
) -> None:
    from airflow.sdk.exceptions import AirflowFailException

    from airflow_provider_dblog.operators.dblog import (
        DBLogCheckDumpRequestOperator,
        DBLogDumpOperator,
    )

    for operator in (
        DBLogCheckDumpRequestOperator(
            task_id="check", dblog_conn_id="dblog_checks", tables=tables, keys=keys
        ),
        DBLogDumpOperator(task_id="dump", dblog_conn_id="dblog_checks", tables=tables, keys=keys),
    ):
        with pytest.raises(AirflowFailException, match=r"^bad dump request: ") as failed:
            operator.execute(context())
        assert message in str(failed.value)
        assert "\n" not in str(failed.value)
    assert checks.store.dumps.ids() == []


BAD_FILTERS = {
    "syntax-error": (["public.accounts"], None, "owner = = 'x'", "on public.accounts is not valid"),
    "unknown-column": (["public.accounts"], None, "no_such_column = 1", "no_such_column"),
    "second-statement": (["public.accounts"], None, "id = 1; DROP TABLE accounts", "no ';'"),
    "subquery": (["public.accounts"], None, "id IN (SELECT n FROM orders)", "no subquery"),
    "other-table": (["public.accounts"], None, "EXISTS (TABLE orders)", "reads table"),
    "sleep": (["public.accounts"], None, "pg_sleep(1) IS NOT NULL", "volatile"),
    "sequence": (["public.accounts"], None, "id = nextval('e2e_version_seq')", "volatile"),
    "breaks-out": (["public.accounts"], None, "id = 1) OR (true", "closes a parenthesis"),
    "not-captured": (["public.nope"], None, "id > 1", "table public.nope is not captured"),
    "no-table": (None, None, "id > 1", "needs exactly one table and no keys"),
    "two-tables": (["public.accounts", "public.orders"], None, "id > 1", "exactly one table"),
    "with-keys": (["public.accounts"], "1,2", "id > 1", "exactly one table and no keys"),
    "not-text": (["public.accounts"], None, True, "where must be a condition"),
}  # fmt: skip
"""(tables, keys, where, what the failure says): what `dblog dump --where` refuses."""


@pytest.mark.parametrize(
    ("tables", "keys", "where", "message"), BAD_FILTERS.values(), ids=list(BAD_FILTERS)
)
def test_bad_filters_fail_the_check_and_the_dump_without_retry(
    checks: Checks, tables: Any, keys: Any, where: Any, message: str
) -> None:
    from airflow.sdk.exceptions import AirflowFailException

    from airflow_provider_dblog.operators.dblog import (
        DBLogCheckDumpRequestOperator,
        DBLogDumpOperator,
    )

    for operator in (
        DBLogCheckDumpRequestOperator(
            task_id="check", dblog_conn_id="dblog_checks", tables=tables, keys=keys, where=where
        ),
        DBLogDumpOperator(
            task_id="dump", dblog_conn_id="dblog_checks", tables=tables, keys=keys, where=where
        ),
    ):
        with pytest.raises(AirflowFailException) as failed:
            operator.execute(context())
        assert message in str(failed.value), str(failed.value)
        assert str(failed.value).startswith(("bad dump request: ", "where must be"))
    assert checks.store.dumps.ids() == []


def test_a_good_filter_is_checked_by_the_source_and_shown_by_the_check(checks: Checks) -> None:
    """A filter on the clock (`now()`, stable) is taken; the check task's result shows it as
    the source trimmed it, and a filter passed to the hook comes back in the request; a
    read-only check of this writable source passes and says so."""
    from airflow_provider_dblog.hooks.dblog import DBLogHook
    from airflow_provider_dblog.operators.dblog import DBLogCheckDumpRequestOperator

    where = "  active AND updated <= now() AND owner LIKE '%7%' "
    request, _ = DBLogHook("dblog_checks").build_request(
        "filtered", tables=["public.accounts"], where=where
    )
    assert (request.kind.value, request.where) == ("table", where.strip())
    check = DBLogCheckDumpRequestOperator(
        task_id="check",
        dblog_conn_id="dblog_checks",
        tables="public.accounts",
        where=where,
        read_only="true",
    )
    assert check.execute(context()) == {
        "kind": "table",
        "tables": ["public.accounts"],
        "keys": 0,
        "where": where.strip(),
        "read_only": True,
    }
    blank = DBLogCheckDumpRequestOperator(
        task_id="check", dblog_conn_id="dblog_checks", tables="public.accounts", where=" "
    )
    assert blank.execute(context())["where"] is None
    assert checks.store.dumps.ids() == []


def test_a_repair_needs_keys_or_a_filter(checks: Checks) -> None:
    from airflow.sdk.exceptions import AirflowFailException

    from airflow_provider_dblog.operators.dblog import DBLogCheckDumpRequestOperator

    def check(**request: Any) -> Any:
        return DBLogCheckDumpRequestOperator(
            task_id="check",
            dblog_conn_id="dblog_checks",
            tables=["public.accounts"],
            subset_only=True,
            **request,
        ).execute(context())

    for keys, where in ((None, None), ("", ""), ([], "   ")):
        with pytest.raises(AirflowFailException, match=r"^bad dump request: give keys or a"):
            check(keys=keys, where=where)
    assert check(keys="1,2")["keys"] == 2
    assert check(where="id < 5")["where"] == "id < 5"
    assert checks.store.dumps.ids() == []


@pytest.mark.parametrize(
    ("request_", "problems"),
    [
        (
            {"tables": ["public.orders"], "keys": '[["eu", 1, 2], ["us"]]', "chunk_size": 0},
            [
                "chunk_size must be a whole number of at least 1, got 0",
                "key #1 of public.orders has 3 value(s), the primary key (region, n) has 2",
                "key #2 of public.orders has 1 value(s)",
            ],
        ),
        (
            {"tables": ["public.orders"], "keys": [["eu", 7], ["us"], ["eu", "x"], ["us", "y"]]},
            [
                "key #2 of public.orders has 1 value(s), the primary key (region, n) has 2; "
                "key #3: key value 'x' is not a valid integer for column n of public.orders",
                "; key #4: key value 'y' is not a valid integer for column n",
            ],
        ),
        (
            {"tables": ["public.nope"], "subset_only": True, "parallelism": "two"},
            [
                "give keys or a filter (where)",
                "parallelism must be a whole number, got 'two'",
                "table public.nope is not captured by source",
            ],
        ),
        (
            {"tables": ["public.nope", "public.nada", "public.orders"], "mode": "fast"},
            ["tables public.nope, public.nada are not captured", "mode"],
        ),
        (
            {"tables": ["public.orders"], "read_only": "maybe"},
            ["read_only must be true or false, got 'maybe'"],
        ),
        (
            {"tables": ["public.orders"], "read_only": True, "mode": "direct"},
            ["a read-only dump is sequenced"],
        ),
        (
            {"tables": ["public.orders"], "keys": "eu,1"},
            [
                "public.orders has a composite primary key (region, n): give the keys as JSON, "
                'one list per key in that order, e.g. [["a", 1], ["b", 2]]'
            ],
        ),
    ],
)
def test_every_problem_of_a_request_is_named_in_one_failure(
    checks: Checks, request_: dict[str, Any], problems: list[str]
) -> None:
    """The first task of a run fails once, naming all that is wrong, so that the next try is
    the one that works."""
    from airflow.sdk.exceptions import AirflowFailException

    from airflow_provider_dblog.operators.dblog import DBLogCheckDumpRequestOperator

    check = DBLogCheckDumpRequestOperator(task_id="check", dblog_conn_id="dblog_checks", **request_)
    with pytest.raises(AirflowFailException) as failed:
        check.execute(context())
    message = str(failed.value)
    assert message.startswith("bad dump request: ") and "\n" not in message
    for problem in problems:
        assert problem in message, message
    assert checks.store.dumps.ids() == []


def test_good_keys_are_checked_and_normalised_by_the_source(checks: Checks) -> None:
    from airflow_provider_dblog.hooks.dblog import DBLogHook

    request, key_columns = DBLogHook("dblog_checks").build_request(
        "good", tables=["public.orders"], keys=[["eu", "7"], {"region": "eu", "n": 7}, ["us", 1]]
    )
    assert request.keys == (("eu", 7), ("us", 1))
    assert dict(key_columns) == {request.tables[0]: ("region", "n")}
    assert checks.store.dumps.ids() == []


def test_a_request_without_a_chunk_size_gets_its_modes(checks: Checks, tmp_path: Path) -> None:
    from airflow_provider_dblog.hooks.dblog import DBLogHook

    hook = DBLogHook("dblog_checks")
    assert hook.build_request("seq")[0].chunk_size == 10_000
    assert hook.build_request("given", chunk_size=700)[0].chunk_size == 700
    lake = tmp_path / "lake"
    checks.toml.write_text(checks.toml.read_text() + f'\n[lake]\nroot = "{lake}"\n')
    direct = DBLogHook("dblog_checks").build_request("direct")[0]
    assert (direct.mode.value, direct.chunk_size) == ("direct", 100_000)
    ro = DBLogHook("dblog_checks").build_request("read-only", read_only=True)[0]
    assert (ro.mode.value, ro.chunk_size, ro.read_only) == ("sequenced", 10_000, True)
    assert checks.store.dumps.ids() == []


def test_a_source_no_tailer_set_up_fails_naming_what_to_run(checks: Checks) -> None:
    from airflow.sdk.exceptions import AirflowFailException

    from airflow_provider_dblog.operators.dblog import DBLogCheckDumpRequestOperator

    checks.toml.write_text(
        checks.toml.read_text().replace("[source]\n", '[source]\nwatermark_schema = "nowhere"\n')
    )
    check = DBLogCheckDumpRequestOperator(task_id="check", dblog_conn_id="dblog_checks")
    with pytest.raises(AirflowFailException, match="dblog tail"):
        check.execute(context())
    assert checks.store.dumps.ids() == []


def test_a_source_out_of_reach_fails_as_retryable(checks: Checks) -> None:
    from airflow.sdk.exceptions import AirflowException, AirflowFailException

    from airflow_provider_dblog.operators.dblog import DBLogCheckDumpRequestOperator

    text = checks.toml.read_text()
    port = f"port={checks.dbs.pg.port} "
    assert port in text
    checks.toml.write_text(text.replace(port, "port=1 "))
    check = DBLogCheckDumpRequestOperator(task_id="check", dblog_conn_id="dblog_checks")
    with pytest.raises(AirflowException, match="cannot check the dump request now") as failed:
        check.execute(context())
    assert not isinstance(failed.value, AirflowFailException)
    assert checks.store.dumps.ids() == []


def test_a_login_the_source_refuses_fails_without_retry(
    checks: Checks, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wrong password is no outage: Airflow's retries would only meet it again."""
    from airflow.sdk.exceptions import AirflowFailException

    from airflow_provider_dblog.operators.dblog import DBLogCheckDumpRequestOperator

    wrong = "wrong-" + uuid.uuid4().hex
    conn = json.loads(os.environ["AIRFLOW_CONN_DBLOG_CHECKS"])
    conn["extra"]["source_password"] = wrong
    monkeypatch.setenv("AIRFLOW_CONN_DBLOG_CHECKS", json.dumps(conn))
    check = DBLogCheckDumpRequestOperator(task_id="check", dblog_conn_id="dblog_checks")
    with pytest.raises(AirflowFailException, match="refuses the login") as failed:
        check.execute(context())
    assert wrong not in str(failed.value)
    assert checks.store.dumps.ids() == []
