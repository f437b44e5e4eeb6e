"""Operators: run a dump on Spark (all tables, some tables, or keys of a table), check a dump
request, and act on a running dump (pause, resume, cancel, throttle).

The dump operator registers the request in Redis and submits `spark_jobs/dump.py` through
`SparkDumpLauncher`, with the Spark connection's master, deploy mode and binary. Its dump id
is stable across task retries (dag, run, task, map index), so a retry resumes the same request
from its last completed chunk instead of starting over. Deferrable, it starts the application
detached from the task and hands the wait to `DBLogDumpTrigger`: no worker slot is held while
the dump runs. The task links to the dump's page in the live view, and the dump records the
task as its origin for the live view to link back (`links.py`).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property
from typing import Any

from airflow.sdk import BaseOperator, Context, conf
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from airflow_provider_dblog.assets import DUMPS, announce_dump
from airflow_provider_dblog.core.errors import DBLogError
from airflow_provider_dblog.dump.retry import SOURCE_PATIENCE_S
from airflow_provider_dblog.hooks.dblog import DBLogHook
from airflow_provider_dblog.hooks.spark_launcher import (
    SparkDumpLauncher,
    driver_log_path,
    driver_log_tail,
)
from airflow_provider_dblog.operators.lineage import dump_lineage
from airflow_provider_dblog.operators.links import DBLogLiveViewLink, link_dump_and_task
from airflow_provider_dblog.operators.request import (
    REQUEST_FIELDS,
    DumpRequestOperator,
    default_dump_id,
    non_negative,
    positive_int,
)
from airflow_provider_dblog.state import DumpState
from airflow_provider_dblog.triggers.dblog import DBLogDumpTrigger
from airflow_provider_dblog.triggers.outcome import ENDED, DumpOutcome


class DBLogCheckDumpRequestOperator(DumpRequestOperator):
    """Check a dump request without running it: unknown tables, tables without a primary
    key, malformed keys, key values their column's type refuses and filters the source
    refuses (both judged by the source's database), a source no tailer has set up and sizes
    below 1 fail the task at once (no retry), every problem named in one message; a source
    or Redis that cannot be reached fails it as retryable. Put it first in a DAG so that bad
    params fail the run before anything waits.

    :param dblog_conn_id: the `dblog` connection.
    :param tables: tables ("schema.table"); None or empty: every captured table.
    :param keys: primary keys of the one table given: a list of JSON values (a scalar, a list
        in key order, or an object by column), or text as `dblog dump --keys` takes it.
    :param where: only the rows of the one table given that match this condition, in the
        source's SQL on that table's own columns (`"region = 'eu' AND updated >=
        '2026-11-23'"`); not with `keys`. A row matching it when its chunk is read is
        re-sent; a row that stops matching later is not deleted downstream (its change
        travels in the log). The source refuses, before anything is stored, a syntax error,
        an unknown column, a second statement, a subquery or another table, and a function
        with side effects (docs/operations.md, "Filtered dumps"). None or blank: no filter.
    :param subset_only: refuse a request that gives neither `keys` nor `where`, so that a
        repair never dumps a whole table by mistake.
    :param chunk_size: rows per chunk; None: the mode's default, 10,000 sequenced (the log
        waits behind a chunk's rows at its hw) and 100,000 direct (a Spark job per chunk costs
        a fixed ~135 ms, see bench/README.md).
    :param parallelism: windows in flight at once, on disjoint key ranges.
    :param mode: "sequenced" or "direct" (see `core/direct.py`); None: the deployment's default.
    :param read_only: write nothing to the source: each chunk's watermarks are log positions
        the tailer arms, as for a `[source] read_only` source (whose dumps all are). Refused
        where it cannot hold (MySQL, a direct dump); sequenced when `mode` is None.
    """

    ui_color = "#e8f4ff"

    def execute(self, context: Context) -> dict[str, Any]:
        request, _ = self.checked_request(default_dump_id(context))
        tables = [str(t) for t in request.tables]
        self.log.info(
            "dump request is valid: %s of %s%s%s",
            request.kind.value,
            ", ".join(tables),
            _filtered(request.where),
            _writes(request.read_only),
        )
        return {
            "kind": request.kind.value,
            "tables": tables,
            "keys": len(request.keys),
            "where": request.where,
            "read_only": request.read_only,
        }


class DBLogDumpOperator(DumpRequestOperator):
    """Run a dump as a Spark application and wait for it to end; returns its final status.

    Fails with the dump's reason when it fails (retried: the retry resumes it); a cancelled
    dump fails the task without retry (clearing the task resumes it). `on_kill` cancels the
    dump and stops the Spark application.

    :param dblog_conn_id: the `dblog` connection (Redis state store, source, TOML path).
    :param spark_conn_id: the Spark connection (master, deploy mode, spark-submit binary).
    :param tables: see `DBLogCheckDumpRequestOperator`; likewise `keys`, `where` (a filter:
        only the rows of the one table given that match it, checked by the source before
        anything is stored), `chunk_size`, `parallelism`, `mode`, `read_only` (nothing
        written to the source; the stored request carries it, so a retry resumes it
        read-only) and `subset_only`.
    :param dump_id: the dump's id; default: stable per task instance, so retries resume.
    :param tasks_per_chunk: Spark tasks that read one chunk (default: Spark's parallelism).
    :param window_timeout_s: how long a chunk waits for the tailer before it is retried.
    :param source_patience_s: how long the dump waits for a source (or Redis) that went away
        (a restart, a failover), per outage, before it fails naming what was away.
    :param spark_conf: extra Spark properties (never secrets: the UI shows them).
    :param deferrable: start the application detached and wait in the triggerer.
    :param poll_interval: seconds between polls of the dump's status when deferred.
    :param driver_timeout_s: when deferred, how long the dump may go without a live driver
        before the task fails (a retry then resumes it).

    Its outlet is the `assets.DUMPS` alias: a finished dump adds an event of each dumped
    table's asset (`dblog://<source>/<schema>.<table>`), so DAGs scheduled on the table also
    run after a backfill or repair. Its extra link "DBLog live view" opens the dump in `dblog
    ui` when the connection has a `ui_url`.
    """

    template_fields: Sequence[str] = (*REQUEST_FIELDS, "dump_id", "spark_conf")
    ui_color = "#c7e3ff"
    operator_extra_links = (DBLogLiveViewLink(),)

    def __init__(
        self,
        *,
        spark_conn_id: str = "spark_default",
        dump_id: str | None = None,
        tasks_per_chunk: int | None = None,
        window_timeout_s: float = 60.0,
        source_patience_s: float = SOURCE_PATIENCE_S,
        spark_conf: dict[str, Any] | None = None,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        poll_interval: float = 5.0,
        driver_timeout_s: float = 180.0,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("outlets", [DUMPS])
        super().__init__(**kwargs)
        self.spark_conn_id = spark_conn_id
        self.dump_id = dump_id
        self.tasks_per_chunk = tasks_per_chunk
        self.window_timeout_s = window_timeout_s
        self.source_patience_s = source_patience_s
        self.spark_conf = spark_conf
        self.deferrable = deferrable
        self.poll_interval = poll_interval
        self.driver_timeout_s = driver_timeout_s
        self._launcher: SparkDumpLauncher | None = None

    def execute(self, context: Context) -> dict[str, Any]:
        hook = self.hook
        dump_id = self.dump_id = self.dump_id or default_dump_id(context)
        launcher = self._launcher = SparkDumpLauncher(
            hook,
            self.spark_conn_id,
            dump_id,
            window_timeout_s=self.window_timeout_s,
            source_patience_s=self.source_patience_s,
            tasks_per_chunk=self.tasks_per_chunk,
            spark_conf=self.spark_conf,
        )
        request, key_columns = self.checked_request(dump_id)
        link_dump_and_task(hook, context, dump_id)  # first: a bad ui_url fails before a dump
        status = hook.submit_or_resume(request, key_columns)
        if status.state is DumpState.DONE:
            self.log.info("dump %s is already done", dump_id)
            return self._finish(DumpOutcome.of(dump_id, status), context)
        self.log.info(
            "dump %s: %s of %s%s%s, chunk size %d, parallelism %d, %d chunks done before",
            dump_id,
            request.kind.value,
            ", ".join(str(t) for t in request.tables),
            _filtered(request.where),
            _writes(request.read_only),
            request.chunk_size,
            request.parallelism,
            status.chunks,
        )
        if not self.deferrable:
            try:
                launcher.run()
            except AirflowException as exc:
                self.log.error("the Spark dump application failed: %s", exc)
            return self._finish(DumpOutcome.of(dump_id, hook.dump_status(dump_id), ENDED), context)
        launcher.launch_detached()
        self.defer(
            trigger=DBLogDumpTrigger(
                self.dblog_conn_id,
                dump_id,
                self.poll_interval,
                self.driver_timeout_s,
                cancel_on_kill=True,
            ),
            method_name="execute_complete",
        )

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        outcome = DumpOutcome.from_event(event)
        self.dump_id = outcome.dump_id
        return self._finish(outcome, context)

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """Inputs: the dumped source tables; output: the tailer's output (OpenLineage)."""
        if not self.dump_id:
            return None
        return dump_lineage(self.hook, self.dump_id)

    def _finish(self, outcome: DumpOutcome, context: Context) -> dict[str, Any]:
        dump_id, state, reason = outcome.dump_id, outcome.state, outcome.reason
        if state is not DumpState.DONE and state is not DumpState.CANCELLED:
            self._show_driver_log(dump_id)
        if outcome.stalled:
            raise AirflowException(
                f"dump {dump_id} has had no running Spark driver for {self.driver_timeout_s}s "
                f"(it died, or never started: see its log, {self._spark_log(dump_id)}); a "
                "retry of this task resumes it from its last completed chunk"
            )
        if state is DumpState.DONE:
            summary = {**outcome.to_event(), "spark_log": self._spark_log(dump_id)}
            self.log.info(
                "dump %s done: %d rows in %d chunks, %d windows retried; Spark driver log: %s",
                dump_id,
                outcome.rows,
                outcome.chunks,
                outcome.windows_retried,
                summary["spark_log"],
            )
            announce_dump(context, self.outlets, self.hook, outcome)
            return summary
        if state is DumpState.FAILED:
            raise AirflowException(
                f"dump {dump_id} failed: {reason} (Spark driver log: {self._spark_log(dump_id)})"
            )
        if state is DumpState.CANCELLED:
            # Not retried: a retry would resume what someone chose to stop. Clearing the task
            # by hand does resume it.
            raise AirflowFailException(
                f"dump {dump_id} was cancelled ({reason or 'by request'}); clear this task to "
                "resume it"
            )
        raise AirflowException(
            f"dump {dump_id} ended {state or 'missing'} without finishing ({reason}): the Spark "
            "application stopped early; a retry resumes it"
        )

    def _spark_log(self, dump_id: str) -> str:
        """Where the Spark driver's output went: a file on the worker when detached."""
        return str(driver_log_path(dump_id)) if self.deferrable else "this task's log"

    def _show_driver_log(self, dump_id: str) -> None:
        """A dump that did not finish: the detached driver's last lines in this task's log,
        where a person looks first (attached, its whole output is already there)."""
        if not self.deferrable:
            return
        tail = driver_log_tail(dump_id)
        if tail is None:
            self.log.warning(
                "the Spark driver's log is not on this worker: it is %s on the worker that "
                "started the dump (named in the log of the try that submitted it)",
                driver_log_path(dump_id),
            )
        else:
            self.log.error(
                "the last lines of the Spark driver's log, %s:\n%s", driver_log_path(dump_id), tail
            )

    def on_kill(self) -> None:
        if self._launcher is not None:
            self._launcher.kill()


def _filtered(where: str | None) -> str:
    """A request's filter as its log lines show it after the tables."""
    return "" if where is None else f" where {where}"


def _writes(read_only: bool) -> str:
    """A read-only request as its log lines show it."""
    return ", read-only (nothing written to the source)" if read_only else ""


class _DumpControlOperator(BaseOperator):
    template_fields: Sequence[str] = ("dump_id",)
    ui_color = "#fff3c7"
    action = ""

    def __init__(
        self, *, dump_id: str, dblog_conn_id: str = DBLogHook.default_conn_name, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.dump_id = dump_id
        self.dblog_conn_id = dblog_conn_id

    @cached_property
    def hook(self) -> DBLogHook:
        return DBLogHook(self.dblog_conn_id)

    def execute(self, context: Context) -> None:
        store = self.hook.store
        try:
            changed = self._apply(store)
        except DBLogError as exc:
            raise AirflowFailException(f"cannot {self.action} dump {self.dump_id}: {exc}") from None
        if not changed:
            raise AirflowFailException(
                f"dump {self.dump_id} has finished: nothing to {self.action}"
            )
        self.log.info(
            "dump %s: %s requested; it applies it between chunks", self.dump_id, self.action
        )

    def _apply(self, store: Any) -> bool:
        raise NotImplementedError


class DBLogPauseDumpOperator(_DumpControlOperator):
    """Pause a running dump after its current chunk."""

    action = "pause"

    def _apply(self, store: Any) -> bool:
        return bool(store.dumps.pause(self.dump_id))


class DBLogResumeDumpOperator(_DumpControlOperator):
    """Resume a paused dump."""

    action = "resume"

    def _apply(self, store: Any) -> bool:
        return bool(store.dumps.resume(self.dump_id))


class DBLogCancelDumpOperator(_DumpControlOperator):
    """Cancel a dump after its current chunk; its task (if any) fails as cancelled."""

    action = "cancel"

    def _apply(self, store: Any) -> bool:
        return bool(store.dumps.cancel(self.dump_id))


class DBLogThrottleDumpOperator(_DumpControlOperator):
    """Change a running dump's pace from its next chunk: chunk size, delay between chunks,
    maximum rows per second (0 lifts the limit). Unset values stay as they are."""

    action = "throttle"
    template_fields: Sequence[str] = ("dump_id", "chunk_size", "delay_ms", "max_rows_per_s")

    def __init__(
        self,
        *,
        chunk_size: int | None = None,
        delay_ms: int | None = None,
        max_rows_per_s: float | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.chunk_size = chunk_size
        self.delay_ms = delay_ms
        self.max_rows_per_s = max_rows_per_s

    def _apply(self, store: Any) -> bool:
        """Each setting checked before any is sent: a bad one fails the task, naming it, and
        the dump keeps its pace."""
        chunk_size, delay_ms, rate = self.chunk_size, self.delay_ms, self.max_rows_per_s
        return bool(
            store.dumps.throttle(
                self.dump_id,
                chunk_size=None if chunk_size is None else positive_int("chunk_size", chunk_size),
                delay_ms=None
                if delay_ms is None
                else non_negative("delay_ms", delay_ms, whole=True),
                max_rows_per_s=None
                if rate is None
                else non_negative("max_rows_per_s", rate, whole=False),
            )
        )
