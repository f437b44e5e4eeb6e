"""The params of the DBLog DAGs, as Airflow's trigger form renders them, and how their values
reach the operators.

How the form reads a param's JSON schema (Airflow 3.3, `FlexibleForm/FieldSelector.tsx`):
a `type` that includes "null" is optional (no red asterisk, an empty field sends null); an
array with `examples` is a multi-select of those values; a type list of more than one non-null
type is a text box whose text is kept as JSON when it parses to one of the types, as the raw
text otherwise; a number field clamps what is typed to the schema's `minimum` and `maximum`
when it loses focus, silently, and reads no other bound. So the counts carry
`exclusiveMinimum: 0`: the form leaves a typed 0 as typed, and the api-server refuses the
trigger, naming the param (Airflow validates the conf against each param's schema before it
creates the run, and reports the first param refused). What a schema cannot judge (a key
list against the table's key, a filter, table names) `check_request`, the run's first task,
refuses at once with every problem in one message. The text of `keys` and `where` reaches
the request unchanged. The help is each schema's `description_md`, which the form renders as
Markdown (`description` it shows as plain text); an enum's labels are its `values_display`.

The values reach the operators through `ParamValue`, not `{{ params.x }}`: Jinja's native
rendering runs `ast.literal_eval` on a string it renders, so keys typed as `1e3`, `None` or
`True` would arrive as a float, as nothing (a whole-table dump) or as a bool, and a filter
typed as `TRUE` as a bool.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from airflow.sdk import BaseHook, Context, Param

from airflow_provider_dblog.hooks.dblog import DBLogConnection

log = logging.getLogger(__name__)

KEYS_HELP = (
    "As `dblog dump --keys` takes them: `1,2,3` for a one-column key, or JSON: "
    '`[["eu", 1], ["us", 2]]` for a composite key (one list per key, in primary-key order), '
    '`[{"region": "eu", "n": 1}]` by column name.'
)


@dataclass(frozen=True)
class ParamValue:
    """A DAG param's value for an operator's templated field, as the run's params hold it
    (validated, the conf over the defaults), without going through Jinja."""

    name: str

    def resolve(self, context: Context) -> Any:
        """Called by Airflow's templating for any templated value that has `resolve`."""
        return context["params"][self.name]

    def iter_references(self) -> tuple[()]:
        """No upstream task: it reads the run's params."""
        return ()


def captured_table_names(conn_id: str) -> list[str]:
    """The tables that the configuration of connection `conn_id` captures, offered as the
    forms' choices; empty when they cannot be read while the DAG is parsed (the form then takes
    names as text, and `check_request` checks them)."""
    try:
        config = DBLogConnection.parse(BaseHook.get_connection(conn_id), None).read_config()
    except Exception as exc:  # a form without choices beats a DAG that does not parse
        log.warning("no table choices in the DBLog forms: %s: %s", type(exc).__name__, exc)
        return []
    return [str(table) for table in config.source.tables]


def tables_param(choices: list[str]) -> Param:
    """Optional tables: a multi-select of `choices` if any, else one name per line."""
    schema: dict[str, Any] = {"type": ["array", "null"], "items": {"type": "string"}}
    if choices:
        schema["examples"] = choices
    return Param(
        None,
        description_md="Tables to dump (`schema.table`). Empty: every captured table.",
        **schema,
    )


def table_param(choices: list[str]) -> Param:
    """One required table, typed, with `choices` suggested while typing."""
    schema: dict[str, Any] = {"type": "string", "minLength": 1}
    if choices:
        schema["examples"] = choices
    return Param(description_md="The table (`schema.table`).", **schema)


def keys_param(*, when_empty: str) -> Param:
    """Optional primary keys of one table as text (what `dblog dump --keys` takes) or a JSON
    array; `when_empty` says what the dump is without them."""
    return Param(
        None,
        type=["string", "array", "null"],
        items={"type": ["string", "number", "boolean", "array", "object"]},
        description_md=f"Primary keys of the one table chosen. {KEYS_HELP} Empty: {when_empty}.",
    )


def where_param() -> Param:
    """An optional filter: text, so what is typed reaches `check_request` as typed, where the
    source judges it (`ChunkSource.check_filter`)."""
    return Param(
        None,
        type=["string", "null"],
        description_md=(
            "Only the rows matching this condition, written in the source database's SQL on "
            "the table's own columns, e.g. `region = 'eu' AND updated >= '2026-11-23'`. Needs "
            "exactly one table and no keys. A row that matches when its chunk is read is "
            "re-sent; a row that stops matching later is not deleted downstream (its change "
            "travels in the log like any other). Refused before anything runs, naming the "
            "problem: a syntax error, an unknown column, a second statement, a subquery or "
            "another table, a function with side effects (`random()`, `nextval()`, "
            "`pg_sleep()`; `now()` is fine). Empty: no filter."
        ),
    )


def chunk_size_param() -> Param:
    """Optional: empty is the mode's default (`dump.request.DEFAULT_CHUNK_SIZE`)."""
    return Param(
        None,
        type=["integer", "null"],
        exclusiveMinimum=0,
        description_md=(
            "How many rows one chunk reads (with **keys**: how many of the keys, a row each), "
            "a whole number of at least 1. The table is read chunk by chunk without locking "
            "it, and live changes keep flowing between chunks. Larger chunks finish the dump "
            "sooner; in sequenced mode the live changes wait while a chunk's rows are sent, "
            "so very large chunks delay them. Empty: 10,000 sequenced, 100,000 direct."
        ),
    )


def parallelism_param(default: int) -> Param:
    return Param(
        default,
        type="integer",
        exclusiveMinimum=0,
        description_md=(
            "How many chunks are read at once, each from its own range of the table: at least "
            "1. More is faster and puts more load on the source database."
        ),
    )


MODES_SHOWN = {
    "null": "the deployment's default",
    "sequenced": "sequenced: the tailer sends the rows",
    "direct": "direct: the dump writes the rows",
}
"""The mode select's labels (`values_display`): without them the form shows `null`."""


def mode_param() -> Param:
    return Param(
        None,
        type=["string", "null"],
        enum=[None, "sequenced", "direct"],
        values_display=MODES_SHOWN,
        description_md=(
            "How the rows reach the target. **sequenced**: the tailer sends them through the "
            "same ordered output as the live changes; works with every output. **direct**: "
            "the dump writes them into the target table itself, faster for large tables; "
            "needs a target that keeps the newest version of each row by primary key (a lake, "
            "or an SQL-apply output with `monotonic = true`), refused when the output is a "
            "stream. Empty: the deployment's default (sequenced unless a lake is set up)."
        ),
    )


def read_only_param() -> Param:
    """A switch: on, the dump writes nothing to the source (`DBLogDumpOperator.read_only`)."""
    return Param(
        False,
        type="boolean",
        description_md=(
            "Write nothing to the source database: each chunk's watermarks are positions in "
            "its log, which the log tailer marks, instead of rows written into the watermark "
            "table. For a database where the dump may only read. Sequenced only, and not on "
            "MySQL (MariaDB and PostgreSQL can); refused before anything runs where it cannot "
            "hold. A source configured `read_only = true` dumps read-only either way."
        ),
    )
