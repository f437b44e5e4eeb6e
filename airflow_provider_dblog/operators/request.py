"""A dump request as the dump operators take it: its params (`DumpRequestOperator`, the base
of `DBLogCheckDumpRequestOperator` and `DBLogDumpOperator`, which check and run the same
request), params and templates checked, the id of a task instance's dump, and the request
built through the hook with its failures sorted into "fix the params" (no retry) and "try
again later" (retryable).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from functools import cached_property
from typing import Any, TypeVar

from airflow.sdk import BaseOperator, Context
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from airflow_provider_dblog.core.dump_plan import DumpRequest
from airflow_provider_dblog.core.errors import DBLogError
from airflow_provider_dblog.core.event import TableRef
from airflow_provider_dblog.hooks.dblog import DBLogHook
from airflow_provider_dblog.sources.base import SourceUnavailable
from airflow_provider_dblog.state import StateStoreUnavailable

REQUEST_FIELDS = (
    "dblog_conn_id",
    "tables",
    "keys",
    "where",
    "chunk_size",
    "parallelism",
    "mode",
    "read_only",
)
"""The templated fields of an operator that takes a dump request."""

T = TypeVar("T")


class DumpRequestOperator(BaseOperator):
    """An operator that takes a dump request: its params, templated (`REQUEST_FIELDS`), and
    the request they describe, checked (`checked_request`). The params are documented on
    `DBLogCheckDumpRequestOperator`."""

    template_fields: Sequence[str] = REQUEST_FIELDS

    def __init__(
        self,
        *,
        dblog_conn_id: str = DBLogHook.default_conn_name,
        tables: list[str] | str | None = None,
        keys: list[Any] | str | None = None,
        where: str | None = None,
        chunk_size: int | str | None = None,
        parallelism: int | str = 1,
        mode: str | None = None,
        read_only: bool | str = False,
        subset_only: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.dblog_conn_id = dblog_conn_id
        self.tables = tables
        self.keys = keys
        self.where = where
        self.chunk_size = chunk_size
        self.parallelism = parallelism
        self.mode = mode
        self.read_only = read_only
        self.subset_only = subset_only

    @cached_property
    def hook(self) -> DBLogHook:
        return DBLogHook(self.dblog_conn_id)

    def checked_request(self, dump_id: str) -> tuple[DumpRequest, dict[TableRef, tuple[str, ...]]]:
        """The request the (rendered) params describe, checked: see `checked_request`."""
        return checked_request(
            self.hook,
            dump_id,
            tables=self.tables,
            keys=self.keys,
            chunk_size=self.chunk_size,
            parallelism=self.parallelism,
            mode=self.mode,
            where=self.where,
            read_only=self.read_only,
            subset_only=self.subset_only,
        )


def default_dump_id(context: Context) -> str:
    """The same id for every try of one task instance: a retry resumes, it does not restart."""
    ti = context["ti"]
    return dump_id_for(ti.dag_id, ti.run_id, ti.task_id, getattr(ti, "map_index", -1))


def dump_id_for(dag_id: str, run_id: str, task_id: str, map_index: int = -1) -> str:
    """The dump id of a task instance: its ids joined, anything unusual as `_`."""
    parts = [dag_id, run_id, task_id] + ([str(map_index)] if map_index >= 0 else [])
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", ".".join(parts))


def positive_int(name: str, value: Any) -> int:
    """A count from a param or a template ("1000" as well as 1000), refused clearly."""
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise AirflowFailException(f"{name} must be a whole number, got {value!r}") from None
    if number < 1 or str(number) != str(value).strip():
        raise AirflowFailException(f"{name} must be a whole number of at least 1, got {value!r}")
    return number


def non_negative(name: str, value: Any, *, whole: bool) -> int | float:
    """A delay or a rate from a param or a template: 0 or more, finite, a whole number if
    `whole`; refused clearly."""
    kind = "a whole number" if whole else "a number"
    try:
        if isinstance(value, bool):
            raise ValueError(value)
        number: int | float = int(str(value).strip()) if whole else float(value)
    except (TypeError, ValueError):
        raise AirflowFailException(f"{name} must be {kind} of at least 0, got {value!r}") from None
    if not math.isfinite(number) or number < 0:
        raise AirflowFailException(f"{name} must be {kind} of at least 0, got {value!r}")
    return number


def optional_list(name: str, value: Any) -> list[Any] | None:
    """None, or a non-empty list (an empty list or "" from a form means: not given)."""
    if value in (None, "", []):
        return None
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list | tuple):
        raise AirflowFailException(f"{name} must be a list, got {value!r}")
    return list(value)


def optional_filter(value: Any) -> str | None:
    """None, or a filter's text (blank text from a form means: no filter)."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise AirflowFailException(
            f"where must be a condition in the source's SQL, as text; got {value!r}"
        )
    return value if value.strip() else None


def flag(name: str, value: Any) -> bool:
    """A switch from a param or a template: a bool, or its text ("true", "False"); None (an
    optional param left empty) is off."""
    if value is None:
        return False
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise AirflowFailException(f"{name} must be true or false, got {value!r}")


def checked_request(
    hook: DBLogHook,
    dump_id: str,
    *,
    tables: Any,
    keys: Any,
    chunk_size: Any,
    parallelism: Any,
    mode: Any = None,
    where: Any = None,
    read_only: Any = False,
    subset_only: bool = False,
) -> tuple[DumpRequest, dict[TableRef, tuple[str, ...]]]:
    """The request the params describe, validated against the source (its tables' primary
    keys, the key values, the filter; that it can be dumped `read_only`, if asked) and the key
    columns of its tables. `subset_only` refuses a request that names neither keys nor a
    filter (a repair never dumps a whole table by mistake). A bad request fails without
    retry (`AirflowFailException`), naming every problem found in one message (the params'
    and the source's: a person fixes them in one go); a source or Redis out of reach fails
    as retryable (`AirflowException`)."""
    problems: list[str] = []

    def given(check: Callable[[], T]) -> T | None:
        """`check`'s value, or None with its refusal kept for the one message."""
        try:
            return check()
        except AirflowFailException as exc:
            problems.append(str(exc))
            return None

    tables_given = given(lambda: optional_list("tables", tables))
    keys_given: str | list[Any] | None = given(lambda: optional_list("keys", keys))
    if isinstance(keys, str) and keys.strip():
        keys_given = keys  # text, as `dblog dump --keys` takes it
    where_given = given(lambda: optional_filter(where))
    no_where = where is None or (isinstance(where, str) and not where.strip())
    if subset_only and keys in (None, "", []) and no_where:
        problems.append(
            "give keys or a filter (where): this task re-sends chosen rows of one table, never "
            "the whole table"
        )
    size = (
        None if chunk_size in (None, "") else given(lambda: positive_int("chunk_size", chunk_size))
    )
    count = given(lambda: positive_int("parallelism", parallelism))
    writes_nothing = given(lambda: flag("read_only", read_only))
    try:
        request = hook.build_request(
            dump_id,
            tables=tables_given,
            keys=keys_given,
            chunk_size=size,
            parallelism=count or 1,
            mode=None if mode in (None, "") else str(mode),
            where=where_given,
            read_only=bool(writes_nothing),
        )
    except (SourceUnavailable, StateStoreUnavailable) as exc:
        raise AirflowException(f"cannot check the dump request now: {exc}") from None
    except DBLogError as exc:  # the request, the config or the connection is wrong
        problems.append(str(exc))
    if problems:
        raise AirflowFailException(f"bad dump request: {'; '.join(problems)}")
    return request
