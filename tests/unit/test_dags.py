"""The DAGs of dags/ as the DAG processor and the trigger form see them: they import with their
docs, their tasks chain as `dump_chain` builds them, their params are optional or required
as the form shows them, what the form sends reaches the operators unchanged, and their
schemas refuse bad input by name."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

DAGS = Path(__file__).resolve().parents[2] / "dags"
TOML = """
[source]
name = "shop"
dsn = "host=127.0.0.1 port=5432 dbname=shop user=dblog"
tables = ["public.accounts", "public.orders"]

[redis]
url = "redis://127.0.0.1:6379/0"

[output]
type = "ndjson"
directory = "out"
"""


def dag_bag() -> Any:
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(str(DAGS))
    assert bag.import_errors == {}
    return bag


def is_required(schema: dict[str, Any]) -> bool:
    """The red asterisk of Airflow 3.3's form (`isParamRequired.tsx`): a type without "null"."""
    kind = schema.get("type")
    return bool(kind) and not (isinstance(kind, list) and "null" in kind)


def sent_by_text_box(schema: dict[str, Any], text: str) -> Any:
    """What the form sends for text typed into a field of several types (Airflow 3.3,
    `FieldMultiType.tsx`): the text as JSON when it parses to one of the types, else the text
    itself when a string is allowed; an empty box sends null."""
    if text == "":
        return None
    types = [t for t in schema["type"] if t != "null"]
    try:
        parsed = json.loads(text)
    except ValueError:
        return text
    kind = {list: "array", str: "string", dict: "object", bool: "boolean"}.get(type(parsed))
    return parsed if kind in types else text


def test_every_dag_imports_with_its_docs_tasks_and_params() -> None:
    bag = dag_bag()
    assert set(bag.dag_ids) == {
        "dblog_backfill",
        "dblog_dump",
        "dblog_repair",
        "dblog_on_change",
        "dblog_lake_maintenance",
        "dblog_lake_compaction",
        "dblog_verify",
    }
    expected_params = {
        "dblog_backfill": {"tables", "chunk_size", "parallelism", "mode"},
        "dblog_dump": {
            *("source", "tables", "keys", "where", "chunk_size", "parallelism", "mode"),
            "read_only",
        },
        "dblog_repair": {"table", "keys", "where", "chunk_size", "read_only"},
    }
    for dag_id, params in expected_params.items():
        dag = bag.dags[dag_id]
        assert {t.task_id for t in dag.tasks} == {"check_request", "wait_for_tailer", "dump"}
        assert dag.get_task("check_request").downstream_task_ids == {"wait_for_tailer"}
        assert dag.get_task("wait_for_tailer").downstream_task_ids == {"dump"}
        assert set(dag.params.keys()) == params
        assert dag.catchup is False
        assert dag.doc_md and dag.doc_md.startswith(f"### {dag_id}:"), dag.doc_md
    assert bag.dags["dblog_backfill"].schedule == "0 3 * * 0"
    assert bag.dags["dblog_dump"].schedule is None and bag.dags["dblog_repair"].schedule is None
    # The change DAG's asset is watched through common-messaging's trigger, which serializes as
    # DBLog's change trigger: that is what the triggerer runs.
    orders = bag.dags["dblog_on_change"].schedule
    assert orders.uri == "dblog://shop/public.orders"
    (watcher,) = orders.watchers
    assert type(watcher.trigger).__name__ == "MessageQueueTrigger"
    classpath, kwargs = watcher.trigger.serialize()
    assert classpath == "airflow_provider_dblog.triggers.changes.DBLogChangeTrigger"
    assert (kwargs["source"], kwargs["tables"]) == ("shop", ["public.orders"])


def test_the_verify_dag_repairs_that_run_at_once_or_after_an_approval() -> None:
    dag = dag_bag().dags["dblog_verify"]
    assert set(dag.params.keys()) == {
        *("table", "after", "upto", "where", "repair", "approve_above", "target"),
        *("chunk_size", "parallelism", "spark_conn_id"),
    }
    assert dag.params["repair"] == "none" and dag.doc_md.startswith("### dblog_verify:")
    assert dag.get_task("verify").downstream_task_ids == {"decide"}
    assert dag.get_task("decide").downstream_task_ids == {"approve", "no_approval_needed"}
    assert dag.get_task("repair").upstream_task_ids == {"approve", "no_approval_needed"}
    assert type(dag.get_task("approve")).__name__ == "ApprovalOperator"
    assert dag.get_task("repair").repair == "auto"  # type: ignore[attr-defined]
    assert dag.get_task("verify").retries == dag.get_task("repair").retries == 2  # resume the run


