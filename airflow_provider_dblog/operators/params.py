"""The params of the DBLog DAGs, as Airflow's trigger form renders them, and how their values
reach the operators.

How the form reads a param's JSON schema (Airflow 3.3, `FlexibleForm/FieldSelector.tsx`):
a `type` that includes "null" is optional (no red asterisk, an empty field sends null; a
switch of type boolean-or-null still sends true or false); an array with `examples` is a
multi-select of those values; a type list of more than one non-null type is a text box whose
text is kept as JSON when it parses to one of the types, as the raw text otherwise; a number
field clamps what is typed to the schema's top-level `minimum` and `maximum` when it loses
focus, silently, and reads no other keyword. The api-server validates the conf against each
param's schema before it creates the run and refuses the trigger, naming the first param
refused, with jsonschema's message, which prints the (sub)schema that failed. So a bound sits
in an `allOf` (no silent clamp; the message shows `{'minimum': 1}`, not the whole schema),
and the help of a count is its plain `description`, kept outside the schema. The key list's
schema refuses what fits no table's key (a key of no value, keys unlike the first); what a
schema cannot judge (a key list against the table's key, a filter, table names)
`check_request`, the run's first task, refuses at once with every problem in one message.
The text of `keys` and `where` reaches the request unchanged. The help of the other params is
each schema's `description_md`, which the form renders as Markdown; an enum's labels are its
`values_display`.

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


MOST_KEY_COLUMNS = 32
"""The most columns a primary key has: PostgreSQL's limit on an index (MySQL's is 16)."""

_KEY_VALUE = {"type": ["string", "number", "boolean"], "minLength": 1}


def _like_the_first(shape: dict[str, Any], description: str) -> dict[str, Any]:
    """Every key of the list has `shape` when the first one has it."""
    return {
        "if": {"prefixItems": [shape]},
        "then": {"items": {**shape, "description": description}},
    }


def keys_param(*, when_empty: str) -> Param:
    """Optional primary keys of one table as text (what `dblog dump --keys` takes) or a JSON
    array; `when_empty` says what the dump is without them. An array fits no table's key when
    a key has no value or is unlike the first key (one value, an object, a list of another
    length): refused at trigger, before the run, naming the key."""
    return Param(
        None,
        type=["string", "array", "null"],
        items={  # a value, a list of values or an object of values: each keyword its type's
            "type": ["string", "number", "boolean", "array", "object"],
            "minLength": 1,
            "minItems": 1,
            "items": _KEY_VALUE,
            "minProperties": 1,
            "additionalProperties": _KEY_VALUE,
        },
        allOf=[
            _like_the_first(
                {"type": ["string", "number", "boolean"]}, "every key is one value, as the first"
            ),
            _like_the_first({"type": "object"}, "every key names its columns, as the first"),
            *(
                _like_the_first(
                    {"type": "array", "minItems": n, "maxItems": n},
                    "every key has as many values as the first: one per primary-key column",
                )
                for n in range(1, MOST_KEY_COLUMNS + 1)
            ),
        ],
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


CHUNK_SIZE_HELP = (
    "How many rows one chunk reads (with keys: how many of the keys, a row each), a whole "
    "number of at least 1. The table is read chunk by chunk without locking it, and live "
    "changes keep flowing between chunks. Larger chunks finish the dump sooner; in sequenced "
    "mode the live changes wait while a chunk's rows are sent, so very large chunks delay "
    "them. Empty: 10,000 sequenced, 100,000 direct."
)
"""The chunk size's help in a form that offers the mode."""

REPAIR_CHUNK_SIZE_HELP = (
    "How many of the keys one chunk reads (a row each), or with a filter how many rows of the "
    "table (those matching it are sent): a whole number of at least 1. Live changes keep "
    "flowing between chunks; very large chunks can delay them. Empty: 10,000 (100,000 in a "
    "deployment with a lake)."
)
"""The repair's: its form offers no mode, and a repair reads keys or a filter's rows."""


def chunk_size_param(help_text: str = CHUNK_SIZE_HELP) -> Param:
    """Optional: empty is the mode's default (`dump.request.DEFAULT_CHUNK_SIZE`). The bound
    in an `allOf` and the help outside the schema keep a refusal short (module docs)."""
    return Param(None, description=help_text, type=["integer", "null"], allOf=[{"minimum": 1}])


def parallelism_param(default: int) -> Param:
    return Param(
        default,
        description=(
            "How many chunks are read at once, each from its own range of the table: at least "
            "1. More is faster and puts more load on the source database."
        ),
        type="integer",
        allOf=[{"minimum": 1}],
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
    """A switch: on, the dump writes nothing to the source (`DBLogDumpOperator.read_only`).
    Optional (null: off), so the form marks it with no "required" asterisk."""
    return Param(
        False,
        type=["boolean", "null"],
        description_md=(
            "Write nothing to the source database: each chunk's watermarks are positions in "
            "its log, which the log tailer marks, instead of rows written into the watermark "
            "table. For a database where the dump may only read. Sequenced only, and not on "
            "MySQL (MariaDB and PostgreSQL can); refused before anything runs where it cannot "
            "hold. A source configured `read_only = true` dumps read-only either way."
        ),
    )
