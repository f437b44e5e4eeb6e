"""A fuzz of the DAG params (Hypothesis) against a real source and Redis: a good conf of the
shape the trigger form sends (keys, or a filter), with one field replaced by an arbitrary
value (a filter among them: text the source's server judges). Each conf is
either refused by the DAG's params schema, naming that param (the trigger fails), or passes
it and then the run's first task, `check_request`, accepts it or fails without retry naming
that field. Either way nothing is registered in the state store.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_provider_dblog.devservices.postgres import PostgresInfo
from airflow_provider_dblog.devservices.redis import RedisInfo
from tests.integration.airflow_support import dblog_connection
from tests.integration.spark_support import Pipeline, running_pipeline

pytestmark = pytest.mark.integration
DAGS = Path(__file__).resolve().parents[2] / "dags"

GOOD = [
    (
        "dblog_dump",
        {
            "source": "dblog_default",
            "tables": ["public.orders"],
            "keys": '[["eu", 1], ["us", 2]]',
            "where": None,
            "chunk_size": 100,
            "parallelism": 1,
        },
    ),
    (
        "dblog_dump",
        {
            "source": "dblog_default",
            "tables": ["public.orders"],
            "keys": None,
            "where": "region = 'eu' AND n % 2 = 0",
            "chunk_size": 100,
            "parallelism": 1,
        },
    ),
    ("dblog_repair", {"table": "public.accounts", "keys": "1,2,3", "chunk_size": 100}),
    (
        "dblog_repair",
        {"table": "public.accounts", "keys": None, "where": "active AND id < 9", "chunk_size": 7},
    ),
]
"""Confs each DAG's check accepts, as the form sends them: keys, or a filter."""

NAMED_BY = {
    "source": ("source", "conn_id", "connection"),
    # Another table: the keys may not fit its primary key, the filter its columns.
    "tables": ("table", "key", "filter"),
    "table": ("table", "key", "filter"),
    "keys": ("key",),
    "where": ("filter", "where"),
    "chunk_size": ("chunk_size",),
    "parallelism": ("parallelism",),
}
"""The words of which a message about a field names at least one."""

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)
table_names = st.sampled_from(["public.accounts", "public.orders", "orders", "public.nope"]) | (
    st.text(max_size=20)
)
key_texts = st.lists(
    st.sampled_from(["1", "2", "eu", "1e3", "None", "True", "", " ", ",", "[", "]", '"x"']),
    max_size=6,
).map("".join)
key_values = st.one_of(
    st.integers(),
    st.text(max_size=5),
    st.lists(st.integers() | st.text(max_size=3) | st.none(), max_size=3),
    st.fixed_dictionaries({"region": st.text(max_size=3), "n": st.integers()}),
)
filter_texts = st.lists(
    st.sampled_from(
        ["id", "n", "active", "region", " = ", " > ", "1", "'eu'", " AND ", " OR ", "(", ")",
         ";", "--", "/*", "$$", "'", '"', "now()", "random()", "pg_sleep(0)", "SELECT",
         " orders", "%", "{{ x }}", " "]
    ),
    max_size=7,
).map("".join)  # fmt: skip
"""Filters made of the pieces of good and bad ones: the source's server judges them."""
FIELD_VALUES = {
    "source": st.text(alphabet=st.characters(codec="ascii", categories=["L", "N"]), max_size=12),
    "tables": json_values | st.lists(table_names, max_size=3),
    "table": json_values | table_names,
    "keys": json_values | key_texts | st.lists(key_values, max_size=4),
    "where": json_values | filter_texts | st.text(max_size=30),
    "chunk_size": json_values | st.integers(min_value=-3, max_value=3),
    "parallelism": json_values | st.integers(min_value=-3, max_value=3),
}


@st.composite
def confs(draw: st.DrawFn) -> tuple[str, str, dict[str, Any]]:
    """(DAG id, the field replaced, the conf)."""
    dag_id, good = draw(st.sampled_from(GOOD))
    conf = dict(good)
    field = draw(st.sampled_from(sorted(conf)))
    conf[field] = draw(FIELD_VALUES[field])
    return dag_id, field, conf


@pytest.fixture
def pipeline(
    pg15: PostgresInfo,
    redis_server: RedisInfo,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Pipeline]:
    with running_pipeline(pg15, redis_server, tmp_path, rows=20) as pipeline:
        connection = dblog_connection(
            redis_server, pg15, pipeline.dbs.config.name, pipeline.config_path
        )
        monkeypatch.setenv("AIRFLOW_CONN_DBLOG_DEFAULT", json.dumps(connection))
        yield pipeline


def check_request(dag: Any, params: dict[str, Any]) -> Any:
    """Run the DAG's first task on `params` as a run would; its result."""
    task = copy.deepcopy(dag.get_task("check_request"))
    ti = SimpleNamespace(dag_id=dag.dag_id, run_id="fuzz", task_id=task.task_id, map_index=-1)
    context: Any = {"params": params, "ti": ti}
    task.render_template_fields(context)
    return task.execute(context)


def test_every_bad_param_fails_the_trigger_or_the_first_task_naming_it(
    pipeline: Pipeline,
) -> None:
    from airflow.dag_processing.dagbag import DagBag
    from airflow.sdk.exceptions import AirflowFailException, ParamValidationError

    bag = DagBag(str(DAGS))
    assert bag.import_errors == {}
    outcomes: dict[str, int] = {}

    @settings(
        max_examples=200,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(confs())
    def fuzz(case: tuple[str, str, dict[str, Any]]) -> None:
        dag_id, field, conf = case
        dag = bag.dags[dag_id]
        params = copy.deepcopy(dag.params)
        try:
            params.update(conf)
            validated = params.validate()
        except ParamValidationError as refused:
            assert f"param {field}:" in str(refused), (conf, str(refused))
            outcomes["trigger refused"] = outcomes.get("trigger refused", 0) + 1
        else:
            try:
                check_request(dag, validated)
            except AirflowFailException as failed:
                message = str(failed)
                assert any(word in message for word in NAMED_BY[field]), (field, conf, message)
                outcomes["first task failed"] = outcomes.get("first task failed", 0) + 1
            except Exception as failed:  # the source connection that does not exist
                assert field == "source", (conf, repr(failed))
                assert conf["source"] in str(failed), (conf, repr(failed))
                outcomes["no such connection"] = outcomes.get("no such connection", 0) + 1
            else:
                outcomes["accepted"] = outcomes.get("accepted", 0) + 1
        assert pipeline.store.dumps.ids() == []

    fuzz()
    # The fuzz reached each way a conf can end, so none of the checks above was vacuous.
    assert set(outcomes) == {
        "trigger refused",
        "first task failed",
        "no such connection",
        "accepted",
    }, outcomes