def test_optional_params_are_optional_in_the_form_and_counts_say_what_they_are() -> None:
    bag = dag_bag()
    required = {
        dag_id: {name for name, p in bag.dags[dag_id].params.items() if is_required(p.schema)}
        for dag_id in ("dblog_backfill", "dblog_dump", "dblog_repair")
    }
    assert required == {
        "dblog_backfill": {"parallelism"},
        "dblog_dump": {"source", "parallelism"},  # read_only: a switch, off by default
        "dblog_repair": {"table"},  # keys or where: `check_request` asks for one
    }
    # An empty chunk size is the mode's default (`dump/request.py`), as its help says.
    forms = ("dblog_backfill", "dblog_dump", "dblog_repair")
    assert [bag.dags[d].params["chunk_size"] for d in forms] == [None] * 3
    for dag in bag.dags.values():
        for name in ("chunk_size", "parallelism"):
            if name in dag.params:
                param = dag.params.get_param(name)
                assert "at least 1" in param.description, (dag.dag_id, name)
                # The form's number field would silently clamp a typed 0 to a top-level
                # minimum; the bound sits in an allOf, which the api-server checks at trigger.
                assert not {"minimum", "maximum", "exclusiveMinimum"} & set(param.schema)
                assert param.schema["allOf"] == [{"minimum": 1}], param.schema
                assert "description_md" not in param.schema, param.schema
        if "chunk_size" in dag.params:
            help_text = dag.params.get_param("chunk_size").description
            assert "one chunk reads" in help_text and "watermark" not in help_text
            if "mode" in dag.params:
                assert "Empty: 10,000 sequenced, 100,000 direct." in help_text
            elif dag.dag_id == "dblog_repair":  # no mode in its form: its help speaks of none
                assert "sequenced" not in help_text and "direct" not in help_text, help_text
                assert "Empty: 10,000 (100,000 in a deployment with a lake)." in help_text


def test_the_mode_select_shows_words_for_every_choice() -> None:
    """Airflow 3.3's select (`FieldDropdown.tsx`) labels a choice by `values_display`, keyed by
    the value as text ("null" for None), else shows the value itself: `null`."""
    for dag_id in ("dblog_backfill", "dblog_dump"):
        schema = dag_bag().dags[dag_id].params.get_param("mode").schema
        labels = schema["values_display"]
        assert set(labels) == {"null" if v is None else v for v in schema["enum"]}
        assert labels["null"] == "the deployment's default"
        assert "the tailer sends them" in schema["description_md"]
        assert "lw" not in schema["description_md"].split()


def serialized_params(dag_id: str) -> Any:
    """The DAG's params as the api-server holds them, after serialization."""
    from airflow.serialization.serialized_objects import DagSerialization

    dag = dag_bag().dags[dag_id]
    return DagSerialization.from_dict(DagSerialization.to_dict(dag)).params


@pytest.mark.parametrize(
    ("dag_id", "conf", "bad"),
    [
        ("dblog_repair", {"table": "public.orders", "keys": "1", "chunk_size": 0}, "chunk_size"),
        ("dblog_dump", {"chunk_size": -5}, "chunk_size"),
        ("dblog_dump", {"parallelism": 0}, "parallelism"),
        ("dblog_backfill", {"parallelism": -1}, "parallelism"),
        ("dblog_dump", {"keys": [None]}, "keys"),
    ],
)
def test_the_trigger_refuses_counts_below_1_before_the_run_starts(
    dag_id: str, conf: dict[str, Any], bad: str
) -> None:
    """What the api-server runs on a trigger (`create_dagrun`: the conf merged into the
    params, then validated) refuses the conf, naming the param: no run is created. The form
    shows the message as it is: short, the bound and the value, never the param's help."""
    from airflow.sdk.exceptions import ParamValidationError

    params = serialized_params(dag_id)
    with pytest.raises(ParamValidationError, match=f"^Invalid input for param {bad}: ") as no:
        params.deep_merge(conf).validate()
    if bad != "keys":
        assert str(no.value).startswith(
            f"Invalid input for param {bad}: {conf[bad]} is less than the minimum of 1\n"
        ), no.value
        assert "{'minimum': 1}" in str(no.value) and len(str(no.value)) < 300, no.value
    assert "description" not in str(no.value), no.value
    good = {**conf, bad: 1 if bad != "keys" else [1]}
    params.deep_merge(good).validate()


