"""A sensor: a verify run (and its repair, when asked) has finished, for a DAG that waits on a
run started elsewhere (`dblog verify` from cron, another DAG). Pokes, or defers to
`DBLogVerifyTrigger` (`deferrable=True`, for long waits)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from functools import cached_property
from typing import Any

from airflow.sdk import BaseSensorOperator, Context, conf
from airflow.sdk.exceptions import AirflowException

from airflow_provider_dblog.hooks.dblog import DBLogHook
from airflow_provider_dblog.triggers.verify import (
    STALLED,
    DBLogVerifyTrigger,
    VerifyOutcome,
    finished,
)


class DBLogVerifySensor(BaseSensorOperator):
    """Waits until a verify run is done (with `repair`, its repair too); returns its
    `VerifyOutcome`. Fails if the run failed or was cancelled, its repair did not finish, it
    is unknown, or (deferred) no process ran it for `runner_timeout_s`.

    :param verify_id: the run to wait for.
    :param dblog_conn_id: the `dblog` connection.
    :param repair: wait for the run's repair as well.
    :param deferrable: wait in the triggerer.
    :param runner_timeout_s: when deferred, fail if no process has run it for this long.
    """

    template_fields: Sequence[str] = ("verify_id", "dblog_conn_id")

    def __init__(
        self,
        *,
        verify_id: str,
        dblog_conn_id: str = DBLogHook.default_conn_name,
        repair: bool = False,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        runner_timeout_s: float = 24 * 3600.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.verify_id = verify_id
        self.dblog_conn_id = dblog_conn_id
        self.repair = repair
        self.deferrable = deferrable
        self.runner_timeout_s = runner_timeout_s

    @cached_property
    def hook(self) -> DBLogHook:
        return DBLogHook(self.dblog_conn_id)

    def execute(self, context: Context) -> Any:
        if not self.deferrable:
            super().execute(context)
            return VerifyOutcome.of(self.hook.store, self.verify_id).to_event()
        self.defer(
            trigger=DBLogVerifyTrigger(
                self.dblog_conn_id,
                self.verify_id,
                repair=self.repair,
                poll_interval=self.poke_interval,
                runner_timeout_s=self.runner_timeout_s,
            ),
            method_name="execute_complete",
            timeout=timedelta(seconds=self.timeout),
        )

    def poke(self, context: Context) -> bool:
        store = self.hook.store
        if not finished(store, self.verify_id, self.repair):
            if store.verifies.status(self.verify_id) is None:
                raise AirflowException(f"there is no verify run {self.verify_id}")
            return False
        self._check(VerifyOutcome.of(store, self.verify_id))
        return True

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        outcome = VerifyOutcome.from_event(event)
        self._check(outcome)
        return outcome.to_event()

    def _check(self, outcome: VerifyOutcome) -> None:
        if outcome.outcome == STALLED:
            raise AirflowException(
                f"verify {self.verify_id} has had no running process for {self.runner_timeout_s}s"
            )
        if outcome.outcome == "cancelled":
            raise AirflowException(f"verify {self.verify_id} was cancelled")
        if outcome.outcome != "done":
            raise AirflowException(f"verify {self.verify_id} {outcome.outcome}: {outcome.reason}")
        if self.repair and outcome.differing and not outcome.repaired:
            raise AirflowException(f"verify {self.verify_id}: its repair did not finish")
