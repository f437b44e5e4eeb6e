"""The verify operator: compare the target with the source while writes go on, and repair what
differs when asked.

It checks the request first (through the hook: the tables, key range, filter and target as
`dblog verify` checks them), so bad params fail the task at once with nothing stored; then
it starts `dblog verify` detached, in its own session, with the connection's configuration
(`--config` or `--config-json`, no password) and the passwords in its environment, and
waits for it in the triggerer (`DBLogVerifyTrigger`): no worker slot is held while it runs.
Its run id is stable across task retries, so a retry resumes the run. Given the id of a
finished run and `repair="auto"`, it repairs that run: how a DAG repairs after a person
approved. A run cancelled (`dblog verify-cancel`, or the task killed while not deferred) fails
the task without a retry; clearing the task resumes it.

With `spark_conn_id` the run is stored here and runs on Spark instead: `spark_jobs/verify.py`
submitted detached through the Spark connection (`hooks/spark_launcher.verify_command`), its
output in the same log, watched by the same trigger. A repair runs in `dblog verify`: in a
task of its own on the finished run, as the `dblog_verify` DAG repairs.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

from airflow.sdk import BaseOperator, Context, conf
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from airflow_provider_dblog.core.errors import DBLogError
from airflow_provider_dblog.hooks.dblog import DBLogHook
from airflow_provider_dblog.hooks.spark_launcher import verify_command
from airflow_provider_dblog.operators.request import default_dump_id, optional_filter
from airflow_provider_dblog.sources.base import SourceUnavailable
from airflow_provider_dblog.sources.factory import source_for
from airflow_provider_dblog.state import StateStoreUnavailable, VerifyState
from airflow_provider_dblog.triggers.verify import STALLED, DBLogVerifyTrigger, VerifyOutcome
from airflow_provider_dblog.verify.repair import REPAIRS, key_remover_for
from airflow_provider_dblog.verify.request import VerifyRequest, build_verify_request
from airflow_provider_dblog.verify.targets import target_reader_for

CLAIM_TIMEOUT_S = 120.0
"""How long the started process may take to claim its run before the task fails."""
SPARK_CLAIM_TIMEOUT_S = 600.0
"""The same for a Spark application, which claims its run once its driver has started."""


def process_log_path(verify_id: str) -> Path:
    """Where the detached `dblog verify` writes its output."""
    return Path(tempfile.gettempdir()) / f"dblog-verify-{verify_id}.log"


class DBLogVerifyOperator(BaseOperator):
    """Verify the target against the source (`dblog verify`), and repair what differs when
    asked; returns the run's `VerifyOutcome` (counts, the first differing keys, the repair,
    and a Markdown `report`). Fails when the run fails or a repair asked did not finish (a
    retry resumes it); differences alone do not fail it: its XCom says how many.

    :param dblog_conn_id: the `dblog` connection. The `sql_apply` output's `dsn_env` must be
        set in the worker's environment.
    :param table: one table (`schema.table`); None: every captured table.
    :param after: with `table`, verify the keys above this one (`7`, or `["eu", 7]`).
    :param upto: with `table`, verify the keys up to this one.
    :param where: with `table`, only the rows matching this condition (as the dump takes it).
    :param target: what to verify: `output` (the tailer's output) or `lake` (its Delta tables).
    :param chunk_size: rows a chunk reads on each side; None: 50,000.
    :param parallelism: chunks of a table verified at once, each its own key range.
    :param repair: `none`, or `auto`: once the run is done, remove the target's extra keys
        and re-send the other differing ones with a key dump a table.
    :param verify_id: the run's id; default: stable per task instance, so retries resume. The
        id of a finished run with `repair="auto"` repairs that run.
    :param window_timeout_s: how long a chunk waits for the tailer before it is read again.
    :param deferrable: wait in the triggerer.
    :param poll_interval: seconds between polls of the run's status when deferred.
    :param runner_timeout_s: when deferred, how long the run may go without a live process
        before the task fails (a retry resumes it).
    :param spark_conn_id: run the verify on Spark through this Spark connection (master,
        deploy mode, spark-submit binary), each chunk's reads in Spark tasks; None: in
        `dblog verify` on the worker. The Spark workers need the passwords' and the target's
        variables in their environment.
    :param tasks_per_chunk: with `spark_conn_id`, Spark tasks a side of a chunk (default:
        Spark's parallelism).
    :param spark_conf: with `spark_conn_id`, extra Spark properties (never secrets: the UI
        shows them).
    """

    template_fields: Sequence[str] = (
        "dblog_conn_id",
        "table",
        "after",
        "upto",
        "where",
        "chunk_size",
        "target",
        "parallelism",
        "repair",
        "verify_id",
        "spark_conn_id",
    )
    ui_color = "#d8f0d8"

    def __init__(
        self,
        *,
        dblog_conn_id: str = DBLogHook.default_conn_name,
        table: str | None = None,
        after: Any = None,
        upto: Any = None,
        where: str | None = None,
        target: str = "output",
        chunk_size: int | str | None = None,
        parallelism: int | str = 1,
        repair: str = "none",
        verify_id: str | None = None,
        window_timeout_s: float = 60.0,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        poll_interval: float = 5.0,
        runner_timeout_s: float = 180.0,
        spark_conn_id: str | None = None,
        tasks_per_chunk: int | None = None,
        spark_conf: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.dblog_conn_id = dblog_conn_id
        self.table = table
        self.after = after
        self.upto = upto
        self.where = where
        self.target = target
        self.chunk_size = chunk_size
        self.parallelism = parallelism
        self.repair = repair
        self.verify_id = verify_id
        self.window_timeout_s = window_timeout_s
        self.deferrable = deferrable
        self.poll_interval = poll_interval
        self.runner_timeout_s = runner_timeout_s
        self.spark_conn_id = spark_conn_id
        self.tasks_per_chunk = tasks_per_chunk
        self.spark_conf = spark_conf
        self._request: VerifyRequest | None = None
        """A new run's request, once checked."""

    @cached_property
    def hook(self) -> DBLogHook:
        return DBLogHook(self.dblog_conn_id)

    def execute(self, context: Context) -> dict[str, Any]:
        verify_id = self.verify_id = self.verify_id or default_dump_id(context)
        if self.repair not in REPAIRS:
            raise AirflowFailException(
                f"repair must be one of {', '.join(REPAIRS)}, got {self.repair!r}"
            )
        self.hook.export_secrets()
        stored = self.hook.store.verifies.request(verify_id)
        args = self._checked_args(verify_id, stored is not None)
        command = [sys.executable, "-m", "airflow_provider_dblog.cli", "verify", *args]
        claim_timeout_s, what = CLAIM_TIMEOUT_S, "dblog verify"
        if self.spark_conn_id and not self._done(verify_id):
            command = self._spark_command(verify_id)
            claim_timeout_s, what = SPARK_CLAIM_TIMEOUT_S, "the Spark verify application"
        log_path = process_log_path(verify_id)
        self.log.info("verify %s: %s starts, its output in %s", verify_id, what, log_path)
        with log_path.open("ab") as out:
            process = subprocess.Popen(
                command,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        if not self.deferrable:
            process.wait()
            return self._finish(VerifyOutcome.of(self.hook.store, verify_id))
        self._wait_claimed(process, claim_timeout_s)
        if process.poll() is not None:  # it ended already: nothing to wait for
            return self._finish(VerifyOutcome.of(self.hook.store, verify_id))
        self.defer(
            trigger=DBLogVerifyTrigger(
                self.dblog_conn_id,
                verify_id,
                repair=self.repair == "auto",
                poll_interval=self.poll_interval,
                runner_timeout_s=self.runner_timeout_s,
            ),
            method_name="execute_complete",
        )

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        return self._finish(VerifyOutcome.from_event(event))

    def _done(self, verify_id: str) -> bool:
        status = self.hook.store.verifies.status(verify_id)
        return status is not None and status.state is VerifyState.DONE

    def _spark_command(self, verify_id: str) -> list[str]:
        """spark-submit's command running the run on Spark, the run stored first if new."""
        if self.repair == "auto":
            raise AirflowFailException(
                "repair='auto' runs in dblog verify, not on Spark: verify on Spark with "
                "repair='none', then repair the finished run in a task of its own (as the "
                "dblog_verify DAG does)"
            )
        if self._request is not None:
            self.hook.store.verifies.create(verify_id, self._request.to_json())
        assert self.spark_conn_id
        return verify_command(
            self.hook,
            self.spark_conn_id,
            verify_id,
            window_timeout_s=self.window_timeout_s,
            tasks_per_chunk=self.tasks_per_chunk,
            spark_conf=self.spark_conf,
        )

    def _checked_args(self, verify_id: str, stored: bool) -> list[str]:
        """The process's arguments, once the request is checked as `dblog verify` checks it
        (a stored run is resumed as it was asked): bad params fail the task, not retried."""
        settings = self.hook.settings
        if settings.config_path is not None:
            args = ["--config", settings.config_path]
        else:
            args = ["--config-json", _json(settings.config_data)]
        args += ["--verify-id", verify_id, "--repair", self.repair]
        args += ["--window-timeout", str(self.window_timeout_s)]
        if stored:
            if self.repair == "auto":
                self._check(
                    lambda: key_remover_for(self.hook.config, self._stored_target()).close()
                )
            return args
        where = optional_filter(self.where)
        given = {"--table": self.table, "--after": _bound(self.after), "--upto": _bound(self.upto)}
        given["--where"] = where
        given["--target"] = self.target
        given["--chunk-size"] = None if self.chunk_size in (None, "") else str(self.chunk_size)
        given["--parallelism"] = str(self.parallelism)
        for flag, value in given.items():
            if value not in (None, ""):
                args += [flag, str(value)]
        self._check(lambda: self._check_request(verify_id, where))
        return args

    def _check_request(self, verify_id: str, where: str | None) -> None:
        config = self.hook.config
        source = source_for(config.source).chunk_source()
        reader = None
        try:
            reader = target_reader_for(config, self.target)
            self._request = build_verify_request(
                config,
                source,
                verify_id=verify_id,
                table=self.table or None,
                keys=None,
                where=where,
                after=_bound(self.after),
                upto=_bound(self.upto),
                chunk_size=None if self.chunk_size in (None, "") else int(self.chunk_size),
                target=self.target,
                reader=reader,
                parallelism=int(self.parallelism),
            )
            if self.repair == "auto":
                key_remover_for(config, self.target).close()
        finally:
            if reader is not None:
                reader.close()
            source.close()

    def _stored_target(self) -> str:
        stored = self.hook.store.verifies.request(str(self.verify_id)) or {}
        return str(stored.get("target", "output"))

    def _check(self, check: Any) -> None:
        try:
            check()
        except (SourceUnavailable, StateStoreUnavailable) as exc:
            raise AirflowException(f"cannot check the verify request now: {exc}") from None
        except (DBLogError, ValueError) as exc:
            raise AirflowFailException(f"verify request refused: {exc}") from None

    def _wait_claimed(self, process: subprocess.Popen[bytes], timeout_s: float) -> None:
        """Until the started process claims the run (or has ended): the trigger then judges a
        run without a process as finished or dead, never as not started yet."""
        store = self.hook.store
        deadline = time.monotonic() + timeout_s
        while store.verifies.runner(str(self.verify_id)) is None and process.poll() is None:
            if time.monotonic() > deadline:
                raise AirflowException(
                    f"the verify did not start its run in {timeout_s}s: see "
                    f"{process_log_path(str(self.verify_id))}"
                )
            time.sleep(0.2)

    def on_kill(self) -> None:
        """The task killed while it waits for its process (not deferred): cancel the run, so
        the process stops after the chunks in flight."""
        if self.verify_id:
            self.hook.store.verifies.cancel(self.verify_id)

    def _finish(self, outcome: VerifyOutcome) -> dict[str, Any]:
        self.log.info("%s", outcome.report())
        if outcome.outcome == STALLED:
            raise AirflowException(
                f"verify {outcome.verify_id} has had no running process for "
                f"{self.runner_timeout_s}s (see {process_log_path(outcome.verify_id)}); a retry "
                "of this task resumes it"
            )
        if outcome.outcome == "cancelled":
            # Not retried: a retry would resume what someone chose to stop. Clearing the task
            # by hand does resume it.
            raise AirflowFailException(
                f"verify {outcome.verify_id} was cancelled ({outcome.reason or 'by request'}); "
                "clear this task to resume it"
            )
        if outcome.outcome != "done":
            raise AirflowException(
                f"verify {outcome.verify_id} {outcome.outcome}: {outcome.reason} (see "
                f"{process_log_path(outcome.verify_id)}); a retry of this task resumes it"
            )
        if self.repair == "auto" and outcome.differing and not outcome.repaired:
            raise AirflowException(
                f"verify {outcome.verify_id}: its repair did not finish (see "
                f"{process_log_path(outcome.verify_id)}); a retry of this task resumes it"
            )
        return outcome.to_event()


DAG_REPAIRS = ("none", "approve", "auto")
"""What the `dblog_verify` DAG does with differing keys: nothing, repair them once a person
approved (above a threshold), or repair them."""


def next_step(outcome: dict[str, Any], repair: str, approve_above: int) -> str | None:
    """After a verify (its `VerifyOutcome` payload) in the `dblog_verify` DAG: `approve` (ask a
    person first), `repair` (at once), or None (nothing to repair, or no repair asked). With
    `approve`, a repair of at most `approve_above` keys needs no person."""
    if repair not in DAG_REPAIRS:
        raise AirflowFailException(
            f"repair must be one of {', '.join(DAG_REPAIRS)}, got {repair!r}"
        )
    if repair == "none" or not outcome["differing"]:
        return None
    if repair == "approve" and outcome["differing"] > approve_above:
        return "approve"
    return "repair"


def _bound(value: Any) -> str | None:
    """A key range bound as `dblog verify` takes it: `7`, or JSON for a composite key."""
    if value in (None, ""):
        return None
    return _json(value) if isinstance(value, list) else str(value)


def _json(value: Any) -> str:
    return json.dumps(value)