@pytest.mark.parametrize(
    ("keys", "refused"),
    [
        ([["eu", 7], ["us"], ["eu", "x"]], "['us'] is too short"),
        ([["eu", 7], ["us", 1, 2]], "['us', 1, 2] is too long"),
        ([["eu", 1], []], "[] should be non-empty"),
        ([1, ["eu", 2]], "['eu', 2] is not of type 'string', 'number', 'boolean'"),
        ([{"region": "eu", "n": 1}, ["us", 2]], "['us', 2] is not of type 'object'"),
        ([["eu", ""]], "'' should be non-empty"),
        ([[["eu"], 1]], "['eu'] is not of type 'string', 'number', 'boolean'"),
        ([{}], "{} should be non-empty"),
    ],
)
def test_the_trigger_refuses_a_key_list_that_fits_no_table(keys: Any, refused: str) -> None:
    """Keys unlike the first, or a key without a value, fit no table's primary key: refused
    at trigger, naming the key, before a run starts."""
    from airflow.sdk.exceptions import ParamValidationError

    for dag_id, conf in (
        ("dblog_dump", {"tables": ["public.orders"]}),
        ("dblog_repair", {"table": "public.orders"}),
    ):
        params = serialized_params(dag_id)
        with pytest.raises(ParamValidationError) as no:
            params.deep_merge({**conf, "keys": keys}).validate()
        assert str(no.value).startswith(f"Invalid input for param keys: {refused}\n"), no.value
        assert "Primary keys of" not in str(no.value)  # the help stays out of the message


@pytest.mark.parametrize(
    "keys",
    [
        [["eu", 1], ["us", 2]],
        [1, "2", 3.5, True],
        [{"region": "eu", "n": 1}, {"n": 2, "region": "us"}],
        ["a" * 3] * 40,
        [list(range(32)), list(range(32))],
        "1,2,3",
        '[["eu", 1], ["us"]]',  # text: `check_request` judges it against the key
        [],
    ],
)
def test_the_trigger_takes_key_lists_alike(keys: Any) -> None:
    params = serialized_params("dblog_repair")
    params.deep_merge({"table": "public.orders", "keys": keys}).validate()


@pytest.mark.parametrize(
    ("text", "keys"),
    [
        ('[["eu", 1], ["us", 2]]', [["eu", 1], ["us", 2]]),
        ('[{"region": "eu", "n": 1}]', [{"region": "eu", "n": 1}]),
        ("1,2,3", "1,2,3"),
        ("1e3", "1e3"),
        ("None", "None"),
        ("True", "True"),
        ("", None),
    ],
)
def test_the_keys_typed_into_the_form_reach_the_request_as_sent(text: str, keys: Any) -> None:
    dag = dag_bag().dags["dblog_dump"]
    params = copy.deepcopy(dag.params)
    conf = {
        "source": "dblog_default",
        "tables": ["public.orders"],
        "keys": sent_by_text_box(params.get_param("keys").schema, text),
        "chunk_size": 50,
        "parallelism": 1,
    }
    assert conf["keys"] == keys
    params.update(conf)
    context: Any = {"params": params.validate()}
    for task_id in ("check_request", "dump"):
        task = copy.deepcopy(dag.get_task(task_id))
        task.render_template_fields(context)
        assert (task.dblog_conn_id, task.tables, task.keys) == (
            "dblog_default",
            ["public.orders"],
            keys,
        )
        assert (task.chunk_size, task.parallelism) == (50, 1)


@pytest.mark.parametrize(
    "text",
    ["TRUE", "None", "1e3 < n", "region = 'eu' AND note LIKE '%{{ x }}%'", "  n > 1  "],
)
def test_the_filter_typed_into_the_form_reaches_the_request_as_typed(text: str) -> None:
    """No Jinja on the way: `TRUE` stays text (not a bool), `{{ x }}` stays in the LIKE."""
    for dag_id, conf in (
        ("dblog_dump", {"tables": ["public.orders"], "where": text, "read_only": True}),
        ("dblog_repair", {"table": "public.orders", "where": text, "read_only": True}),
    ):
        dag = dag_bag().dags[dag_id]
        params = copy.deepcopy(dag.params)
        params.update(conf)
        context: Any = {"params": params.validate()}
        for task_id in ("check_request", "dump"):
            task = copy.deepcopy(dag.get_task(task_id))
            task.render_template_fields(context)
            assert (task.tables, task.keys, task.where) == (["public.orders"], None, text)
            assert task.read_only is True


def test_an_empty_filter_box_sends_no_filter() -> None:
    dag = dag_bag().dags["dblog_dump"]
    params = copy.deepcopy(dag.params)
    assert dag.params["where"] is None and dag_bag().dags["dblog_repair"].params["where"] is None
    params.update({"where": None})
    task = copy.deepcopy(dag.get_task("dump"))
    task.render_template_fields({"params": params.validate()})  # type: ignore[arg-type]
    assert task.where is None
    assert task.read_only is False  # the checkbox's default: watermarks written as before


def test_read_only_left_empty_through_the_api_writes_as_before() -> None:
    from airflow_provider_dblog.operators.request import flag

    dag = dag_bag().dags["dblog_repair"]
    params = copy.deepcopy(dag.params)
    params.update({"table": "public.orders", "keys": "1", "read_only": None})
    task = copy.deepcopy(dag.get_task("check_request"))
    task.render_template_fields({"params": params.validate()})  # type: ignore[arg-type]
    assert task.read_only is None and flag("read_only", task.read_only) is False


def test_the_repair_form_sends_its_one_table_as_a_list_of_one() -> None:
    dag = dag_bag().dags["dblog_repair"]
    params = copy.deepcopy(dag.params)
    params.update({"table": "public.orders", "keys": '[["eu", 1]]', "chunk_size": 10})
    task = copy.deepcopy(dag.get_task("check_request"))
    task.render_template_fields({"params": params.validate()})  # type: ignore[arg-type]
    assert (task.tables, task.keys, task.chunk_size) == (["public.orders"], '[["eu", 1]]', 10)
    # A repair never dumps a whole table: without keys or a filter its check refuses it.
    assert task.subset_only and dag.get_task("dump").subset_only
    assert not dag_bag().dags["dblog_dump"].get_task("check_request").subset_only


def test_the_captured_tables_are_the_forms_choices(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "dblog.toml"
    config.write_text(TOML)
    extra = {"source_name": "shop", "config_path": str(config)}
    connection = {"conn_type": "dblog", "extra": extra}
    monkeypatch.setenv("AIRFLOW_CONN_DBLOG_DEFAULT", json.dumps(connection))
    dags = dag_bag().dags
    choices = ["public.accounts", "public.orders"]
    for dag_id in ("dblog_dump", "dblog_backfill"):
        assert dags[dag_id].params.get_param("tables").schema["examples"] == choices
    assert dags["dblog_repair"].params.get_param("table").schema["examples"] == choices


def test_without_a_readable_config_the_forms_take_table_names_as_text(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    connection = {"conn_type": "dblog", "extra": {"source_name": "s", "config_path": "/nowhere"}}
    monkeypatch.setenv("AIRFLOW_CONN_DBLOG_DEFAULT", json.dumps(connection))
    dags = dag_bag().dags
    assert "examples" not in dags["dblog_dump"].params.get_param("tables").schema
    assert "examples" not in dags["dblog_repair"].params.get_param("table").schema


@pytest.mark.parametrize(
    ("dag_id", "conf", "bad"),
    [
        ("dblog_dump", {"parallelism": "two"}, "parallelism"),
        ("dblog_dump", {"chunk_size": 2.5}, "chunk_size"),
        ("dblog_dump", {"tables": "public.accounts"}, "tables"),
        ("dblog_dump", {"tables": [1]}, "tables"),
        ("dblog_dump", {"keys": 5}, "keys"),
        ("dblog_dump", {"source": ""}, "source"),
        ("dblog_dump", {"where": 5}, "where"),
        ("dblog_dump", {"where": ["active"]}, "where"),
        ("dblog_repair", {"table": "public.accounts", "where": True}, "where"),
        ("dblog_dump", {"read_only": "maybe"}, "read_only"),
        ("dblog_repair", {"keys": [1]}, "table"),
    ],
)
def test_params_schema_refuses_bad_input_naming_the_param(
    dag_id: str, conf: dict[str, Any], bad: str
) -> None:
    from airflow.sdk.exceptions import ParamValidationError

    params = copy.deepcopy(dag_bag().dags[dag_id].params)
    with pytest.raises(ParamValidationError, match=f"param {bad}:"):
        params.update(conf)  # what a run's conf does to the DAG's params
        params.validate()
